"""migrate.compare on synthetic metrics.jsonl files shaped like golden/train_torch.py's."""
import json
import math

import numpy as np
import pytest

from migrate import compare as cmp
from migrate.compare import Tolerances, compare_runs, print_summary, write_json, write_plot
from migrate.errors import MigrateError

STEPS = 100
WARMUP = 10
BASE_LR = 5e-5


def lr_at(index):
    """HF linear schedule with warmup, as LambdaLR evaluates it (index = completed steps)."""
    if index < WARMUP:
        return BASE_LR * (float(index) / float(max(1, WARMUP)))
    return BASE_LR * max(0.0, float(STEPS - index) / float(max(1, STEPS - WARMUP)))


def golden_curve(n=STEPS):
    t = np.arange(1, n + 1, dtype=float)
    loss = 2.0 + 8.0 * np.exp(-t / 30.0) + 0.05 * np.sin(t)
    grad = 1.0 + 0.5 * np.abs(np.sin(t / 3.0))
    lr = np.array([lr_at(s - 1) for s in range(1, n + 1)])
    return t.astype(int), loss, lr, grad


def write_log(path, steps, loss, lr, grad, *, tokens_per_step=1024, extra=None, skip_keys=()):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        for i, s in enumerate(steps):
            rec = {"step": int(s), "loss": None if loss[i] is None else float(loss[i]), "lr": float(lr[i]),
                   "grad_norm": None if grad[i] is None else float(grad[i]),
                   "tokens": int(s) * tokens_per_step, "time": round(0.1 * int(s), 4)}
            if extra:
                rec.update({k: v[i] for k, v in extra.items()})
            for k in skip_keys:
                rec.pop(k, None)
            fh.write(json.dumps(rec) + "\n")
    return path


@pytest.fixture
def golden(tmp_path):
    steps, loss, lr, grad = golden_curve()
    return write_log(tmp_path / "golden" / "metrics.jsonl", steps, loss, lr, grad)


# --------------------------------------------------------------------------- fp32

def test_identical_logs_pass_with_zero_diffs(tmp_path, golden):
    steps, loss, lr, grad = golden_curve()
    ms = write_log(tmp_path / "ms.jsonl", steps, loss, lr, grad)
    r = compare_runs(golden, ms)
    assert r.passed and r.exit_code == 0 and r.first_failure is None
    assert len(r.steps) == STEPS
    assert np.all(r.loss_abs == 0) and np.all(r.loss_rel == 0)
    assert np.nanmax(r.lr_rel) == 0 and np.all(r.grad_rel == 0)
    for key in ("first", "max", "mean", "lr", "grad_max", "grad_mean", "tokens"):
        c = r.check(key)
        assert c.passed is True and c.value == 0 and c.step is None, key
    assert r.verdict_text().startswith("PASS")


def test_run_folder_is_accepted(tmp_path, golden):
    r = compare_runs(golden.parent, golden)
    assert r.passed and r.golden_path == golden


def test_tiny_relative_perturbation_passes_fp32(tmp_path, golden):
    steps, loss, lr, grad = golden_curve()
    sign = np.where(np.arange(STEPS) % 2 == 0, 1.0, -1.0)
    ms = write_log(tmp_path / "ms.jsonl", steps, loss * (1 + 1e-7 * sign), lr, grad * (1 - 1e-7 * sign))
    r = compare_runs(golden, ms, dtype="fp32")
    assert r.passed, r.verdict_text()
    assert r.check("first").value == pytest.approx(1e-7, rel=1e-3)
    assert r.check("max").value == pytest.approx(1e-7, rel=1e-3)
    assert r.check("grad_max").value == pytest.approx(1e-7, rel=1e-3)
    # ten times the fp32 first-step bound fails, at step 1
    ms2 = write_log(tmp_path / "ms2.jsonl", steps, loss * (1 + 1e-5), lr, grad)
    r2 = compare_runs(golden, ms2)
    assert not r2.passed and r2.first_failure.key == "first" and r2.first_failure.step == 1


def test_lr_off_by_one_warmup_step_fails_on_lr_at_first_step(tmp_path, golden):
    steps, loss, lr, grad = golden_curve()
    shifted = np.array([lr_at(s) for s in range(1, STEPS + 1)])  # one scheduler step ahead
    ms = write_log(tmp_path / "ms.jsonl", steps, loss, shifted, grad)
    r = compare_runs(golden, ms)
    assert not r.passed and r.exit_code == 1
    first = r.first_failure
    assert first.key == "lr" and first.step == 1
    assert [c.key for c in r.failed] == ["lr"]
    assert r.fail_steps["lr"] == list(range(1, STEPS + 1))  # every step is one schedule step ahead
    text = r.verdict_text()
    assert "step 1" in text and "lr" in text and "off by one step" in text


