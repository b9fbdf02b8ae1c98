"""The rules of `migrate compare`: each makes the judge's `Check`s from the paired curves.

Pairing
-------
Runs are paired by ``step``. Steps logged by one run only are listed and are a
failure ("steps"), except with ``allow_prefix=True`` when the shorter run is a
prefix of the longer one -- one side simply stopped early (or is still
running) and every step up to its last is present on both sides; a step
missing in the middle is always a failure. All judgements use the paired
steps only.

Per step (golden is the baseline; rel = |ms - golden| / |golden|)
---------
loss abs and rel diff, lr rel diff, grad_norm rel diff. A value null on one
side only counts as an infinite difference; null on both sides (both
overflowed) is agreement and is left out of means and maxima. grad_norm of
steps skipped on both sides is left out. ``skipped`` flags must agree step by
step, and so must ``loss_scale`` and ``tokens`` where both logs have them
(``tokens`` differing means the two runs did not see the same batches).

Rules (each names the first step out of tolerance)
-----
``first``  loss rel diff at the first paired step  (one forward pass on the
           same converted weights and the same batch); its bound takes its
           scale from the golden's own rounding where the golden measured it
           (see "First-step scale" below);
``max``    per-step loss rel diff, every step;
``mean``   mean loss rel diff over the run; its first step is the one where
           the running mean first exceeds the bound;
``lr``     per-step lr rel diff (both sides evaluate the same HF formula in
           Python floats, so fp32 and low precision alike get 1e-12; a side
           that logs a float32 tensor's value needs ``lr=1e-7``);
``grad_mean`` / ``grad_max``  grad_norm rel diff, mean (running) and per step;
           at least K x the golden's own step-1 grad-norm error vs float64,
           shown in the noise column where there is no noise run;
``band``   bf16 / fp16 with a noise run only -- see below;
``drift``  fp32 only: the loss rel diff must not stay on one side of the golden,
           beyond ``drift`` x its first steps' level (at least one fp32 ulp,
           and at least the golden's own first-step error vs float64), for
           ``drift_window`` steps in a row (`drift.drift_check`);
``clip``   when both logs have grad_norm_clipped (`clip.clip_check`);
``hparams`` the two runs' effective_hparams.json (beside each metrics.jsonl,
           or ``hparams=(golden_file, ms_file)``): any knob both record that
           differs fails, named with both values (`effective_hparams`); without
           both files the check is skipped and a note says so.

First-step scale (`reference`)
----------------
The fixed fp32 bound 1e-6 was calibrated on 2-layer random models; on SmolLM2-135M
(30 layers) correct runs differ by 1.8-2.8e-6 at step 1 -- torch's own fp32 loss
is 1.7e-6 from exact there. So golden/train_torch.py measures step 1 against a
float64 twin of itself and logs it (run.yaml ``reference: auto | fp64 | off``);
its loss error e is the plain difference or, where that is lucky, the mean over
the step's sequences of each one's |error| (a bound on it). Then

    first = max(tol.first, K x e),  K = reference_k = 4

and the check's detail, the noise column and a note say where the bound came
from. Measured on SmolLM2-135M (seq 128, 2 x 2 micro-batches, first step):

    fp32 seed 42     MindSpore vs golden 2.06e-6   golden vs float64 1.69e-6   ratio 1.22   bound 6.8e-6
    fp32 seed 7      MindSpore vs golden 1.80e-6   golden vs float64 1.53e-6   ratio 1.18   bound 6.1e-6
    bf16 seed 42     MindSpore vs golden 3.2e-4    golden vs float64 1.0e-3    ratio 0.32   bound 5e-3 (fixed)
    tiny 6 layers    MindSpore vs golden 0         golden vs float64 4.1e-7    ratio 0      bound 1.6e-6
    (width 64, weights at std 0.5: tests/test_compare_reference.py)

MindSpore's own fp32 loss is 3.8e-6 from float64 there, 2.2x torch's (same sign, so
they sit 1.2x apart); of opposite signs they would be 3.2x apart, and K = 4 holds
that. The floor tol.first holds the few ulps two loss reductions differ by on tiny
models, where torch's own error is 3e-8 and the two sides 4e-7 apart. A step-1
fault 10x the bound fails (tests/test_compare_reference.py). Without a reference
(foreign logs, older golden logs, ``reference: off``) the fp32 bound is the
depth-scaled fallback tol.first x max(1, L / 4), L the decoder layers in
effective_hparams.json (7.5e-6 on SmolLM2), named as the fallback. The grad-norm
bounds are at least K x the golden's own step-1 grad-norm error (SmolLM2 fp32:
7.5e-5, MindSpore 6.8e-5 from the golden), and the drift level is at least e.
``reference_k = 0`` keeps every bound fixed; a bound set explicitly (``--tol-first``)
is kept as set.

Noise run (``noise_path``): the golden run again with another data / dropout
seed, or with the same seed (it then measures nondeterminism: zero for CPU
fp32). Its own figures against the golden (first, mean, max loss rel diff,
grad mean / max) are reported next to MindSpore's; a bound tighter than the
baseline's own noise is flagged in the notes (MindFormers: compare the
baseline with itself first to learn its noise). In bf16 / fp16 it also sets
the band rule:

    r_t = |ms_t - golden_t| / |golden_t|,   n_t = |noise_t - golden_t| / |golden_t|
    R_t = mean of r over the ``window`` paired steps ending at t   (trailing)
    N_t = mean of n over the 4 x ``window`` paired steps centred on t
    pass at t  iff  R_t <= max(band_k x N_t, band_floor)

judged at every step with a full trailing window (a run shorter than the
window is judged once, at its last step, over all of it). The noise band is
averaged over a wider, centred window because it is the reference: a noisy
short-window estimate of it would fail a MindSpore run that is itself just
another noise sample (on i.i.d. noise, k = 2 with these windows fails such a
run ~0.1 % of the time; a systematic offset of 3x the noise always fails).
``band_floor`` is the dtype's unit roundoff, so a zero band (a deterministic
rerun) never demands more than one rounding unit. With a noise run the
low-precision ``max``, ``grad_mean`` and ``grad_max`` bounds widen to
band_k x the noise run's own figure where that is larger; ``first``, ``mean``
and ``lr`` stay fixed. In fp32 the noise run is reported and plotted but
does not change the verdict. Without one, bf16 / fp16 fall back to the fixed
bounds above.

Which seed to vary: a noise run with another data seed reads other batches,
so n_t also holds the batch-to-batch spread of the loss, which MindSpore --
reading the golden's batches -- does not have. The band is then generous,
never tight: measured on a tiny Llama over 200 bf16 steps
(tests/test_bf16_band.py), golden vs data seed 6 averages 2.6e-2 per step,
MindSpore vs golden 2.2e-4 (worst window at 0.7 % of its allowance), and
AdamW without bias correction reaches 330 %. Differencing window-smoothed
curves instead would shrink that band ~3.5x, but with k = 2 it fails a
MindSpore run that is itself another sample (dropout on) most of the time
in simulation, so the windowed mean of |r| stays.
"""
from __future__ import annotations

