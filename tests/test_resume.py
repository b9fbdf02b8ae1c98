"""Checkpoints and exact resume: a run SIGKILLed after a checkpoint and resumed
logs the same metrics, bit for bit, as the run that was never interrupted."""
import json
import os
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from migrate.errors import MigrateError
from migrate.export import export
from migrate.models.loading import load_model
from migrate.train.checkpoint.folder import LATEST, open_checkpoint
from migrate.train.trainer import train
from train_setup import REPO, RUN, load_cfg, make_run_dir, metrics

# slow as a whole: its module fixtures build killed and resumed runs
pytestmark = pytest.mark.slow

RESUME_RUN = (RUN.replace("total_steps: 200", "total_steps: 24")
              .replace("warmup_steps: 20", "warmup_steps: 12")  # checkpoints 4 and 8 fall in the warmup
              + "checkpoint_interval: 4\nkeep_checkpoints: 2\n")
SAME = ("step", "loss", "lr", "grad_norm", "tokens")
# The child slows itself down (a sleep per step in its log callback) so the kill lands between checkpoints.
CHILD = """
import sys, time
from migrate.train.config import RunConfig
from migrate.train.trainer import train
train(RunConfig.load(sys.argv[1]), sys.argv[2], progress=False, peak_flops=1e12, log=lambda line: time.sleep(0.3))
"""


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return make_run_dir(tmp_path_factory.mktemp("resume"), run_yaml=RESUME_RUN)


@pytest.fixture(scope="module")
def cfg(run_dir):
    return load_cfg(run_dir)


@pytest.fixture(scope="module")
def uninterrupted(cfg, run_dir):
    out = train(cfg, run_dir / "whole", progress=False, peak_flops=1e12)
    return out, metrics(out)


def _lines(path):
    try:
        return sum(1 for line in path.read_text().splitlines() if line.strip())
    except FileNotFoundError:
        return 0


def test_sigkilled_run_resumes_bit_for_bit(uninterrupted, cfg, run_dir):
    _, whole = uninterrupted
    out = run_dir / "killed"
    kill_after = random.randint(5, 10)  # a random step past the first checkpoint (step 4)
    env = {**os.environ, "PYTHONPATH": str(REPO), "GLOG_v": "3"}
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(run_dir / "run.yaml"), str(out)], cwd=REPO, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 600
    try:
        while _lines(out / "metrics.jsonl") < kill_after or not (out / "checkpoints" / LATEST).exists():
            if child.poll() is not None:
                pytest.fail(f"the child ended before the kill: {child.stderr.read().decode()[-2000:]}")
            assert time.monotonic() < deadline, "the child made no progress"
            time.sleep(0.02)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
        child.stderr.close()
    assert child.returncode == -signal.SIGKILL
    logged = _lines(out / "metrics.jsonl")
    resumed_from = open_checkpoint(out)
    print(f"\n[resume] killed after step {logged} (aimed at {kill_after}); resuming from "
          f"{resumed_from.path.name} (warmup ends at step {cfg.schedule.warmup_steps})")
    assert resumed_from.step in (4, 8) and resumed_from.step <= logged  # a warmup checkpoint
    assert resumed_from.state["scheduler_step"] == resumed_from.step
    assert resumed_from.state["data_position"]["next_step"] == resumed_from.step

    train(cfg, out, resume=out, progress=False, peak_flops=1e12)
    again = metrics(out)
    assert [[r[k] for k in SAME] for r in again] == [[r[k] for k in SAME] for r in whole]
    assert all(b["time"] >= a["time"] for a, b in zip(again, again[1:], strict=False))
    assert not [p.name for p in (out / "checkpoints").iterdir() if p.name.endswith(".partial")]


def test_checkpoint_layout_retention_and_export(uninterrupted, tmp_path):
    out, whole = uninterrupted
    folder = out / "checkpoints"
    assert sorted(p.name for p in folder.iterdir()) == ["checkpoint-20", "checkpoint-24", LATEST]
    assert os.readlink(folder / LATEST) == "checkpoint-24"
    last = folder / "checkpoint-24"
    assert {"model.ckpt", "model.yaml", "optimizer.ckpt", "trainer_state.json", "rng_state.json",
            "metrics.jsonl"} <= {p.name for p in last.iterdir()}
    state = json.loads((last / "trainer_state.json").read_text())
    assert state["step"] == state["scheduler_step"] == state["optimizer_step"] == 24
    assert state["tokens"] == whole[-1]["tokens"] and state["loss_scale"] is None
    assert metrics(last) == whole
    # The parameter file is a converted-model folder: load_model and `migrate export` read it.
    model, config = load_model(last)
    assert config.compute_dtype == "float32"
    hf = export(last, tmp_path / "hf").out_dir
    from safetensors.numpy import load_file

    exported = load_file(hf / "model.safetensors")
    np.testing.assert_array_equal(exported["model.norm.weight"], model.model.norm_out.weight.asnumpy())


def test_resume_refuses_another_config(uninterrupted, cfg, run_dir):
    out, _ = uninterrupted
    changed = cfg.replace(seed=cfg.seed + 1)
    with pytest.raises(MigrateError, match="seed"):
        train(changed, run_dir / "other", resume=out / "checkpoints" / "checkpoint-20", progress=False)
    with pytest.raises(MigrateError, match="faults"):
        train(cfg, run_dir / "other", resume=out, progress=False, faults=["clip_no_eps"])
