"""The noise reference of `migrate diff` (`migrate.judge.noise`): bounds widen to the reference's
own error against its float64 twin, never below the fixed bounds; low precision holds the share of
elements off by 5‰ to the reference's own; top-1 forgives near ties; the fallback scales for depth
and width and says so; dumps carry the noise of the side that was twinned."""
import json
import math

import numpy as np
import pytest

from hf_fixtures import build_hf_model, save_hf_model
from migrate.align import run_diff
from migrate.cli import main
from migrate.convert import convert
from migrate.judge.checks import tensor_checks
from migrate.judge.metrics import logits_metrics
from migrate.judge.noise import TWIN, noise_figures, tie_margin
from migrate.judge.report import Report
from migrate.judge.thresholds import Thresholds, fallback_factor
from migrate.judge.twin import twin_refused
from migrate.probe import diff_pair, dump
from migrate.probe.dump_format import Dump


def _sides(rng, shape, own, other, offset=0.0):
    """exact values, the reference off them by `own`, the other side by `other` (+ a systematic offset)."""
    exact = rng.standard_normal(shape) * 10
    ref = exact + own * rng.standard_normal(shape)
    got = exact + other * rng.standard_normal(shape) + offset
    return exact, ref.astype(np.float32), got.astype(np.float32)


def test_a_difference_at_the_reference_s_own_noise_passes_where_fixed_bounds_fail():
    rng = np.random.default_rng(0)
    exact, ref, got = _sides(rng, (4, 32, 64), own=2e-3, other=2e-3)   # 1e-5 x peak ~ 4e-4: far below
    fixed = Report(dtype="fp32").add("layer 0 output", ref, got, layer=0, block="layer output")
    assert not fixed.passed and "max_abs" in fixed.reason
    with_ref = Report(dtype="fp32").add("layer 0 output", ref, got, layer=0, block="layer output", exact=exact)
    assert with_ref.passed, with_ref.reason
    assert 1.0 < with_ref.noise_ratio < 3.0
    assert with_ref.metrics["noise"]["max_abs"] == pytest.approx(float(np.abs(ref - exact).max()), rel=1e-6)


def test_a_fault_far_above_the_noise_still_fails_and_says_what_the_bound_was():
    rng = np.random.default_rng(1)
    exact, ref, got = _sides(rng, (4, 32, 64), own=2e-3, other=2e-3, offset=0.5)
    entry = Report(dtype="fp32").add("layer 0 output", ref, got, layer=0, block="layer output", exact=exact)
    assert not entry.passed
    assert "× the reference's own error vs float64" in entry.reason


def test_the_fixed_bound_stays_the_floor_where_the_reference_is_exact():
    ref = np.arange(12, dtype=np.float32).reshape(3, 4)
    got = ref + 1e-3  # the reference is exact (noise 0): the fixed 1e-5 x peak decides
    entry = Report(dtype="fp32").add("embedding output", ref, got, block="embedding", exact=ref.astype(np.float64))
    assert not entry.passed and entry.noise_ratio is None


def test_a_bound_the_user_sets_is_not_widened():
    rng = np.random.default_rng(2)
    exact, ref, got = _sides(rng, (2, 16, 32), own=2e-3, other=2e-3)
    t = Thresholds("fp32").with_overrides(None, max_abs=1e-3)
    rep = Report(dtype="fp32", thresholds=t)
    entry = rep.add("layer 0 output", ref, got, layer=0, block="layer output", exact=exact)
    assert not entry.passed and "max_abs" in entry.reason and "reference" not in entry.reason
    assert t.hidden.widens("max_abs") is None and t.hidden.widens("cosine") == t.hidden.noise