import math

import numpy as np

from migrate.compare.effective_hparams import HparamsCheck
from migrate.compare.metrics_log import Run
from migrate.compare.result import CompareResult
from migrate.compare.stats import (
    at_steps,
    centred_mean,
    first_over,
    is_prefix,
    nanmax,
    nanmean,
    rel_diff,
    running_mean,
)
from migrate.judge import Check, fmt_figure

__all__ = ["hparams_rule", "coverage_rule", "agreement_rules", "nonfinite_note", "measure_noise", "band_factor",
           "loss_rules", "lr_rule", "grad_rules", "noise_notes"]

_NOISE_WINDOW_FACTOR = 4


def _fail_steps(res: CompareResult, key: str, mask: np.ndarray) -> None:
    res.fail_steps[key] = [int(s) for s in res.steps[mask]]


def hparams_rule(hp: HparamsCheck, res: CompareResult) -> Check:
    """Any knob both effective_hparams.json record that differs fails the comparison."""
    label = f"effective hyperparameters ({len(hp.rows)} knobs)"
    if hp.skipped:
        res.notes.append(hp.skipped)
        return Check("hparams", label, value=math.nan, limit=0, detail=hp.skipped)
    # A MindSpore file written when a fault rebuilt the live objects says from which step they differ
    step = hp.from_step if not hp.passed else None
    return Check("hparams", label, value=len(hp.differing), limit=0, passed=hp.passed, step=step,
                 detail="" if hp.passed else hp.reason())


