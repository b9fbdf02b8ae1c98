"""Numeric engine of `migrate diff`: metrics, thresholds, judging (plain numpy, no frameworks run)."""
import math

import numpy as np
import pytest

from migrate.dtype_names import canonical_dtype
from migrate.errors import MigrateError
from migrate.judge import fmt_cosine
from migrate.judge import metrics as M
from migrate.judge.checks import judge
from migrate.judge.metrics import generation_metrics, logits_metrics, tensor_metrics
from migrate.judge.thresholds import Bounds, Thresholds


def rng(seed=0):
    return np.random.default_rng(seed)


# --------------------------------------------------------------------------- tensor_metrics

def test_identical_tensors_are_perfect():
    a = rng().standard_normal((3, 5, 7)).astype(np.float32)
    m = tensor_metrics(a, a.copy())
    assert m["max_abs"] == 0 and m["mean_abs"] == 0 and m["max_rel"] == 0
    assert m["cosine"] == 1.0
    assert m["within_1e-3"] == 1.0 and m["within_5e-3"] == 1.0
    assert m["nonfinite_match"] is True and m["nan_ref"] == m["inf_got"] == 0
    assert m["shape"] == [3, 5, 7] and m["numel"] == 105 and m["dtype_ref"] == "float32"
    assert judge(m, "hidden", Thresholds("fp32")) == (True, None)


def test_single_perturbation_is_located_and_measured():
    a = rng(1).standard_normal((4, 6))
    b = a.copy()
    b[2, 3] += 0.25
    m = tensor_metrics(a, b)
    assert m["max_abs"] == pytest.approx(0.25)
    assert m["max_abs_index"] == [2, 3]
    assert m["mean_abs"] == pytest.approx(0.25 / 24)
    assert m["ref_max_abs"] == pytest.approx(np.abs(a).max())


def test_known_cosine_values():
    # 45 degrees apart: cosine = 1/sqrt(2)
    m = tensor_metrics(np.array([1.0, 0.0]), np.array([1.0, 1.0]))
    assert m["cosine"] == pytest.approx(1 / math.sqrt(2), abs=1e-15)
    # opposite vectors, and a scaled copy (direction kept, magnitude not)
    a = rng(2).standard_normal(50)
    assert tensor_metrics(a, -a)["cosine"] == pytest.approx(-1.0, abs=1e-15)
    scaled = tensor_metrics(a, 3 * a)
    assert scaled["cosine"] == pytest.approx(1.0, abs=1e-15)
    assert scaled["max_abs"] == pytest.approx(2 * np.abs(a).max())
    # rotate a 3-4-5 triangle: cos = (3*4 + 4*3) / 25
    assert tensor_metrics(np.array([3.0, 4.0]), np.array([4.0, 3.0]))["cosine"] == pytest.approx(24 / 25)


def test_cosine_of_zero_tensors():
    z = np.zeros((2, 3), np.float32)
    assert tensor_metrics(z, z)["cosine"] == 1.0
    assert tensor_metrics(z, np.ones((2, 3), np.float32))["cosine"] == 0.0
    assert tensor_metrics(np.ones(3), np.zeros(3))["cosine"] == 0.0


def test_max_rel_is_zero_safe():
    ref = np.array([0.0, 1.0, 2.0, -3.0])          # mean |ref| = 1.5 -> floor 1.5e-3
    got = ref + np.array([1e-6, 2e-3, 0.0, 0.0])
    m = tensor_metrics(ref, got)
    assert m["rel_floor"] == pytest.approx(M.REL_FLOOR_FRACTION * 1.5)
    # element 0 (exact zero): 1e-6 / 1.5e-3, not 1e-6 / 0
    # element 1: 2e-3 / 1
    assert m["max_rel"] == pytest.approx(2e-3, rel=1e-9)
    assert m["within_1e-3"] == pytest.approx(3 / 4)   # 1e-6/1.5e-3 = 6.7e-4 is within
    assert m["within_5e-3"] == 1.0
    # all-zero reference: finite, huge relative error rather than inf / nan
    z = tensor_metrics(np.zeros(4), np.full(4, 1e-20))
    assert math.isfinite(z["max_rel"]) and z["max_rel"] > 1e6
    assert z["within_5e-3"] == 0.0


