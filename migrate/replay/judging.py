"""Two recorded steps paired through the keymap and judged in the order the step computes them.

Stages, in step order: forward activations per layer (micro-batch 1's forward, `probe.live`),
loss (each micro-batch), the accumulation (MindSpore's: each micro-batch's gradient added to the
accumulator as torch adds into the fp32 .grad, `ACCUM_REL`), gradients (the accumulators after
each micro-batch, backward order: lm_head first; bf16 / fp16: and each tensor's least-squares
scale on the golden's, `SCALE_Z`), the global norm, the clip factor, the lr, the
moments after the update, the updated parameters. Tensors are judged by the judge's `Report`
(`migrate diff`'s bounds for gradients and parameters after a step; moments as gradients,
divided by their peak, `to_peak`); the scalars by `Check`s whose bounds are set here. Golden
arrays are carried to the MindSpore names through the run's conversion plan
(`ConversionPlan.in_model_names`: moments and gradients transform like their parameters).

The clip factor is judged through the epsilon it implies, max_norm / factor - norm, each side with
its own norm and its own measured factor: the factor itself differs between the two sides by their
norms' rounding (1e-7) as much as by a missing 1e-6 (`clip_no_eps`), the implied epsilon does not.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from migrate.judge import Check, fmt_num
from migrate.judge.report import Report
from migrate.judge.thresholds import Thresholds
from migrate.replay.recording import StepRecording

STAGES = ("forward", "loss", "accumulation", "gradients", "grad norm", "clip", "lr", "moments", "parameters")
MOMENTS = ("exp_avg", "exp_avg_sq")
# Scalars of one step replayed from the same state: (fp32, bf16/fp16) bounds
NORM_REL = {"fp32": 1e-5, "low": 5e-2}
LR_REL = 1e-12            # the host computes the lr in doubles on both sides (compare's `lr` rule)
CLIP_EPS_FLOOR = 2.5e-7   # |implied eps difference|, at least; a missing torch epsilon is 1e-6
FP32_ULP = 2.0 ** -23     # the clip factor is an fp32 number: its rounding, times the norm, is the eps noise
# A parameter's update: (||B - A|| / ||A||, cosine), fp32 and bf16/fp16. AdamW's m/sqrt(v) turns a gradient
# near zero into a move of up to lr whichever way its rounding falls, so single elements of a correct step
# differ by 3e-4 of the peak in fp32 (the test model's embedding at step 2) and by 0.125 of it in bf16 (an
# up_proj element; the peak-relative max abs bound of 0.1 failed that correct step): the whole tensor's
# relative L2 error holds instead (bf16, clean: 6.2e-2 at most, on an 8-element bias; cosine 0.998). A
# fault moves the whole tensor (decayed norms: cosine 0.23) or scales it (no bias correction: x0.2).
UPDATE_BOUNDS = {"fp32": (1e-2, 0.9999), "low": (0.25, 0.99)}
# MindSpore's accumulation of each micro-batch's gradient, against the golden's rule (torch adds it into
# the fp32 .grad): the largest |acc - fp32(previous + added)| over |previous + added|, per tensor. One fp32
# add rounds once, and numpy's float32 add is the device's, bit for bit: correct runs measure 0 (every one of
# 70 tensor x micro-batch pairs, bf16 test run, step 3; fp32 the same). Accumulating in bf16 rounds each
# operand and the sum to 8 bits (fault bf16_accum): 41 of those 70 part, median 3.3e-3, up to 0.65 where the
# sum cancels; in fp32 runs the head's gradient 3.9e-3. The bound is one fp32 ulp, 2^-23, far from both.
ACCUM_REL = 2.0 ** -23
# bf16 / fp16: one tensor's gradient rescaled (fault head_grad_scale: lm_head x 1.01) stays inside the gradient
# bounds, which a correct bf16 step's rounding fills (relative L2 up to 3.6e-2 on the test model). Fitted per
# tensor, got ~ s x ref, the scale holds to its standard error instead. Measured on correct bf16 replays of the
# test model (bias variant, 35 tensors x 2 micro-batches a step; seed 5 steps 1-4, seed 11 steps 1-6: 700
# fits): |s - 1| up to 2.4e-2 (a 16-element attention bias, at 4.9 standard errors), at most 22.7 standard
# errors (seed 5; seed 11: 21.2), on 2048-element MLP weights whose |s - 1| is 1.1e-3 to 1.8e-3; lm_head at
# most 3.2e-4, 14 standard errors (steps 1-2: exact). The fault: lm_head s - 1 = 1.01e-2 at 647 standard
# errors, 13x the bound; the bound is 2.2x the largest correct figure. A tensor of few elements has a wide
# standard error: a 1 % scale is caught where it stands 50 standard errors above the noise, not on every tensor.
# Measured on a tiny model only: a larger tensor's standard error shrinks while the states' own drift does not.
SCALE_Z = 50.0
SCALE_FLOOR = 2e-3   # |s - 1| passes below this whatever its standard error (bit-exact steps have se 0)


@dataclass
class Item:
    """One judged quantity, in step order."""

    stage: str
    what: str            # "exp_avg_sq of model.layers.1.mlp.down_proj.weight"
    passed: bool
    figure: str          # the figure that matters, in words
    entry: object = None  # the Report's entry (tensors)
    check: Check | None = None  # scalars


def judge_step(dtype: str, plan, names: list, golden: StepRecording, ms: StepRecording, forward: list,
               max_norm: float | None, inv_scales=(1.0, 1.0)) -> tuple[Report, list[Item]]:
    """(the report, every item in step order). names: the MindSpore trained parameters in the model's
    order (embedding first); plan: the run's ConversionPlan; forward: `probe.live.Compared` of micro-batch 1."""
    rel, cosine = UPDATE_BOUNDS["fp32" if dtype == "fp32" else "low"]
    bounds = Thresholds(dtype).with_overrides("state", max_abs=math.inf, rel_l2=rel, cosine=cosine)
    report = Report(dtype=dtype, inputs="the rows of the replayed step (run order)", ref_label="golden",
                    got_label="MindSpore", thresholds=bounds)
    items: list[Item] = []
    hf_name = {n: " + ".join(plan.sources.get(n, (n,))) for n in names}
    backward = list(reversed(names))  # lm_head first: the order backprop reaches them

    for c in forward:
        if c.kind == "loss":
            continue  # the model's own loss on its own labels; the step's loss is judged below
        entry = report.add(c.name, c.ref, c.got, kind=c.kind, layer=c.layer, block=c.block or c.kind, exact=c.exact)
        items.append(_item("forward", entry.location, entry))
    for m, (a, b) in enumerate(zip(golden.losses, ms.losses, strict=True)):
        entry = report.add(f"loss, micro-batch {m + 1}", np.array(a), np.array(b), kind="loss")
        items.append(_item("loss", f"loss of micro-batch {m + 1}", entry))
    items += _accumulation(ms, backward, hf_name)
    for m, (ga, gb) in enumerate(zip(golden.grads, ms.grads, strict=True)):
        ref = plan.in_model_names(ga)
        for n in backward:
            what = f"gradient of {hf_name[n]} after micro-batch {m + 1}"
            entry = report.add(what, ref[n], gb[n], kind="grad", block=what)
            items.append(_item("gradients", what, entry))
        if dtype != "fp32":  # bf16 / fp16: a tensor's gradient rescaled hides in the rounding (`SCALE_Z`)
            items.append(_scales(m, [(hf_name[n], ref[n], gb[n]) for n in backward]))
    dt = "fp32" if dtype == "fp32" else "low"
    items.append(_scalar("grad norm", "global gradient norm (before clipping)", golden.grad_norm, ms.grad_norm,
                         NORM_REL[dt]))
    if max_norm:
        items.append(_clip(golden, ms, max_norm, inv_scales))
    items.append(_scalar("lr", "lr of the step", golden.lr, ms.lr, LR_REL))
    for key in MOMENTS:
        ref = plan.in_model_names(golden.moments.get(key, {}))
        for n in backward:
            what = f"{key} of {hf_name[n]}"
            a, b = to_peak(ref[n], ms.moments[key][n])
            entry = report.add(what, a, b, kind="grad", block=what)
            items.append(_item("moments", what, entry))
    ref, ref_before = plan.in_model_names(golden.params), plan.in_model_names(golden.params_before)
    for n in backward:  # the update each side applied: drift carried in the loaded state cancels
        what = f"update of {hf_name[n]}"
        a, b = to_peak(ref[n].astype(np.float64) - ref_before[n], ms.params[n].astype(np.float64) - ms.params_before[n])
        entry = report.add(what, a, b, kind="state", block=what)  # held by rel_l2 and cosine (UPDATE_BOUNDS)
        items.append(_item("parameters", what, entry))
    report.checks = [it.check for it in items if it.check is not None]  # part of its verdict, its own table
    report.finalize()
    return report, items