def coverage_rule(golden: Run, ms: Run, res: CompareResult) -> list[Check]:
    """``steps``: steps logged by one run only fail, unless allow_prefix accepts a prefix."""
    only_golden, only_ms = res.only_golden, res.only_ms
    if not (only_golden or only_ms):
        return []
    prefix = is_prefix(ms.steps, golden.steps) or is_prefix(golden.steps, ms.steps)
    parts = []
    if only_golden:
        parts.append(f"{len(only_golden)} only in golden ({_ranges(only_golden)})")
    if only_ms:
        parts.append(f"{len(only_ms)} only in MindSpore ({_ranges(only_ms)})")
    ok = res.allow_prefix and prefix
    hint = "" if ok or not prefix else " (a prefix: allow_prefix / --allow-prefix accepts it)"
    check = Check("steps", "steps logged on one side only", value=len(only_golden) + len(only_ms),
                  limit=0, passed=ok, step=None if ok else min(only_golden + only_ms),
                  detail="steps differ: " + "; ".join(parts) + hint)
    if ok:
        res.notes.append("compared the common prefix only: " + "; ".join(parts))
    res.fail_steps["steps"] = [] if ok else sorted(only_golden + only_ms)
    return [check]


def agreement_rules(golden: Run, ms: Run, res: CompareResult) -> list[Check]:
    """``tokens``, ``skipped`` and ``loss_scale``: exact agreement step by step, where logged."""
    steps, dt, sg, sm = res.steps, res.dtype, res.skipped_golden, res.skipped_ms
    checks = []
    if golden.tokens is not None and ms.tokens is not None:
        checks.append(_same_every_step(
            res, "tokens", "tokens seen", at_steps(golden, steps, golden.tokens), at_steps(ms, steps, ms.tokens),
            lambda step, g, m: f"tokens differ at step {step} (golden {_fmt_int(g)}, MindSpore {_fmt_int(m)}): "
                               "the runs saw different batches"))
    if golden.skipped is not None or ms.skipped is not None or dt == "fp16":
        bad = sg != sm
        first = int(steps[np.argmax(bad)]) if bad.any() else None
        checks.append(Check("skipped", "fp16 skipped-step flags", value=int(bad.sum()), limit=0,
                            passed=not bad.any(), step=first, detail="" if not bad.any() else
                            f"skipped flags differ at {int(bad.sum())} step(s), first {first} "
                            f"(golden {bool(sg[np.argmax(bad)])}, MindSpore {bool(sm[np.argmax(bad)])})"))
        _fail_steps(res, "skipped", bad)
        for run, label in ((golden, "golden"), (ms, "MindSpore")):
            if run.skipped is None and dt == "fp16":
                res.notes.append(f"the {label} log has no 'skipped' flags; its steps count as not skipped")
    if golden.loss_scale is not None and ms.loss_scale is not None:
        checks.append(_same_every_step(
            res, "loss_scale", "fp16 loss scale", at_steps(golden, steps, golden.loss_scale),
            at_steps(ms, steps, ms.loss_scale),
            lambda step, g, m: f"loss scale differs at step {step} (golden {g:g}, MindSpore {m:g})"))
    return checks