def test_loss_drift_from_step_50_is_named(tmp_path, golden):
    steps, loss, lr, grad = golden_curve()
    drift = np.where(steps >= 50, 1e-2 * (steps - 49), 0.0)  # jumps 1e-2 at step 50, grows after
    ms = write_log(tmp_path / "ms.jsonl", steps, loss + drift, lr, grad)
    r = compare_runs(golden, ms)
    assert not r.passed
    assert r.first_failure.key == "max" and r.first_failure.step == 50
    assert r.check("first").passed and r.check("lr").passed
    assert r.check("mean").passed is False and r.check("mean").step > 50
    assert "step 50" in r.verdict_text() and "loss" in r.verdict_text()


def test_gradual_loss_drift_is_named_near_its_start(tmp_path, golden):
    steps, loss, lr, grad = golden_curve()
    ms_loss = loss * (1 + np.where(steps >= 50, 2e-4 * (steps - 49), 0.0))
    ms = write_log(tmp_path / "ms.jsonl", steps, ms_loss, lr, grad)
    r = compare_runs(golden, ms)
    assert not r.passed and r.first_failure.key == "max"
    assert 50 <= r.first_failure.step <= 56


def test_grad_norm_and_nonfinite_handling(tmp_path, golden):
    steps, loss, lr, grad = golden_curve()
    g2 = grad.copy()
    g2[29] *= 1.05
    ms_loss = list(loss)
    ms_loss[69] = None  # MindSpore's loss went non-finite where the golden's did not
    ms = write_log(tmp_path / "ms.jsonl", steps, ms_loss, lr, g2)
    r = compare_runs(golden, ms)
    assert r.check("grad_max").passed is False and r.check("grad_max").step == 30
    assert r.check("max").step == 70 and math.isinf(r.check("max").value)


def test_a_loss_non_finite_on_both_sides_agrees_and_is_named(tmp_path):
    # A NaN gradient under health policy warn: both losses null from step 91 (the weights went NaN).
    steps, loss, lr, grad = golden_curve()
    loss, grad = [None if s > 90 else v for s, v in zip(steps, loss, strict=True)], list(grad)
    grad[89:] = [None] * 11
    g = write_log(tmp_path / "g.jsonl", steps, loss, lr, grad)
    r = compare_runs(g, write_log(tmp_path / "ms.jsonl", steps, loss, lr, grad))
    assert r.exit_code == 0
    assert "loss non-finite on both sides at 10 steps (91..100): they agree there; the loss rules judge the " \
           "other steps" in r.notes
    # One side still finite there (its NaN never reached the weights): the first such step fails.
    finite = write_log(tmp_path / "ms_finite.jsonl", steps, golden_curve()[1], lr, grad)
    r = compare_runs(g, finite)
    assert r.exit_code == 1 and r.check("max").step == 91
    assert not any("non-finite on both sides" in n for n in r.notes)


def test_tolerance_overrides(tmp_path, golden):
    steps, loss, lr, grad = golden_curve()
    ms = write_log(tmp_path / "ms.jsonl", steps, loss * (1 + 2e-6), lr, grad)
    assert not compare_runs(golden, ms).passed
    r = compare_runs(golden, ms, tolerances={"first": 1e-5, "mean": None})
    assert r.passed and r.tolerances.first == 1e-5 and r.tolerances.mean == 1e-4
    r = compare_runs(golden, ms, tolerances={"first": math.inf})
    assert r.passed and r.check("first").passed is None  # disabled: reported, not judged
    with pytest.raises(MigrateError, match="unknown tolerance"):
        compare_runs(golden, ms, tolerances={"firts": 1.0})
    with pytest.raises(MigrateError, match="tolerance mean"):
        compare_runs(golden, ms, tolerances={"mean": -1})
    with pytest.raises(MigrateError, match="unknown dtype"):
        compare_runs(golden, ms, dtype="int8")
    assert Tolerances.for_dtype("bfloat16").first == 5e-3


# --------------------------------------------------------------------------- step pairing

