"""The fp32 ``drift`` rule of `migrate compare`: a loss that stays on one side of the golden's."""
from __future__ import annotations

import math

import numpy as np

from migrate.compare.result import CompareResult
from migrate.compare.stats import nanmax
from migrate.compare.tolerances import Tolerances
from migrate.dtype_names import PRECISIONS
from migrate.judge import Check, fmt_figure

__all__ = ["drift_check"]

# one fp32 ulp at 1.0 (twice the unit roundoff): the first steps' level never counts as below it
_FP32_ULP = 2 * PRECISIONS["fp32"].unit_roundoff
_DRIFT_EARLY = 3         # paired steps whose loss rel diff sets the level the rest is held to


def drift_check(steps: np.ndarray, lg: np.ndarray, lm: np.ndarray, tol: Tolerances,
                 res: CompareResult, floor: float = 0.0, noise: float = 0.0) -> Check | None:
    """The fp32 ``drift`` rule: the loss rel diff must stay at the level of the first steps.

    Correct fp32 runs differ by rounding alone: the signed loss rel diff
    s_t = (ms_t - golden_t) / |golden_t| sits at its first-step value (one
    forward pass on the same weights, ~3e-7) or wanders with random sign once
    the two trajectories part chaotically. A one-sided optimizer fault that the
    per-step bounds do not see (weight decay 0 against 0.1: 2.4e-5 mean, bound
    1e-4) instead pushes s steadily one way. So: with e the median |s| of the
    first `_DRIFT_EARLY` paired steps (at least one fp32 ulp), fail at the first
    step t where s has stayed beyond ``drift`` x e on the same side of the
    golden for ``drift_window`` paired steps in a row (the whole run when it is
    shorter). The figure is the largest such sustained |s|. Measured (tests/
    test_compare_tight.py): correct runs sustain at most ~1.0 e, a decay-only
    fault 100-600 e. ``floor``: e is at least that (a log's printed resolution).
    ``noise``: e is at least that too -- the golden's own first-step error against
    its float64 twin (`reference`), the scale a correct run's first steps differ
    by, so a lucky near-zero first-step diff cannot make the bound over-tight.
    """
    if tol.drift is None or not len(steps):
        return None
    with np.errstate(divide="ignore", invalid="ignore"):
        signed = np.where(np.isfinite(lg) & np.isfinite(lm) & (lg != 0), (lm - lg) / np.abs(lg), np.nan)
    res.loss_signed = signed
    early = np.abs(signed[:_DRIFT_EARLY])
    early = early[np.isfinite(early)]
    median = float(np.median(early)) if early.size else 0.0
    level = max(median, _FP32_ULP, floor, noise)
    limit = tol.drift * level
    width = min(tol.drift_window, len(steps))
    s = np.nan_to_num(signed, nan=0.0)  # a step without both losses breaks a one-sided stretch
    sustained = np.full(len(steps), np.nan)
    for end in range(width - 1, len(steps)):
        window = s[end - width + 1:end + 1]
        low, high = float(window.min()), float(window.max())
        sustained[end] = low if low > 0 else (-high if high < 0 else 0.0)
    res.drift_sustained, res.drift_limit = sustained, limit
    value = nanmax(sustained)
    over = sustained > limit
    res.fail_steps["drift"] = [int(x) for x in steps[over]]
    label = f"loss rel diff sustained over {width} steps (same sign)"
    if math.isinf(limit):
        return Check("drift", label, value=value, limit=limit)
    if not over.any():
        return Check("drift", label, value=value, limit=limit, passed=True,
                     detail="" if level > noise or not noise else
                     f"level {fmt_figure(level)}: the golden's own first-step error vs float64, above the first "
                     f"steps' median {fmt_figure(median)}")
    i = int(np.argmax(over))
    start = int(steps[i - width + 1])
    side = "above" if signed[i] > 0 else "below"
    peak = float(np.nanmax(np.abs(signed)))
    whose = "the first steps' level" if level > noise or not noise else "the golden's own first-step error"
    detail = (f"MindSpore's loss stays {side} the golden's by more than {tol.drift:g} x {whose} "
              f"{fmt_figure(level)} (= {fmt_figure(limit)}) for {width} steps in a row, "
              f"steps {start}..{int(steps[i])}, "
              f"and reaches {fmt_figure(peak)}: a systematic drift (an optimizer knob such as weight decay), "
              "not rounding")
    return Check("drift", label, value=value, limit=limit, passed=False, step=int(steps[i]), detail=detail)