def nonfinite_note(res: CompareResult) -> None:
    """Say where the loss is non-finite on both sides (a NaN that reached the weights under health
    policy warn): agreement, left out of the loss rules, but not silently."""
    both = ~np.isfinite(res.loss_golden) & ~np.isfinite(res.loss_ms)
    if both.any():
        steps = [int(s) for s in res.steps[both]]
        res.notes.append(f"loss non-finite on both sides at {len(steps)} step{'s' if len(steps) != 1 else ''} "
                         f"({_ranges(steps)}): they agree there; the loss rules judge the other steps")


def _same_every_step(res: CompareResult, key: str, label: str, golden: np.ndarray, ms: np.ndarray,
                     describe) -> Check:
    """A column both logs must hold alike at every paired step (absent on both sides is alike);
    `describe(step, golden value, MindSpore value)` words the first difference."""
    bad = (golden != ms) & ~(np.isnan(golden) & np.isnan(ms))
    first = int(res.steps[np.argmax(bad)]) if bad.any() else None
    i = int(np.argmax(bad))
    _fail_steps(res, key, bad)
    return Check(key, label, value=int(bad.sum()), limit=0, passed=not bad.any(), step=first,
                 detail="" if not bad.any() else describe(first, golden[i], ms[i]))


def measure_noise(noise: Run, res: CompareResult) -> None:
    """The noise run against the golden: its per-step rel diff, the centred band, its own figures
    (``res.noise_figures``) and what they say about the noise run (notes)."""
    steps, lg, gg, rg, tol, dt = res.steps, res.loss_golden, res.grad_golden, res.lr_golden, res.tolerances, res.dtype
    ln = at_steps(noise, steps, noise.loss)
    covered = np.isin(steps, noise.steps)
    nr = rel_diff(ln, lg)
    nr[~covered] = np.nan
    ngr = rel_diff(at_steps(noise, steps, noise.grad_norm), gg)
    ngr[~covered] = np.nan
    nlr = rel_diff(at_steps(noise, steps, noise.lr), rg)
    nlr[~covered] = np.nan
    nband = centred_mean(nr, _NOISE_WINDOW_FACTOR * tol.window)
    res.loss_noise, res.noise_rel, res.noise_band = ln, nr, nband
    first_cov = np.flatnonzero(covered)
    res.noise_figures = {
        "path": str(noise.path), "steps": len(noise), "covered_steps": int(covered.sum()),
        "first": float(nr[first_cov[0]]) if len(first_cov) else math.nan,
        "mean": nanmean(nr), "max": nanmax(nr), "lr_max": nanmax(nlr),
        "grad_mean": nanmean(ngr), "grad_max": nanmax(ngr),
        "band_mean": nanmean(nband),
    }
    if not covered.all():
        res.notes.append(f"the noise run covers {int(covered.sum())} of {len(steps)} paired steps "
                         f"({noise.span()}); the band is judged only there")
    if covered.any() and np.nanmax(np.where(np.isnan(nr), 0, nr)) == 0:
        res.notes.append("the noise run's loss equals the golden's at every step (a deterministic rerun): "
                         "it measures nondeterminism only"
                         + (f"; the band is just the {dt} floor {fmt_figure(tol.band_floor)} -- rerun the golden "
                            "with another data or dropout seed to measure real noise" if tol.low_precision
                            else ""))
    if res.noise_figures["lr_max"] > 0 and res.noise_figures["lr_max"] > tol.lr:
        res.notes.append(f"the noise run's lr differs from the golden's (max rel "
                         f"{fmt_figure(res.noise_figures['lr_max'])}): it was not run with the same schedule")


def band_factor(res: CompareResult, has_noise: bool) -> float | None:
    """band_k where the band rule applies (low precision with a noise run), else None;
    band_k = inf disables the band rule and the widening by the noise run."""
    tol = res.tolerances
    k = tol.band_k if tol.low_precision and has_noise and tol.band_k is not None else None
    return None if k is not None and math.isinf(k) else k


def _widened(res: CompareResult, k: float | None, key_tol: float, noise_key: str) -> float:
    nf = res.noise_figures
    if k is None or not math.isfinite(nf.get(noise_key, math.nan)):
        return key_tol
    return max(key_tol, k * nf[noise_key])