def test_nan_position_mismatch_fails_even_when_values_agree():
    a = rng(3).standard_normal(10).astype(np.float32)
    b = a.copy()
    a[2] = np.nan
    b[3] = np.nan
    m = tensor_metrics(a, b)
    assert m["nan_ref"] == 1 and m["nan_got"] == 1
    assert m["nonfinite_match"] is False and m["nonfinite_mismatches"] == 2
    # the value metrics, over positions finite on both sides, are perfect ...
    assert m["max_abs"] == 0 and m["cosine"] == 1.0
    # ... yet the entry fails on NaN placement alone
    passed, reason = judge(m, "hidden", Thresholds("bf16"))
    assert not passed
    assert reason.startswith("NaN/Inf positions differ at 2 positions")
    assert "ref: 1 NaN" in reason and "got: 1 NaN" in reason


def test_matching_nonfinite_positions_count_as_within_but_still_fail():
    a = np.array([1.0, np.nan, np.inf, -np.inf, 2.0])
    m = tensor_metrics(a, a.copy())
    assert m["nonfinite_match"] is True
    assert m["nan_ref"] == 1 and m["inf_ref"] == 2
    assert m["within_1e-3"] == 1.0
    assert m["max_abs"] == 0 and m["cosine"] == 1.0     # over the 2 positions finite on both sides
    assert m["finite_compared"] == 2
    # Issue 11: NaN / Inf fails by itself, even where both sides agree on the positions
    # (this test asserted a pass before).
    passed, reason = judge(m, "hidden", "fp32")
    assert not passed
    assert reason == ("NaN/Inf at the same positions on both sides "
                      "(ref: 1 NaN, 2 Inf of 5 at [1], [2], [3] | got: 1 NaN, 2 Inf of 5 at [1], [2], [3])")
    # +inf against -inf at the same position is a mismatch
    b = a.copy()
    b[2] = -np.inf
    m2 = tensor_metrics(a, b)
    assert m2["nonfinite_match"] is False
    assert m2["within_1e-3"] == pytest.approx(4 / 5)
    assert judge(m2, "hidden", "fp32")[0] is False


def test_bfloat16_and_float16_inputs_are_upcast():
    np_dtype = pytest.importorskip("mindspore.common.np_dtype")
    bf16 = np_dtype.bfloat16
    ref = np.array([1.0, 2.0, 3.0, -0.5], dtype=bf16)
    got = np.array([1.0, 2.0, 3.015625, -0.5], dtype=bf16)   # one bf16 ulp at 3
    m = tensor_metrics(ref, got)
    assert m["dtype_ref"] == "bfloat16"
    assert m["max_abs"] == 0.015625
    assert m["max_abs_index"] == [2]
    # mixing dtypes: bf16 reference, float32 candidate
    m2 = tensor_metrics(ref, np.array([1, 2, 3, -0.5], np.float32))
    assert m2["max_abs"] == 0 and m2["dtype_got"] == "float32"
    h = tensor_metrics(np.array([1.0, 2.0], np.float16), np.array([1.0, 2.001953125], np.float16))
    assert h["max_abs"] == pytest.approx(2 ** -9)
    assert canonical_dtype(bf16) == "bf16"
    lm = logits_metrics(np.array([[0.0, 1.0, 2.0]], dtype=bf16), np.array([[0.0, 1.0, 2.0]], dtype=bf16))
    assert lm["kl"] == 0.0 and lm["top1"] == 1.0