def _accumulation(ms: StepRecording, backward: list, hf_name: dict) -> list[Item]:
    """Per micro-batch and tensor (backward order): did MindSpore add the gradient it computed to the
    accumulator as torch adds into .grad, one fp32 add (`ACCUM_REL`)? Nothing when the side handed no
    added gradients."""
    if ms.ranks:  # a dp replay: each rank accumulated its own micro-batches
        return [it for r, (grads, added) in enumerate(ms.ranks)
                for it in _accumulated(grads, added, backward, hf_name, f"rank {r}'s ")]
    return _accumulated(ms.grads, ms.added, backward, hf_name)


def _accumulated(grads: list, adds: list, backward: list, hf_name: dict, whose: str = "") -> list[Item]:
    items = []
    previous = None
    for m, (acc, added) in enumerate(zip(grads, adds, strict=True)):
        if added is None:
            return []
        for n in backward:
            before = np.zeros_like(added[n]) if previous is None else previous[n]
            want = (before.astype(np.float32) + added[n].astype(np.float32)).astype(np.float64)
            got = acc[n].astype(np.float64)
            err = np.abs(got - want)
            scale = np.maximum(np.abs(want), np.finfo(np.float32).tiny)
            rel = float(np.max(err / scale)) if err.size else 0.0
            what = f"accumulation of {whose}micro-batch {m + 1}'s gradient into {hf_name[n]}"
            passed = bool(rel <= ACCUM_REL)
            check = Check("accumulation", f"{what}: max |acc - fp32 sum| / |fp32 sum|", value=rel, limit=ACCUM_REL,
                          passed=passed)
            figure = (f"largest error {fmt_num(rel)} of the fp32 sum (bound {fmt_num(ACCUM_REL)}, one fp32 ulp; "
                      f"bf16 rounds at {fmt_num(2.0 ** -9)})")
            items.append(Item("accumulation", what, passed, figure, check=check))
        previous = acc
    return items