def test_missing_steps_fail_unless_prefix_allowed(tmp_path, golden):
    steps, loss, lr, grad = golden_curve()
    ms = write_log(tmp_path / "ms.jsonl", steps[:60], loss[:60], lr[:60], grad[:60])
    r = compare_runs(golden, ms)
    assert not r.passed and r.first_failure.key == "steps" and r.first_failure.step == 61
    assert r.only_golden == list(range(61, 101)) and r.only_ms == []
    assert "61..100" in r.first_failure.reason() and "allow-prefix" in r.first_failure.reason()
    r = compare_runs(golden, ms, allow_prefix=True)
    assert r.passed and len(r.steps) == 60 and any("prefix" in n for n in r.notes)
    keep = np.r_[0:40, 45:STEPS]  # a hole in the middle is never a prefix
    gap = write_log(tmp_path / "gap.jsonl", steps[keep], loss[keep], lr[keep], grad[keep])
    r = compare_runs(golden, gap, allow_prefix=True)
    assert not r.passed and r.first_failure.key == "steps" and r.first_failure.step == 41


def test_no_common_step_is_bad_input(tmp_path, golden):
    steps, loss, lr, grad = golden_curve()
    ms = write_log(tmp_path / "ms.jsonl", steps + 1000, loss, lr, grad)
    with pytest.raises(MigrateError, match="no step in common"):
        compare_runs(golden, ms)


def test_tokens_and_fp16_flags_must_agree(tmp_path):
    steps, loss, lr, grad = golden_curve()
    skipped = [False] * STEPS
    skipped[4] = True
    scale = [65536.0] * 5 + [32768.0] * (STEPS - 5)
    gnull = list(grad)
    gnull[4] = None
    g = write_log(tmp_path / "g.jsonl", steps, loss, lr, gnull, extra={"skipped": skipped, "loss_scale": scale})
    same = write_log(tmp_path / "same.jsonl", steps, loss, lr, gnull,
                     extra={"skipped": skipped, "loss_scale": scale})
    r = compare_runs(g, same, dtype="fp16")
    assert r.passed, r.verdict_text()
    assert r.check("skipped").passed and r.check("loss_scale").passed
    other = [False] * STEPS
    other[6] = True
    ms = write_log(tmp_path / "ms.jsonl", steps, loss, lr, grad, tokens_per_step=1000,
                   extra={"skipped": other, "loss_scale": scale})
    r = compare_runs(g, ms, dtype="fp16")
    assert r.check("tokens").passed is False and r.check("tokens").step == 1
    assert r.check("skipped").passed is False and r.check("skipped").step == 5
    assert r.fail_steps["skipped"] == [5, 7]
    assert r.check("grad_max").step == 5  # null on one side only
    assert r.first_failure.key == "tokens"


# --------------------------------------------------------------------------- bf16 + noise run

def _bf16_runs(tmp_path, sigma=0.002, offset=0.0, seed=0):
    steps, base, lr, grad = golden_curve()
    z1, z2, z3 = np.random.default_rng(seed).standard_normal((3, STEPS))
    z3[0] = z1[0]  # step 1 sees the same batch on the same weights
    golden = base * (1 + sigma * z1)
    noise = base * (1 + sigma * z2)
    ms = base * (1 + sigma * z3)
    ms[1:] *= 1 + offset
    g = write_log(tmp_path / "golden.jsonl", steps, golden, lr, grad)
    n = write_log(tmp_path / "golden_seed2.jsonl", steps, noise, lr, grad * (1 + 0.01 * z2))
    m = write_log(tmp_path / "ms.jsonl", steps, ms, lr, grad * (1 + 0.01 * z3))
    noise_mean = float(np.mean(np.abs(noise - golden) / golden))
    return g, n, m, noise_mean


def test_bf16_within_noise_band_passes(tmp_path):
    g, n, m, noise_mean = _bf16_runs(tmp_path)
    r = compare_runs(g, m, noise_path=n, dtype="bf16")
    assert r.passed, r.verdict_text()
    band = r.check("band")
    assert band.passed is True and band.value < 1.0
    assert r.noise_figures["mean"] == pytest.approx(noise_mean)
    assert r.check("mean").noise == pytest.approx(noise_mean)
    assert 0 < r.noise_figures["first"] and r.noise_figures["max"] > 0
    # judged from the first full window on
    judged = ~np.isnan(r.band_limit)
    assert judged.sum() == STEPS - r.tolerances.window + 1
    assert np.all(r.band_limit[judged] >= r.tolerances.band_floor)