def test_shape_mismatch_is_a_failed_result_not_an_exception():
    m = tensor_metrics(np.zeros((2, 3)), np.zeros((3, 2)))
    assert m["error"] == "shape mismatch: ref (2, 3) vs got (3, 2)"
    passed, reason = judge(m, "hidden", "fp32")
    assert not passed and reason.startswith("shape mismatch")
    lm = logits_metrics(np.zeros((2, 5)), np.zeros((2, 6)))
    assert "error" in lm and lm["kl"] is None
    assert judge(lm, "logits", "fp32")[0] is False


def test_scalars_compare():
    m = tensor_metrics(np.float32(2.0), np.float32(2.5))
    assert m["shape"] == [] and m["max_abs"] == 0.5 and m["max_rel"] == pytest.approx(0.25)


def test_chunked_computation_matches_single_pass(monkeypatch):
    a = rng(4).standard_normal((6, 50)).astype(np.float32)
    b = a + rng(5).standard_normal((6, 50)).astype(np.float32) * 1e-3
    a[1, 7] = np.nan
    b[1, 7] = np.nan
    whole_t, whole_l = tensor_metrics(a, b), logits_metrics(a, b)
    monkeypatch.setattr(M, "CHUNK_ELEMENTS", 7)
    chunk_t, chunk_l = tensor_metrics(a, b), logits_metrics(a, b)
    for k, v in whole_l.items():
        if isinstance(v, float):
            # rel 1e-9: numpy's pairwise sums group by the buffers' alignment, which the allocator decides
            # (under mimalloc, as `make test` runs, kl moved by 1e-10 relative with this test run alone)
            assert chunk_l[k] == pytest.approx(v, rel=1e-9, abs=1e-300), k
        else:
            assert chunk_l[k] == v, k
    assert chunk_t["max_abs_index"] == whole_t["max_abs_index"]


# --------------------------------------------------------------------------- logits

def test_kl_of_identical_logits_is_zero_and_shift_invariant():
    x = rng(6).standard_normal((2, 4, 11))
    m = logits_metrics(x, x.copy())
    assert m["kl"] == 0.0 and m["kl_max"] == 0.0 and m["top1"] == 1.0
    assert m["positions"] == 8
    shifted = logits_metrics(x, x + 5.0)     # softmax is shift invariant per row
    assert shifted["kl"] == pytest.approx(0.0, abs=1e-14)
    assert shifted["top1"] == 1.0
    assert shifted["max_abs"] == pytest.approx(5.0)


def test_kl_known_value_and_numerical_stability():
    # p = (1/2, 1/2), q = (3/4, 1/4): KL = 1/2 ln(2/3) + 1/2 ln 2 = 1/2 ln(4/3)
    ref = np.array([[0.0, 0.0]])
    got = np.array([[math.log(3.0), 0.0]])
    assert logits_metrics(ref, got)["kl"] == pytest.approx(0.5 * math.log(4 / 3), rel=1e-12)
    # huge logits do not overflow
    big = np.array([[1000.0, 0.0, -1000.0]], np.float32)
    m = logits_metrics(big, big + np.float32(1e-3))
    assert math.isfinite(m["kl"]) and m["kl"] == pytest.approx(0.0, abs=1e-12)
    # masked (-inf) logits at the same positions are fine
    masked = np.array([[1.0, -np.inf, 2.0]])
    mm = logits_metrics(masked, masked.copy())
    assert mm["kl"] == 0.0 and mm["nonfinite_match"] is True
    # mass on a token the candidate masked out: infinite KL, and a failure
    inf_kl = logits_metrics(np.array([[1.0, 1.0]]), np.array([[1.0, -np.inf]]))
    assert inf_kl["kl"] == math.inf
    assert judge(inf_kl, "logits", "bf16")[0] is False