def _scales(m: int, pairs: list) -> Item:
    """Micro-batch m's gradients, tensor by tensor: the least-squares scale s of MindSpore's on the
    golden's (got ~ s x ref), |s - 1| held to SCALE_Z of its standard error (the residual's, over the
    tensor), at least SCALE_FLOOR. One item naming the tensor furthest out of its bound."""
    worst = None  # (|s - 1| / limit, name, s, se, limit)
    for name, ref, got in pairs:
        a, b = np.asarray(ref, np.float64).ravel(), np.asarray(got, np.float64).ravel()
        den = float(a @ a)
        if den == 0.0 or a.size < 2 or not np.isfinite(den) or not np.all(np.isfinite(b)):
            continue
        s = float(a @ b) / den
        r = b - s * a
        se = math.sqrt(float(r @ r) / (a.size - 1) / den)
        limit = max(SCALE_Z * se, SCALE_FLOOR)
        if worst is None or abs(s - 1) / limit > worst[0]:
            worst = (abs(s - 1) / limit, name, s, se, limit)
    label = f"gradient scales after micro-batch {m + 1}"
    if worst is None:
        check = Check("grad_scale", label, passed=None, detail="no finite non-zero gradient to fit")
        return Item("gradients", label, True, "not measured", check=check)
    ratio, name, s, se, limit = worst
    passed = ratio <= 1.0
    check = Check("grad_scale", f"{label}: the furthest, {name}: |s - 1| of got ~ s x ref", value=abs(s - 1),
                  limit=limit, passed=passed)
    what = f"scale of the gradient of {name} after micro-batch {m + 1}" if not passed else label
    figure = (f"s {s:.6f}: |s - 1| {fmt_num(abs(s - 1))} {'>' if not passed else '<='} {fmt_num(limit)} "
              f"({SCALE_Z:g} standard errors of {fmt_num(se)}, at least {fmt_num(SCALE_FLOOR)})")
    return Item("gradients", what, passed, figure, check=check)