def test_bf16_systematic_offset_of_three_noise_bands_fails(tmp_path):
    _, _, _, noise_mean = _bf16_runs(tmp_path / "probe")
    g, n, m, _ = _bf16_runs(tmp_path, offset=3 * noise_mean)
    r = compare_runs(g, m, noise_path=n, dtype="bf16")
    assert not r.passed
    assert [c.key for c in r.failed] == ["band"]  # inside MindFormers' 0.5 % / 1 %, outside the noise
    assert r.first_failure.key == "band" and r.first_failure.step == r.tolerances.window
    assert "noise band" in r.verdict_text() and f"step {r.tolerances.window}" in r.verdict_text()
    # without a noise run, bf16 falls back to MindFormers' bounds, which this offset meets
    r = compare_runs(g, m, dtype="bf16")
    assert r.passed and r.check("band") is None
    assert r.check("first").limit == 5e-3 and r.check("mean").limit == 1e-2


def test_deterministic_noise_run_is_noted(tmp_path, golden):
    r = compare_runs(golden, golden, noise_path=golden)
    assert r.passed and r.noise_figures["mean"] == 0 and r.check("band") is None
    assert any("deterministic rerun" in note for note in r.notes)
    r = compare_runs(golden, golden, noise_path=golden, dtype="bf16")
    assert r.passed and r.check("band").passed
    assert np.nanmax(r.band_limit) == r.tolerances.band_floor


def test_noisy_baseline_tighter_bound_is_noted(tmp_path):
    g, n, m, _ = _bf16_runs(tmp_path, sigma=0.004)
    r = compare_runs(g, m, noise_path=n, dtype="fp32")
    assert not r.passed
    assert any("tighter than the baseline" in note for note in r.notes)


# --------------------------------------------------------------------------- bad input

def test_missing_file(tmp_path, golden):
    with pytest.raises(MigrateError, match="no such file"):
        compare_runs(golden, tmp_path / "nope.jsonl")
    with pytest.raises(MigrateError, match="without metrics.jsonl"):
        compare_runs(golden, tmp_path)


def test_malformed_line_names_file_and_line(tmp_path, golden):
    bad = tmp_path / "ms.jsonl"
    lines = golden.read_text().splitlines()
    lines[2] = lines[2][:20]  # truncated
    bad.write_text("\n".join(lines) + "\n")
    with pytest.raises(MigrateError, match=rf"{bad}:3: not JSON"):
        compare_runs(golden, bad)
    bad.write_text(lines[0] + "\n[1, 2]\n")
    with pytest.raises(MigrateError, match=rf"{bad}:2: expected a JSON object"):
        compare_runs(golden, bad)


def test_missing_key_names_file_and_line(tmp_path, golden):
    steps, loss, lr, grad = golden_curve()
    bad = write_log(tmp_path / "ms.jsonl", steps, loss, lr, grad)
    lines = bad.read_text().splitlines()
    rec = json.loads(lines[1])
    del rec["lr"]
    lines[1] = json.dumps(rec)
    bad.write_text("\n".join(lines) + "\n")
    with pytest.raises(MigrateError, match=rf"{bad}:2: missing key 'lr'"):
        compare_runs(golden, bad)


@pytest.mark.parametrize("line, msg", [
    ('{"step": 0, "loss": 1, "lr": 1, "grad_norm": 1}', "'step' must be an integer"),
    ('{"step": 1.5, "loss": 1, "lr": 1, "grad_norm": 1}', "'step' must be an integer"),
    ('{"step": NaN, "loss": 1, "lr": 1, "grad_norm": 1}', "'step' must be an integer"),
    ('{"step": 1, "loss": 1, "lr": Infinity, "grad_norm": 1}', "'lr' must be finite"),
    ('{"step": 1, "loss": "x", "lr": 1, "grad_norm": 1}', "'loss' must be a number or null"),
    ('{"step": 1, "loss": 1, "lr": null, "grad_norm": 1}', "'lr' is null"),
    ('{"step": 1, "loss": 1, "lr": 1, "grad_norm": 1, "skipped": 1}', "'skipped' must be true or false"),
])
def test_bad_values_name_file_and_line(tmp_path, golden, line, msg):
    bad = tmp_path / "ms.jsonl"
    bad.write_text("\n" + line + "\n")
    with pytest.raises(MigrateError, match=rf"{bad}:2: {msg}"):
        compare_runs(golden, bad)


