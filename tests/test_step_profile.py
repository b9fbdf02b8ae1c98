"""`migrate train --profile` and the golden script's --profile: the step-time breakdown.

Off, a run logs exactly the fields and numbers it logged before; on, every phase field
is there, positive, and the fields of a step sum to no more than its wall time. The
check that says so is shown to fail on broken records.
"""
from __future__ import annotations

import importlib.util
import sys

import numpy as np
import pytest

from migrate.train.run import run_training
from migrate.train.step.profile import breakdown_problems, field_name, format_breakdown
from migrate.train.trainer import train
from train_setup import REPO, load_cfg, load_golden, make_run_dir, metrics

# slow as a whole: its module fixtures build profiled training runs
pytestmark = [pytest.mark.usefixtures("one_torch_thread"), pytest.mark.slow]
STEPS = 5
NUMBERS = ("step", "loss", "lr", "grad_norm", "grad_norm_clipped", "tokens")


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = make_run_dir(tmp_path_factory.mktemp("profile"))
    text = (root / "run.yaml").read_text().replace("total_steps: 200", f"total_steps: {STEPS}")
    (root / "run.yaml").write_text(text.replace("warmup_steps: 20", "warmup_steps: 2"))
    return root


def _timeless(records):
    return [{k: r[k] for k in NUMBERS} for r in records]


@pytest.fixture(scope="module")
def ms_off(root):
    return metrics(train(load_cfg(root), out_dir=root / "ms_off", progress=False))


def test_ms_profile_off_changes_nothing_and_on_adds_sound_fields(root, ms_off, capfd):
    off = ms_off
    assert all(not k.startswith("time_") for r in off for k in r)
    assert set(off[0]) == {*NUMBERS, "time", "tokens_per_s", "mfu"}
    on = metrics(run_training(root / "run.yaml", out=root / "ms_on", echo=lambda line: None, profile=True))
    assert _timeless(on) == _timeless(off)  # the syncs measure; they change no number
    assert breakdown_problems(on) == []
    assert all(field_name("reduce") not in r for r in on)  # one process: no dp reduction to time
    table = capfd.readouterr().err
    assert "MindSpore trainer step time" in table and "forward + backward" in table and "optimizer (AdamW)" in table


def test_golden_profile_off_changes_nothing_and_on_adds_sound_fields(root):
    golden = load_golden()
    cfg = load_cfg(root)
    lines = []
    off = metrics(golden.train(cfg, root / "g_off", log=lambda *_: None))
    on = metrics(golden.train(cfg, root / "g_on", log=lines.append, profile=True))
    assert all(not k.startswith("time_") for r in off for k in r)
    assert _timeless(on) == _timeless(off)
    assert breakdown_problems(on) == []
    assert "golden PyTorch step time" in lines[-1] and "host overhead" in lines[-1]


def test_the_floor_cell_does_the_trainers_work(root, ms_off):
    """bench/ms_floor.py's one-graph step trains the same curve: its time is a floor of the same work."""
    spec = importlib.util.spec_from_file_location("bench_ms_floor", REPO / "bench" / "ms_floor.py")
    floor = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = floor  # MindSpore's graph parser looks the cell's module up by name
    spec.loader.exec_module(floor)
    seconds, losses = floor.floor_step_times(load_cfg(root), STEPS)
    assert len(seconds) == STEPS  # one time per step; what they are is bench/train_speed.py's business
    np.testing.assert_allclose(losses, [r["loss"] for r in ms_off], rtol=1e-6)


def _records():
    return [{"step": s, "time": 0.5 * s, "time_data_s": 0.01, "time_fwd_bwd_s": 0.3, "time_clip_s": 0.02,
             "time_optimizer_s": 0.1, "time_host_s": 0.07} for s in (1, 2, 3)]


def test_the_breakdown_check_fails_on_broken_records():
    assert breakdown_problems(_records()) == []
    double = _records()
    double[1]["time_fwd_bwd_s"] *= 2  # a phase counted twice: past the wall time
    assert breakdown_problems(double) == ["step 2: the phases sum to 0.800000 s, past its wall time 0.500000 s"]
    # `time` is logged to 4 decimals: a sum past it by less than that rounding is sound, more is not
    rounded = _records()
    rounded[0]["time_host_s"] += 0.00009
    assert breakdown_problems(rounded) == []
    rounded[0]["time_host_s"] += 0.0001
    assert breakdown_problems(rounded) == ["step 1: the phases sum to 0.500190 s, past its wall time 0.500000 s"]
    missing = _records()
    del missing[2]["time_optimizer_s"]
    assert breakdown_problems(missing) == ["step 3: no time_optimizer_s"]
    zero = _records()
    zero[0]["time_clip_s"] = 0.0
    assert breakdown_problems(zero) == ["step 1: time_clip_s not positive"]
    text = format_breakdown(_records())
    assert "forward + backward (+ accumulation)     " in text and "60.0%" in text  # 0.3 of 0.5 s