def loss_rules(res: CompareResult, k: float | None) -> list[Check]:
    """``first``, ``max``, ``band`` (with a noise run in low precision) and ``mean``."""
    steps, loss_rel, tol, nf = res.steps, res.loss_rel, res.tolerances, res.noise_figures
    checks = []
    i0 = 0
    v0 = float(loss_rel[i0])
    over = v0 > tol.first
    label = "first-step loss rel diff"
    source = res.reference.first_source() if res.reference is not None else ""
    detail = (f"{label} {fmt_figure(v0)} > {fmt_figure(tol.first)} ({source})" if over and source else source)
    checks.append(Check("first", label, value=v0, limit=tol.first, passed=not over,
                        step=int(steps[i0]) if over else None,
                        noise=_noise(nf.get("first"), res.reference and res.reference.loss_noise), detail=detail))
    _fail_steps(res, "first", np.arange(len(steps)) == i0 if over else np.zeros(len(steps), bool))

    lim = _widened(res, k, tol.max, "max")
    vmax = nanmax(loss_rel)
    checks.append(Check("max", "max loss rel diff", value=vmax, limit=lim, passed=not (vmax > lim),
                        step=first_over(steps, loss_rel, lim), noise=nf.get("max")))
    _fail_steps(res, "max", loss_rel > lim)

    if k is not None and res.noise_rel is not None:
        checks.append(_band_rule(res, k))

    vmean = nanmean(loss_rel)
    run_mean = running_mean(loss_rel)
    checks.append(Check("mean", "mean loss rel diff", value=vmean, limit=tol.mean, passed=not (vmean > tol.mean),
                        step=first_over(steps, run_mean, tol.mean) if vmean > tol.mean else None,
                        noise=nf.get("mean")))
    return checks


def _band_rule(res: CompareResult, k: float) -> Check:
    steps, loss_window, tol = res.steps, res.loss_window, res.tolerances
    judged = np.zeros(len(steps), bool)
    if len(steps) >= tol.window:
        judged[tol.window - 1:] = True
    else:
        judged[-1] = True
    judged &= ~np.isnan(res.noise_band)
    floor = tol.band_floor or 0.0
    band = np.where(judged, np.maximum(k * res.noise_band, floor), np.nan)
    res.band_limit = band
    over = judged & (loss_window > band)
    worst = np.where(judged, loss_window / np.where(band > 0, band, np.inf), np.nan)
    ratio = nanmax(worst)
    first = int(steps[np.argmax(over)]) if over.any() else None
    detail = ""
    if first is not None:
        i = int(np.argmax(over))
        detail = (f"loss rel diff over the {tol.window} steps to {first} averages {fmt_figure(loss_window[i])} "
                  f"> allowed {fmt_figure(band[i])} (max of {k:g} x noise band {fmt_figure(res.noise_band[i])}, "
                  f"floor {fmt_figure(floor)})")
    _fail_steps(res, "band", over)
    return Check("band", "windowed loss rel diff / noise band allowance", value=ratio, limit=1.0,
                 passed=None if not judged.any() else not over.any(), step=first,
                 noise=res.noise_figures.get("band_mean"), detail=detail)


def lr_rule(res: CompareResult) -> Check:
    """``lr``: the per-step lr rel diff; names a schedule shifted by one step."""
    steps, lr_rel, rg, rm, tol = res.steps, res.lr_rel, res.lr_golden, res.lr_ms, res.tolerances
    vlr = nanmax(lr_rel)
    first = first_over(steps, lr_rel, tol.lr)
    detail = ""
    if first is not None:
        i = int(np.searchsorted(steps, first))
        detail = (f"lr rel diff {fmt_figure(lr_rel[i])} > {fmt_figure(tol.lr)} "
                  f"(golden {rg[i]:.6g}, MindSpore {rm[i]:.6g})" + _lr_hint(rg, rm, i))
    _fail_steps(res, "lr", lr_rel > tol.lr)
    return Check("lr", "max lr rel diff", value=vlr, limit=tol.lr, passed=first is None, step=first,
                 noise=res.noise_figures.get("lr_max"), detail=detail)