def test_low_precision_share_off_is_held_to_the_reference_s_own():
    base = {"max_abs": 0.1, "ref_max_abs": 10.0, "got_max_abs": 10.0, "cosine": 0.9999}
    own = {"max_abs": 0.2, "cosine": 0.9999, "off": 0.32, "rms": 0.02}
    t = Thresholds("bf16")
    ok = tensor_checks({**base, "within_5e-3": 1 - 0.30, "noise": own}, "hidden", t)
    bad = tensor_checks({**base, "within_5e-3": 1 - 0.44, "noise": own}, "hidden", t)
    assert all(c.passed is not False for c in ok)
    failed = [c for c in bad if c.passed is False]
    assert [c.key for c in failed] == ["within"] and "1.25 × the reference's own share" in failed[0].detail
    # without a reference the fixed 90 % share judges as before
    assert [c.key for c in tensor_checks({**base, "within_5e-3": 0.89}, "hidden", t) if c.passed is False] == ["within"]


def test_top1_disagreements_inside_the_noise_are_near_ties():
    ref = np.zeros((4, 10), np.float32)
    ref[:, 3] = 5.0
    ref[0, 7] = 5.0 - 1e-4      # position 0: 3 and 7 tie within the noise
    got = ref.copy()
    got[0, 7] += 2e-4           # the other side picks 7 there
    noise = {"rms": 1e-4}
    m = logits_metrics(ref, got, tie_margin=tie_margin(noise, 8.0))
    assert m["top1"] == 0.75 and m["top1_ties"] == 1 and m["top1_decisive"] == 1.0
    got[1, 0] = 9.0             # position 1: a decisive disagreement
    m = logits_metrics(ref, got, tie_margin=tie_margin(noise, 8.0))
    assert m["top1_decisive"] == pytest.approx(2 / 3)
    checks = tensor_checks({**m, "noise": {"max_abs": 1e-3, "cosine": 1.0, "rms": 1e-4, "off": 0.0}}, "logits",
                           Thresholds("fp32"))
    top1 = next(c for c in checks if c.key == "top1")
    assert top1.passed is False and "decisive positions (1 near ties" in top1.detail


def test_in_low_precision_only_logits_within_two_ulps_are_ties():
    noise = {"rms": 0.42}   # bf16 logits off float64 by 0.42 RMS: 2K x that would tie nearly every position
    assert tie_margin(noise, 8.0) == pytest.approx(6.72)
    assert tie_margin(noise, 8.0, "bf16", peak=33.0) == 2 * 32 * 2 ** -7   # two bf16 ulps at 32..64
    assert tie_margin({"rms": 1e-5}, 8.0, "bf16", peak=33.0) == pytest.approx(1.6e-4)  # the noise, when smaller


def test_noise_figures_measure_the_reference_against_the_twin():
    exact = np.linspace(-1, 1, 1000).reshape(10, 100)
    ref = (exact * (1 + 1e-2)).astype(np.float32)
    n = noise_figures(ref, exact, logits=True)
    assert n["max_abs"] == pytest.approx(1e-2, rel=1e-3) and n["off"] > 0.9 and n["kl"] > 0 and n["top1"] == 1.0


def test_fallback_factor_grows_with_depth_and_width_and_leaves_the_tiny_models_alone():
    assert fallback_factor(2, 64) == 1.0 and fallback_factor(1, 16) == 1.0
    assert fallback_factor(30, 576) == pytest.approx(math.sqrt(15 * 9))
    t = Thresholds("fp32").with_overrides("grad", max_abs=1e-6).scaled(4.0)
    assert t.hidden.max_abs == pytest.approx(4e-5) and t.hidden.max_abs_rel == pytest.approx(4e-5)
    assert t.grad.max_abs == 1e-6  # set by the user: kept


def test_the_twin_is_refused_when_it_would_not_fit():
    import torch

    model = torch.nn.Linear(1000, 1000)
    assert twin_refused(model, "fp64", available=10 * 8 * 1001000) is None
    why = twin_refused(model, "fp64", available=8 * 1001000)
    assert why and "float64 twin of the model needs" in why
    assert twin_refused(model, "none") == "--reference none"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("noise_ref")
    save_hf_model(build_hf_model("gqa", seed=5), root / "hf")
    convert(root / "hf", root / "ms")
    return root