def test_duplicate_step_and_empty_file(tmp_path, golden):
    bad = tmp_path / "ms.jsonl"
    rec = '{"step": 1, "loss": 1, "lr": 1, "grad_norm": 1}'
    bad.write_text(rec + "\n" + rec + "\n")
    with pytest.raises(MigrateError, match=rf"{bad}:2: step 1 already logged on line 1"):
        compare_runs(golden, bad)
    bad.write_text("\n")
    with pytest.raises(MigrateError, match="no metrics lines"):
        compare_runs(golden, bad)
    bad.write_bytes(b"\xff\xfe")
    with pytest.raises(MigrateError, match="not UTF-8"):
        compare_runs(golden, bad)


# --------------------------------------------------------------------------- outputs

def test_plot_is_png_and_written_atomically(tmp_path, monkeypatch):
    g, n, m, noise_mean = _bf16_runs(tmp_path, offset=0.01)
    r = compare_runs(g, m, noise_path=n, dtype="bf16")
    assert not r.passed
    out = tmp_path / "plots" / "compare.png"
    assert write_plot(r, out) == out
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    assert sorted(p.name for p in out.parent.iterdir()) == ["compare.png"]  # no temp file left

    # a failing replace leaves the old plot whole and no temp file behind
    import migrate.checkpoints.atomic as atomic

    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(atomic.os, "replace", boom)
    monkeypatch.setattr(cmp.plot, "render_plot", lambda result: b"\x89PNG new plot")  # skip a second render
    with pytest.raises(OSError, match="disk full"):
        write_plot(compare_runs(g, g), out)
    assert out.read_bytes() == data
    assert sorted(p.name for p in out.parent.iterdir()) == ["compare.png"]


def test_plot_without_noise_and_identical(tmp_path, golden):
    out = write_plot(compare_runs(golden, golden), tmp_path / "same.png")
    assert out.read_bytes()[:4] == b"\x89PNG"


def test_to_dict_is_strict_json(tmp_path):
    g, n, m, _ = _bf16_runs(tmp_path, offset=0.01)
    steps, loss, lr, grad = golden_curve()
    nulls = list(grad)
    nulls[3] = None
    m2 = write_log(tmp_path / "ms2.jsonl", steps, loss, lr, nulls)
    for r in (compare_runs(g, m, noise_path=n, dtype="bf16"), compare_runs(g, m2)):
        d = r.to_dict()
        text = json.dumps(d, allow_nan=False)
        back = json.loads(text)
        assert back["summary"]["passed"] is False
        assert back["summary"]["first_failure"]["step"] == r.first_failure.step
        assert len(back["per_step"]["step"]) == STEPS
        assert {c["key"] for c in back["checks"]} >= {"first", "max", "mean", "lr", "grad_max", "grad_mean"}
    path = write_json(r, tmp_path / "out" / "compare.json")
    assert json.loads(path.read_text())["dtype"] == "fp32"
    assert "inf" in path.read_text()  # the one-sided null grad norm, as a string


def test_print_summary_names_first_step_and_metric(tmp_path, golden):
    from rich.console import Console

    steps, loss, lr, grad = golden_curve()
    ms = write_log(tmp_path / "ms.jsonl", steps, loss + np.where(steps >= 50, 0.05, 0.0), lr, grad)
    r = compare_runs(golden, ms, noise_path=golden)
    con = Console(record=True, width=220)
    print_summary(r, con)
    text = con.export_text()
    assert "max loss rel diff" in text and "first-step loss rel diff" in text
    assert "FAIL · first out of tolerance at step 50: max loss rel diff" in text
    assert "noise run" in text and "note:" in text


# --------------------------------------------------------------------------- post-clip norm (clip rule)

def _clip_logs(tmp_path, ms_clipped, ms_pre=None, max_norm=0.5):
    """Golden and MindSpore logs with grad_norm_clipped as clip_grad_norm_ gives it (pre-clip norms 1.0..1.5)."""
    steps, loss, lr, grad = golden_curve()
    golden_clipped = np.minimum(max_norm * grad / (grad + 1e-6), grad)
    g = write_log(tmp_path / "golden.jsonl", steps, loss, lr, grad, extra={"grad_norm_clipped": golden_clipped})
    pre = grad if ms_pre is None else ms_pre
    m = write_log(tmp_path / "ms.jsonl", steps, loss, lr, pre,
                  extra={"grad_norm_clipped": ms_clipped(pre, max_norm)})
    return g, m