def grad_rules(res: CompareResult, k: float | None) -> list[Check]:
    """``grad_max`` and ``grad_mean``: the grad-norm rel diff, per step and mean (running). Their
    bounds are at least reference_k x the golden's own step-1 gradient error vs float64 (`reference`)."""
    steps, grad_rel, tol, nf = res.steps, res.grad_rel, res.tolerances, res.noise_figures
    own = res.reference.grad_noise if res.reference is not None else None
    source = res.reference.grad_source() if res.reference is not None else ""
    lim = _widened(res, k, tol.grad_max, "grad_max")
    vgmax = nanmax(grad_rel)
    first = first_over(steps, grad_rel, lim)
    checks = [Check("grad_max", "max grad-norm rel diff", value=vgmax, limit=lim,
                    passed=None if math.isnan(vgmax) else not (vgmax > lim),
                    step=first, noise=_noise(nf.get("grad_max"), own),
                    detail=_grad_detail("max grad-norm rel diff", vgmax, lim, first is not None, source))]
    _fail_steps(res, "grad_max", grad_rel > lim)
    lim = _widened(res, k, tol.grad_mean, "grad_mean")
    vgmean = nanmean(grad_rel)
    checks.append(Check("grad_mean", "mean grad-norm rel diff", value=vgmean, limit=lim,
                        passed=None if math.isnan(vgmean) else not (vgmean > lim),
                        step=first_over(steps, running_mean(grad_rel), lim) if vgmean > lim else None,
                        noise=_noise(nf.get("grad_mean"), own),
                        detail=_grad_detail("mean grad-norm rel diff", vgmean, lim, vgmean > lim, source)))
    return checks


def _grad_detail(label: str, value: float, limit: float, over: bool, source: str) -> str:
    return f"{label} {fmt_figure(value)} > {fmt_figure(limit)} ({source})" if over and source else source


def _noise(run_figure: float | None, own_error: float | None) -> float | None:
    """The noise column: the noise run's figure where there is one, else the golden's own error
    against its float64 twin (the source of the bound, said in the check's detail)."""
    return run_figure if run_figure is not None else own_error


def noise_notes(res: CompareResult) -> None:
    """Bounds tighter than the baseline's own noise, and that fp32 does not judge the noise run."""
    tol, nf = res.tolerances, res.noise_figures
    for key, label, limit in (("first", "first-step", tol.first), ("mean", "mean", tol.mean)):
        v = nf.get(key, math.nan)
        if math.isfinite(v) and v > limit:
            res.notes.append(f"the golden's own noise ({label} loss rel diff {fmt_figure(v)}) exceeds the "
                             f"{label} bound {fmt_figure(limit)}: that bound is tighter than the baseline "
                             "reproduces itself")
    if res.dtype == "fp32":
        res.notes.append("fp32: the noise run is reported, not judged (fixed bounds only)")


def _lr_hint(rg: np.ndarray, rm: np.ndarray, i: int) -> str:
    """' -- MindSpore's lr is the golden's of step s+1' when the schedule looks shifted by one step."""
    for shift, word in ((1, "next"), (-1, "previous")):
        j = i + shift
        if 0 <= j < len(rg) and rg[j] != 0 and abs(rm[i] - rg[j]) <= 1e-9 * abs(rg[j]):
            return f"; MindSpore's lr is the golden's {word} step's: the schedule is off by one step"
    return ""


def _fmt_int(v: float) -> str:
    return "n/a" if math.isnan(v) else f"{int(v)}"


def _ranges(steps: list[int], limit: int = 4) -> str:
    spans, start, prev = [], None, None
    for s in steps:
        if start is None:
            start = prev = s
        elif s == prev + 1:
            prev = s
        else:
            spans.append((start, prev))
            start = prev = s
    if start is not None:
        spans.append((start, prev))
    text = ", ".join(f"{a}" if a == b else f"{a}..{b}" for a, b in spans[:limit])
    return text + (f", … ({len(spans) - limit} more)" if len(spans) > limit else "")