def test_top1_agreement_constructed():
    ref = np.zeros((4, 5))
    ref[np.arange(4), [0, 1, 2, 3]] = 1.0          # argmax 0,1,2,3
    got = ref.copy()
    got[2, 4] = 2.0                                 # position 2 now picks 4
    m = logits_metrics(ref[None], got[None])       # shape (1, 4, 5)
    assert m["top1"] == 0.75
    assert m["top1_mismatches"] == 1
    assert m["top1_first_mismatch"] == [0, 2]
    passed, reason = judge(m, "logits", Thresholds("bf16"))
    assert not passed and "top1 0.75 < 0.99" in reason


def test_logits_rows_with_nan_are_left_out_of_kl_and_top1():
    ref = np.array([[0.0, 1.0], [np.nan, 1.0], [2.0, 0.0]])
    m = logits_metrics(ref, ref.copy())
    assert m["positions"] == 2 and m["kl"] == 0.0 and m["top1"] == 1.0


# --------------------------------------------------------------------------- generation

def test_generation_metrics():
    same = generation_metrics([5, 6, 7], np.array([5, 6, 7]))
    assert same["first_diff_step"] is None and same["match_share"] == 1.0 and same["steps"] == 3
    diff = generation_metrics([[1, 2, 3, 4], [1, 2, 3, 4]], [[1, 2, 3, 4], [1, 2, 9, 4]])
    assert diff["first_diff_step"] == 2 and diff["diff_row"] == 1
    assert diff["ref_token"] == 3 and diff["got_token"] == 9
    assert diff["matching_prefix"] == 2 and diff["match_share"] == 0.5
    early_stop = generation_metrics([1, 2, 3], [1, 2])
    assert early_stop["first_diff_step"] == 2 and early_stop["got_token"] is None
    passed, reason = judge(diff, "generation", "fp32")
    assert not passed and reason.startswith("generation differs at step 2 of 4")
    assert judge(diff, "generation", "bf16") == (True, None)     # reported, not judged


# --------------------------------------------------------------------------- thresholds & judge

def test_threshold_defaults_are_ordered_by_precision():
    f32, f16, b16 = Thresholds("fp32"), Thresholds("float16"), Thresholds("bfloat16")
    assert (f32.dtype, f16.dtype, b16.dtype) == ("fp32", "fp16", "bf16")
    assert f32.hidden.max_abs == 1e-5 and f32.logits.max_abs == 1e-5
    assert f32.hidden.cosine == 0.99999
    assert b16.hidden.max_abs is None and b16.hidden.cosine == 0.999
    assert b16.logits.top1 == 0.99
    for kind in ("hidden", "logits", "grad", "param_after_step"):
        assert f32.bounds(kind).cosine > f16.bounds(kind).cosine > b16.bounds(kind).cosine
    assert f32.logits.kl < f16.logits.kl < b16.logits.kl
    assert f32.logits.top1 >= f16.logits.top1 >= b16.logits.top1
    # stricter than the field: HF cross-framework max abs 1e-5, msprobe cosine 0.99
    assert f32.hidden.max_abs <= 1e-5 and b16.hidden.cosine > 0.99
    assert f32.generation.match == 1.0 and b16.generation.match is None


def test_dtype_aliases_and_unknown_dtype():
    assert canonical_dtype("torch.bfloat16") == "bf16"
    assert canonical_dtype(np.float32) == "fp32"
    assert canonical_dtype(np.dtype("float16")) == "fp16"
    assert canonical_dtype("Float32") == "fp32"          # MindSpore's spelling
    with pytest.raises(MigrateError, match="unknown dtype"):
        Thresholds("int8")


def test_max_abs_bound_scales_with_peak():
    b = Thresholds("fp32").hidden
    assert b.max_abs_bound(0.5) == 1e-5                  # unit scale: absolute 1e-5
    assert b.max_abs_bound(300.0) == pytest.approx(3e-3)  # 1e-5 of the peak beyond that
    assert Bounds().max_abs_bound(1.0) is None