def test_clip_rule_catches_a_clip_coefficient_without_eps(tmp_path):
    torch_rule = lambda pre, max_norm: np.minimum(max_norm * pre / (pre + 1e-6), pre)  # noqa: E731
    g, m = _clip_logs(tmp_path / "same", torch_rule)
    r = compare_runs(g, m)
    assert r.passed and r.check("clip").passed and r.check("clip").value == 0
    assert np.isfinite(r.clip_signed).all()  # every step clipped on both sides
    no_eps = lambda pre, max_norm: np.minimum(max_norm * pre / pre, pre)  # noqa: E731
    g, m = _clip_logs(tmp_path / "no_eps", no_eps)
    r = compare_runs(g, m)
    assert not r.passed and [c.key for c in r.failed] == ["clip"]
    assert r.check("clip").value == pytest.approx(np.mean(1e-6 / golden_curve()[3]), rel=1e-3)
    assert "clip coefficient differs" in r.verdict_text()
    # fp16/bf16 keep the same bound, and a noise run does not widen it
    r = compare_runs(g, m, noise_path=g, dtype="bf16")
    assert r.check("clip").passed is False and r.check("clip").limit == 2e-7


def test_clip_bound_widens_over_few_noisy_steps(tmp_path):
    """fp32 rounding moves single post-clip norms by up to ~1e-6: over a dozen clipped steps a
    clean mean of 1.7e-7 (make demo's) passes, while the missing-eps shift still fails."""
    steps = golden_curve()[0]
    clipped = np.where(np.arange(len(steps)) < 12, 1.0, 10.0)  # max_norm 1.0: only the first 12 steps clip
    noise = np.random.default_rng(3).normal(1.7e-7, 4.6e-7, len(steps))

    def noisy(pre, shift=0.0):
        post = np.minimum(clipped * pre / (pre + 1e-6), pre)
        return np.where(post < pre, post * (1 + noise + shift), post)

    def logs(name, rule):
        steps_, loss, lr, pre = golden_curve()
        g = write_log(tmp_path / name / "g.jsonl", steps_, loss, lr, pre,
                      extra={"grad_norm_clipped": np.minimum(clipped * pre / (pre + 1e-6), pre)})
        m = write_log(tmp_path / name / "m.jsonl", steps_, loss, lr, pre, extra={"grad_norm_clipped": rule(pre)})
        return compare_runs(g, m).check("clip")

    clean = logs("clean", noisy)
    assert clean.passed and 2e-7 < clean.limit < 1e-6 and clean.value > 1e-7
    faulty = logs("no_eps", lambda pre: noisy(pre, shift=1e-6 / pre))
    assert faulty.passed is False and faulty.value > faulty.limit


def test_clip_rule_skips_unclipped_steps_and_diverged_norms(tmp_path):
    torch_rule = lambda pre, max_norm: np.minimum(max_norm * pre / (pre + 1e-6), pre)  # noqa: E731
    g, m = _clip_logs(tmp_path / "unclipped", torch_rule, max_norm=10.0)  # never clipped: post == pre
    r = compare_runs(g, m)
    assert r.passed and r.check("clip").passed is None and np.isnan(r.clip_signed).all()
    # pre-clip norms 5 % apart: the post-clip norms differ by 1e-6 * (1/pre - 1/pre'), which is not the clip's doing
    no_eps_far = lambda pre, max_norm: np.minimum(max_norm * pre / pre, pre)  # noqa: E731
    steps, _, _, grad = golden_curve()
    g, m = _clip_logs(tmp_path / "far", no_eps_far, ms_pre=grad * 1.05)
    r = compare_runs(g, m)
    assert r.check("clip").passed is None and r.check("grad_mean").passed is False


def test_logs_without_post_clip_norms_have_no_clip_rule(tmp_path, golden):
    steps, loss, lr, grad = golden_curve()
    nulls = [None] * STEPS  # an fp16 run whose every step overflowed logs null
    m = write_log(tmp_path / "ms.jsonl", steps, loss, lr, grad, extra={"grad_norm_clipped": nulls})
    r = compare_runs(golden, m)
    assert r.check("clip") is None and r.passed
    r = compare_runs(m, m)
    assert r.check("clip").passed is None and r.passed
