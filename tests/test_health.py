"""The training health watch on both sides: faults injected into the golden and the MindSpore
run alike are caught at the same step, with the batch that caused them, and the policy acts
identically; TensorBoard event files read back equal metrics.jsonl.

Scenarios on the tiny Llama of train_setup (each trains both sides a few dozen steps):
  spike   a micro-batch of repeated <pad> (never in the corpus) at step 40, policy warn
  nan     a NaN gradient at step 8, policy skip; `migrate compare` passes the pair
  nan_w   a NaN gradient at step 2, policy warn: NaN weights on both sides, compare passes
  lr      the lr x100 at step 3 of a 4-step warmup, policy stop (exit code 3)
  fp16    overflowing gradients at steps 3-8 from a scale of 16: a run of skips, then collapse
"""
import json
import shutil

import numpy as np
import pytest

from migrate.cli import main as cli_main
from migrate.compare import compare_runs
from migrate.data.samples import load_samples, run_order
from migrate.data.tokenize import write_mindrecord
from migrate.errors import MigrateError
from migrate.train.config import HealthConfig, LossScaleConfig, RunConfig, ScheduleConfig
from migrate.train.health.log import HealthStop
from migrate.train.health.watch import HealthWatch, StepFacts
from migrate.train.trainer import train
from train_setup import load_cfg, load_golden, make_run_dir, metrics

golden = load_golden()
# slow as a whole: its module fixtures build trained runs with faults on both sides
pytestmark = [pytest.mark.usefixtures("one_torch_thread"), pytest.mark.slow]
SHORT = ScheduleConfig(name="cosine", warmup_steps=4, min_lr_rate=0.1)
PAD = 2  # the tokenizer's <pad>: never in the corpus, as uncleaned special tokens would be
SPIKE_STEP, SPIKE_MICRO = 40, 1


def both(cfg, root, name, **kw):
    """Train both sides; returns {side: (metrics, health entries, error or None)}."""
    out = {}
    for side, run in (("golden", lambda o: golden.train(cfg, o, log=lambda line: None, **kw)),
                      ("ms", lambda o: train(cfg, o, progress=False, peak_flops=1e12, log=lambda line: None, **kw))):
        folder, error = root / f"{name}_{side}", None
        try:
            run(folder)
        except HealthStop as exc:
            error = exc
        out[side] = (metrics(folder), health(folder), error)
    return out


def health(folder) -> list[dict]:
    path = folder / "health.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def events(entries) -> list[tuple[int, str, str]]:
    return [(e["step"], e["kind"], e["action"]) for e in entries if e["kind"] != "verdict"]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return make_run_dir(tmp_path_factory.mktemp("health"))


@pytest.fixture(scope="module")
def spike(root):
    """Rows of step 40's micro-batch 1 replaced by <pad> repeated, in train.npy and the MindRecord alike."""
    data = root / "data_spike"
    shutil.copytree(root / "data", data)
    cfg = load_cfg(root, total_steps=SPIKE_STEP + 2, data=data, schedule=SHORT)
    rows = np.array(load_samples(data, cfg.seq_length))
    culprit = run_order(cfg, len(rows))[SPIKE_STEP - 1, SPIKE_MICRO]
    rows[culprit] = PAD
    np.save(data / "train.npy", rows)
    for name in ("train.mindrecord", "train.mindrecord.db"):
        (data / name).unlink()
    write_mindrecord(data / "train.mindrecord", rows)
    return cfg, culprit, both(cfg, root, "spike")


def test_a_special_token_batch_spikes_the_loss_and_is_saved_on_both_sides(spike, root):
    cfg, culprit, runs = spike
    for side, (m, entries, error) in runs.items():
        assert error is None and len(m) == cfg.total_steps  # warn: the run goes on
        assert events(entries) == [(SPIKE_STEP, "loss_spike", "continue")], side
        entry = entries[0]
        assert entry["micro"] == SPIKE_MICRO and entry["samples"] == culprit.tolist()
        batch = json.loads((root / f"spike_{side}" / entry["batch"]).read_text())
        saved = batch["micro_batches"][SPIKE_MICRO]
        assert batch["culprit_micro"] == SPIKE_MICRO and saved["samples"] == culprit.tolist()
        assert np.all(np.array(saved["token_ids"]) == PAD) and saved["text"][0].startswith("<pad><pad>")
        assert not np.any(np.array(batch["micro_batches"][0]["token_ids"]) == PAD)  # the clean micro-batch
        assert [r.get("health") for r in m].count(["loss_spike"]) == 1
        verdict = entries[-1]
        assert verdict["kind"] == "verdict" and verdict["step"] == cfg.total_steps and not verdict["healthy"]
        assert verdict["line"].endswith("loss_spike from step 40 (1x)")
    # The same step, the same figures: both sides decided on their own numbers.
    g, m = runs["golden"][1][0], runs["ms"][1][0]
    assert g["value"] == pytest.approx(m["value"], rel=1e-5) and g["limit"] == pytest.approx(m["limit"], rel=1e-5)