def to_peak(ref: np.ndarray, got: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Both arrays divided by the reference's peak magnitude. A second moment is a squared gradient
    (1e-8 and below in a small model), under every absolute floor of the judge's bounds: scaled to
    its peak, the relative bounds and the cosine judge it (a pure rescaling, the same for both sides)."""
    a = np.asarray(ref, np.float64)
    finite = np.abs(a[np.isfinite(a)])
    peak = float(finite.max()) if finite.size else 0.0
    if peak == 0.0:
        return ref, got
    return a / peak, np.asarray(got, np.float64) / peak


def _item(stage: str, what: str, entry) -> Item:
    m = entry.metrics
    figure = entry.headline()
    peak = m.get("ref_max_abs")
    if not entry.passed and m.get("max_abs") is not None and peak:
        figure += f" (rel {fmt_num(m['max_abs'] / peak)} of its peak)"
    return Item(stage, what, entry.passed, figure, entry=entry)


def _rel(a: float | None, b: float | None) -> float:
    if a is None or b is None:
        return math.nan
    return abs(b - a) / abs(a) if a else abs(b - a)


def _scalar(stage: str, label: str, a, b, limit: float) -> Item:
    rel = _rel(a, b)
    passed = bool(rel <= limit)
    check = Check(stage.replace(" ", "_"), f"{label} rel diff", value=rel, limit=limit, passed=passed)
    return Item(stage, label, passed, f"{fmt_num(a)} vs {fmt_num(b)} (rel {fmt_num(rel)}, bound {fmt_num(limit)})",
                check=check)


def _clip(golden: StepRecording, ms: StepRecording, max_norm: float, inv_scales) -> Item:
    fa, fb = golden.clip_factor(inv_scales[0]), ms.clip_factor(inv_scales[1])
    label = "clip factor"
    if fa is None or fb is None or golden.grad_norm is None or ms.grad_norm is None:
        check = Check("clip", label, passed=None, detail="not measured (a skipped step)")
        return Item("clip", label, True, "not measured", check=check)
    if fa >= 1.0 - 1e-6 and fb >= 1.0 - 1e-6:  # neither side clipped: the factors are 1
        rel = _rel(fa, fb)
        check = Check("clip", f"{label} (no clipping)", value=rel, limit=1e-6, passed=rel <= 1e-6)
        return Item("clip", label, check.passed, f"{fa:.9g} vs {fb:.9g}", check=check)
    eps_a, eps_b = max_norm / fa - golden.grad_norm, max_norm / fb - ms.grad_norm
    limit = max(CLIP_EPS_FLOOR, 2 * FP32_ULP * max(golden.grad_norm, ms.grad_norm))
    diff = abs(eps_a - eps_b)
    check = Check("clip", f"{label}: the epsilon it implies, max_norm / factor - norm", value=diff, limit=limit,
                  passed=diff <= limit)
    figure = (f"{fa:.9g} vs {fb:.9g}: implied epsilon {fmt_num(eps_a)} vs {fmt_num(eps_b)} "
              f"(differ by {fmt_num(diff)}, bound {fmt_num(limit)})")
    return Item("clip", label, check.passed, figure, check=check)


def summary_line(step: int, items: list[Item]) -> str:
    """The one line that names the first quantity that parts, in step order."""
    first = next((it for it in items if not it.passed), None)
    stages = [s for s in STAGES if any(it.stage == s for it in items)]
    if first is None:
        return f"step {step}: every quantity agrees ({', '.join(stages)})"
    agree = stages[:stages.index(first.stage)]
    later = sum(1 for it in items if not it.passed) - 1
    head = f"step {step}: " + (f"{_words(agree)} agree; " if agree else "")
    tail = f"; {later} more part after it" if later else ""
    return f"{head}{first.what} parts first: {first.figure}{tail}"


def _words(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