def test_judge_reasons_name_metric_and_value():
    a = rng(7).standard_normal(1000)
    b = a + rng(8).standard_normal(1000) * 0.4          # cosine ~ 0.93
    m = tensor_metrics(a, b)
    passed, reason = judge(m, "hidden", Thresholds("fp32"))
    assert not passed
    first = reason.split("; ")[0]
    assert first == f"cosine {fmt_cosine(m['cosine'])} < 0.99999"
    assert 0.9 < m["cosine"] < 0.95
    assert "max_abs" in reason and "× max|ref|" in reason
    # bf16: no max-abs bound, only cosine
    assert judge(m, "hidden", "bf16")[1].startswith(f"cosine {fmt_cosine(m['cosine'])} < 0.999; within 5‰")
    # a NaN metric is a failure
    assert judge({"cosine": math.nan, "max_abs": 0.0}, "hidden", "fp32")[0] is False
    # absent metrics are not checked
    assert judge({"cosine": 1.0}, "logits", "fp32") == (True, None)


def test_gradient_criterion_is_relative_to_the_peak():
    th = Thresholds("fp32")
    g = rng(9).standard_normal((64, 64)) * 1e-3         # typical small-model gradient scale
    peak = np.abs(g).max()
    ok = tensor_metrics(g, g + 1e-5 * peak * np.sign(g))     # 1e-5 of the peak
    assert judge(ok, "grad", th) == (True, None)
    # 1e-6 absolute would pass HF's 1e-5 bar but is ~3e-4 of the gradient's peak
    bad = g.copy()
    bad[0, 0] += 1e-6
    passed, reason = judge(tensor_metrics(g, bad), "grad", th)
    assert not passed and reason.startswith("max_abs 1.00e-06 >")
    # numerically zero gradient: cosine (0 vs noise) is not judged, max abs is
    zero = tensor_metrics(np.zeros(16), np.full(16, 1e-9))
    assert zero["cosine"] == 0.0
    assert judge(zero, "grad", th) == (True, None)


def test_loss_is_judged_relatively_without_cosine():
    th = Thresholds("fp32")
    assert judge(tensor_metrics(np.float32(10.0), np.float32(10.00005)), "loss", th)[0] is True
    passed, reason = judge(tensor_metrics(np.float64(10.0), np.float64(10.001)), "loss", th)
    assert not passed and reason.startswith("max_abs") and "cosine" not in reason


def test_overrides():
    th = Thresholds("bf16").with_overrides(cosine=0.9999)
    assert th.hidden.cosine == th.grad.cosine == th.logits.cosine == 0.9999
    assert th.loss.cosine is None                      # cosine does not apply to a scalar loss
    th2 = Thresholds("fp32").with_overrides("logits", top1=0.9, kl=1e-3)
    assert th2.logits.top1 == 0.9 and th2.logits.kl == 1e-3 and th2.generation.top1 == 0.999
    # an explicit max_abs is taken literally: the peak-relative part is dropped
    th3 = Thresholds("fp32").with_overrides("hidden", max_abs=1e-4)
    assert th3.hidden.max_abs == 1e-4 and th3.hidden.max_abs_rel is None
    assert th3.hidden.max_abs_bound(1000.0) == 1e-4
    # None means "not given"
    assert Thresholds("fp32").with_overrides(max_abs=None, cosine=None) == Thresholds("fp32")
    cli = Thresholds("fp32").with_cli_overrides(["logits.top-1=0.95", "grad.max-abs=1e-6", "kl=inf"])
    assert cli.logits.top1 == 0.95 and cli.grad.max_abs == 1e-6 and cli.grad.max_abs_rel is None
    assert cli.logits.kl == math.inf and cli.hidden.kl is None
    for bad in (["cosine=1.5"], ["top1=x"], ["nonsense=1"], ["weights.cosine=0.9"], ["cosine"]):
        with pytest.raises(MigrateError):
            Thresholds("fp32").with_cli_overrides(bad)
    assert Thresholds.from_dict(cli.to_dict()) == cli