def test_the_watch_fails_the_spike_only_where_it_is(spike):
    # Broken case for the rule: the same statistics without the spike, or a watch too lax, say healthy.
    cfg, _, runs = spike
    m = runs["ms"][0]
    lax = HealthWatch.for_run(cfg.replace(health=HealthConfig(loss_spike_min_rel=0.5)))
    strict = HealthWatch.for_run(cfg)
    for rec in m:
        facts = StepFacts(rec["step"], rec["loss"], rec["grad_norm"], rec["lr"])
        assert not lax.check(facts).events
        assert bool(strict.check(facts).events) == (rec["step"] == SPIKE_STEP)


def test_tensorboard_events_equal_metrics_on_both_sides(spike, root):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _, _, runs = spike
    for side in ("golden", "ms"):
        acc = EventAccumulator(str(root / f"spike_{side}"))
        acc.Reload()
        m = runs[side][0]
        for key, tag in (("loss", "train/loss"), ("lr", "train/lr"), ("grad_norm", "train/grad_norm"),
                         ("grad_norm_clipped", "train/grad_norm_clipped"), ("tokens_per_s", "perf/tokens_per_s"),
                         ("mfu", "perf/mfu")):
            logged = {e.step: e.value for e in acc.Scalars(tag)}
            assert logged == {r["step"]: float(np.float32(r[key])) for r in m}, (side, tag)
        spikes = {e.step: e.value for e in acc.Scalars("health/events")}
        assert spikes[SPIKE_STEP] == 1 and sum(spikes.values()) == 1
        assert [e.step for e in acc.Scalars("health/loss_spike")] == [SPIKE_STEP]
        assert all(0 < r["mfu"] < 1 for r in m) and all(e.value > 0.01 for e in acc.Scalars("memory/rss_gib"))
        assert "health" in acc.Tags()["tensors"]  # the event lines, as text