def test_live_diff_judges_every_tensor_against_the_twin(tiny):
    report = run_diff(tiny / "hf", tiny / "ms", detail=True, grads=True)
    assert report.passed
    assert report.reference["source"] == TWIN
    assert all("noise" in e.metrics for e in report.entries if e.kind != "generation")
    assert report.reference["error_ratio_max"] >= report.reference["error_ratio_median"] > 0
    assert "noise reference" in report.reference_line() and "float64 noise reference" in report.verdict_text()
    # report.json keeps the noise figures and reads them back into the same verdict
    again = Report.from_dict(json.loads(report.to_json()))
    assert again.entries[5].metrics["noise"] == report.entries[5].metrics["noise"] and again.passed


def test_without_a_reference_the_verdict_line_says_the_bounds_are_the_fallback(tiny, capsys):
    assert main(["diff", str(tiny / "hf"), str(tiny / "ms"), "--reference", "none"]) == 0
    out = capsys.readouterr().out.replace("\n", " ")
    assert "no float64 reference" in out and "--reference none" in out


def test_a_torch_dump_carries_its_own_noise_and_the_diff_of_dumps_uses_it(tiny):
    inputs = tiny / "ids.npz"
    dump(str(tiny / "hf"), tiny / "d_hf", inputs_file=inputs)
    dump(str(tiny / "hf"), tiny / "d_hf_bare", inputs_file=inputs, reference="none")
    dump(str(tiny / "ms"), tiny / "d_ms", inputs_file=inputs)
    hf = Dump(tiny / "d_hf")
    assert hf.manifest["reference"]["source"] == TWIN
    assert all(isinstance(r.get("noise"), dict) for r in hf.records)
    assert not any("noise" in r for r in Dump(tiny / "d_hf_bare").records)
    assert Dump(tiny / "d_ms").manifest["reference"] == {"refused": "a MindSpore side has no float64 twin"}
    both = diff_pair(str(tiny / "d_hf"), str(tiny / "d_ms"), detail=True)
    assert both.passed and both.reference["source"] == TWIN and both.summary["headline"]["noise_entries"] > 0
    bare = diff_pair(str(tiny / "d_hf_bare"), str(tiny / "d_ms"), detail=True)
    assert bare.passed and bare.reference["source"] == "fallback" and "no float64 reference" in bare.verdict_text()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_in_place_twin_gives_every_weight_back_bit_for_bit(dtype):
    import torch

    from migrate.probe.dumping import model_identity
    from migrate.probe.twin import float64_in_place

    model = build_hf_model("tied", seed=3, dtype=getattr(torch, dtype))
    before = model_identity(model, "torch")
    buffers = {n: b.clone() for n, b in model.named_buffers()}
    with float64_in_place(model) as twin:
        assert next(twin.parameters()).dtype == torch.float64
        twin(torch.arange(8)[None])
    assert next(model.parameters()).dtype == getattr(torch, dtype)
    assert model_identity(model, "torch") == before
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tying kept
    assert all(torch.equal(b, buffers[n]) and b.dtype == buffers[n].dtype for n, b in model.named_buffers())


def test_a_twin_that_is_the_models_last_use_leaves_it_float64_with_the_same_values():
    """`migrate diff --grads` without --generate does not run HF's model after its twin: the cast back
    is skipped (restore=False), the values are the weights widened."""
    import torch

    from migrate.probe.twin import float64_in_place

    model = build_hf_model("tied", seed=3)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    with float64_in_place(model, restore=False) as twin:
        twin(torch.arange(8)[None])
    for name, p in model.named_parameters():
        assert p.dtype == torch.float64 and torch.equal(p.detach(), before[name].double()), name