def test_a_second_run_into_the_folder_replaces_the_first_in_tensorboard(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from migrate.train.tensorboard import RunBoard

    for loss, start, steps in ((5.0, 0, range(1, 6)), (4.0, 0, range(1, 4)), (3.0, 2, range(3, 5))):
        board = RunBoard(tmp_path, start)  # a first run, a fresh rerun, then a resume from step 2
        for step in steps:
            board.step({"step": step, "loss": loss + step, "lr": 0.1})
        board.close()
    acc = EventAccumulator(str(tmp_path)).Reload()
    assert {e.step: e.value for e in acc.Scalars("train/loss")} == {1: 5.0, 2: 6.0, 3: 6.0, 4: 7.0}


@pytest.fixture(scope="module")
def nan_skip(root):
    cfg = load_cfg(root, total_steps=12, schedule=SHORT, health=HealthConfig(policy="skip"))
    return cfg, both(cfg, root, "nan", step_faults=["nan_grad@8"])


def test_a_nan_gradient_is_skipped_identically_and_compare_passes(nan_skip, root):
    cfg, runs = nan_skip
    for side, (m, entries, error) in runs.items():
        assert error is None, side  # skip: the run goes on
        assert events(entries) == [(8, "nonfinite_grad", "skip")], side
        assert m[7]["skipped"] is True and m[7]["grad_norm"] is None and m[7]["health"] == ["nonfinite_grad"]
        assert m[8]["lr"] == m[7]["lr"]  # the scheduler did not advance either
        assert all(np.isfinite(r["loss"]) for r in m) and len(m) == 12  # the NaN never reached the weights
    result = compare_runs(root / "nan_golden" / "metrics.jsonl", root / "nan_ms" / "metrics.jsonl")
    assert result.exit_code == 0, result.verdict.line()
    # Broken case: a golden that warns (steps with the NaN) against a MindSpore run that skipped.
    golden.train(cfg.replace(health=HealthConfig(policy="warn")), root / "nan_warn", log=lambda line: None,
                 step_faults=["nan_grad@8"])
    assert metrics(root / "nan_warn")[8]["loss"] is None  # the NaN went into the weights
    broken = compare_runs(root / "nan_warn" / "metrics.jsonl", root / "nan_ms" / "metrics.jsonl",
                          hparams=(root / "nan_warn" / "effective_hparams.json",
                                   root / "nan_ms" / "effective_hparams.json"))
    assert broken.exit_code == 1
    assert "health" in {row.knob for row in broken.hparams.differing}  # the policies differ, and it says so


def test_a_nan_gradient_under_warn_reaches_the_weights_on_both_sides(root, capsys):
    # warn steps on as the framework would: clip_grad_norm_'s NaN norm turns every gradient NaN,
    # so the loss is NaN from the next step on, on the MindSpore side too (it stayed finite there,
    # its clip coefficient clamped to 1, and compare failed at step 3).
    cfg = load_cfg(root, total_steps=4, schedule=SHORT, health=HealthConfig(policy="warn"))
    runs = both(cfg, root, "nan_w", step_faults=["nan_grad@2"])
    for side, (m, entries, error) in runs.items():
        assert error is None and len(m) == 4, side
        assert [r["loss"] is None for r in m] == [False, False, True, True], side
        assert m[1]["grad_norm"] is None and not m[1].get("skipped"), side  # warn: the step was taken
        assert events(entries) == [(2, "nonfinite_grad", "continue"), (3, "nonfinite_loss", "continue"),
                                   (3, "nonfinite_grad", "continue"), (4, "nonfinite_loss", "continue"),
                                   (4, "nonfinite_grad", "continue")], side
    capsys.readouterr()
    assert cli_main(["compare", str(root / "nan_w_golden"), str(root / "nan_w_ms")]) == 0
    out = capsys.readouterr().out
    assert "loss non-finite on both sides at 2 steps (3..4)" in out and "PASS" in out


def test_an_lr_100x_in_warmup_stops_both_runs(root):
    cfg = load_cfg(root, total_steps=6, schedule=SHORT, health=HealthConfig(policy="stop"))
    runs = both(cfg, root, "lr", step_faults=["lr_x100@3"])
    for side, (m, entries, error) in runs.items():
        assert isinstance(error, HealthStop) and error.exit_code == 3 and "step 3: lr_anomaly" in str(error)
        assert [r["step"] for r in m] == [1, 2, 3] and m[2]["skipped"] is True, side
        assert m[2]["lr"] == pytest.approx(100 * cfg.optimizer.lr * 2 / 4)  # step 3 of warmup 4: index 2
        assert events(entries) == [(3, "lr_anomaly", "stop")]
    assert runs["golden"][0][2]["lr"] == runs["ms"][0][2]["lr"]


def test_an_fp16_loss_scale_that_collapses(root):
    cfg = load_cfg(root, total_steps=9, schedule=SHORT, dtype="fp16", loss_scale=LossScaleConfig(init_scale=16.0))
    runs = both(cfg, root, "fp16", step_faults=["nan_grad@3-8"])
    for side, (m, entries, error) in runs.items():
        assert error is None, side  # continue: the run goes on
        # Scales 16, 8, 4, 2, 1 at steps 3-7: the third skip in a row at 5; step 7 backs off to 0.5 < 1.
        assert events(entries) == [(5, "skipped_run", "continue"), (7, "loss_scale_collapse", "continue")], side
        assert [r["skipped"] for r in m] == [False, False] + [True] * 6 + [False]
    assert [r["loss_scale"] for r in runs["golden"][0]] == [r["loss_scale"] for r in runs["ms"][0]]


def test_migrate_health_summarises_a_run(spike, nan_skip, root, capsys, tmp_path):
    assert cli_main(["health", str(root / "spike_ms")]) == 1
    out = capsys.readouterr().out
    assert "loss_spike from step 40 (1x)" in out and "health_batches/step-000040.json" in out
    # A run without health.jsonl (older, or from elsewhere) is replayed through the same watch.
    healthy = tmp_path / "healthy"
    healthy.mkdir()
    lines = (root / "spike_ms" / "metrics.jsonl").read_text().splitlines(keepends=True)
    (healthy / "metrics.jsonl").write_text("".join(lines[:SPIKE_STEP - 1]) + '{"step": 40, "lo')  # still writing
    shutil.copy(root / "spike_ms" / "effective_hparams.json", healthy)
    assert cli_main(["health", str(healthy)]) == 0
    assert "healthy (no event)" in capsys.readouterr().out
    (healthy / "metrics.jsonl").write_text("".join(lines))
    assert cli_main(["health", "--json", str(healthy)]) == 1
    assert json.loads(capsys.readouterr().out)["first"] == {"loss_spike": 40}
    assert cli_main(["health", str(tmp_path / "nothing")]) == 2


def test_health_policy_is_a_knob_both_sides_report(nan_skip, root):
    cfg, _ = nan_skip
    g = json.loads((root / "nan_golden" / "effective_hparams.json").read_text())["health"]
    m = json.loads((root / "nan_ms" / "effective_hparams.json").read_text())["health"]
    assert g == m and g["policy"] == "skip" and g["window"] == 20


def test_health_config_errors_are_one_line(root):
    base = {"data": "data", "seq_length": 16, "total_steps": 5}
    with pytest.raises(MigrateError, match=r"health.policy: unknown policy 'skp' \(did you mean 'skip'\?\)"):
        RunConfig.from_dict({**base, "health": {"policy": "skp"}})
    with pytest.raises(MigrateError, match="health.grad_blowup_factor: must be a number > 1"):
        RunConfig.from_dict({**base, "health": {"grad_blowup_factor": 0.5}})
    with pytest.raises(MigrateError, match="health.min_history: must be <= window"):
        RunConfig.from_dict({**base, "health": {"window": 3, "min_history": 4}})
    with pytest.raises(MigrateError, match="bad step fault 'nan@3'"):
        golden.train(load_cfg(root, total_steps=5, schedule=SHORT), root / "never", step_faults=["nan@3"])
