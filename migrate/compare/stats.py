"""Statistics of paired loss curves: relative differences and the windowed means the rules use.

Per step, golden is the baseline: rel = |ms - golden| / |golden|. A value null (NaN) on one
side only is an infinite difference; null on both sides is agreement and is left out of
means and maxima (NaN here).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["rel_diff", "trailing_mean", "centred_mean", "running_mean", "nanmax", "nanmean", "at_steps",
           "first_over", "is_prefix"]


def rel_diff(got: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """|got - ref| / |ref| elementwise; NaN where both are non-finite (agreement),
    inf where only one is, 0 / inf where ref is 0."""
    got = np.asarray(got, dtype=float)
    ref = np.asarray(ref, dtype=float)
    out = np.full(np.broadcast(got, ref).shape, np.nan)
    fg, fr = np.isfinite(got), np.isfinite(ref)
    both = fg & fr
    out[fg != fr] = np.inf
    with np.errstate(divide="ignore", invalid="ignore"):
        diff = np.abs(got - ref)
        rel = np.where(ref != 0, diff / np.abs(ref), np.where(diff == 0, 0.0, np.inf))
    out[both] = rel[both]
    return out


def trailing_mean(x: np.ndarray, w: int) -> np.ndarray:
    """Mean of the finite-or-inf values among the last w entries (NaN entries skipped)."""
    return _window_mean(x, lambda i, n: (np.maximum(0, i - w + 1), i + 1))


def centred_mean(x: np.ndarray, w: int) -> np.ndarray:
    half = w // 2
    return _window_mean(x, lambda i, n: (np.maximum(0, i - half), np.minimum(n, i + half + 1)))


def _window_mean(x: np.ndarray, bounds) -> np.ndarray:
    x = np.asarray(x, dtype=float)
    n = len(x)
    if n == 0:
        return x.copy()
    valid = ~np.isnan(x)
    isinf = np.isinf(x)
    vals = np.where(valid & ~isinf, x, 0.0)
    c = np.concatenate([[0.0], np.cumsum(vals)])
    cn = np.concatenate([[0], np.cumsum(valid)])
    ci = np.concatenate([[0], np.cumsum(isinf)])
    i = np.arange(n)
    lo, hi = bounds(i, n)
    cnt = cn[hi] - cn[lo]
    with np.errstate(invalid="ignore", divide="ignore"):
        out = (c[hi] - c[lo]) / cnt
    out[cnt == 0] = np.nan
    out[(ci[hi] - ci[lo]) > 0] = np.inf
    return out


def running_mean(x: np.ndarray) -> np.ndarray:
    return _window_mean(x, lambda i, n: (np.zeros_like(i), i + 1))


def nanmax(x: np.ndarray) -> float:
    x = np.asarray(x, dtype=float)
    x = x[~np.isnan(x)]
    return float(x.max()) if x.size else math.nan


def nanmean(x: np.ndarray) -> float:
    x = np.asarray(x, dtype=float)
    x = x[~np.isnan(x)]
    return float(x.mean()) if x.size else math.nan


def at_steps(run: Any, steps: np.ndarray, arr: np.ndarray | None, fill=np.nan) -> np.ndarray:
    """Values of a run's column at the given steps (fill where the run lacks a step or the column)."""
    out = np.full(len(steps), fill, dtype=float if arr is None or arr.dtype != bool else bool)
    if arr is None:
        return out
    idx = np.searchsorted(run.steps, steps)
    idx = np.clip(idx, 0, max(len(run.steps) - 1, 0))
    hit = run.steps[idx] == steps if len(run.steps) else np.zeros(len(steps), bool)
    out[hit] = arr[idx[hit]]
    return out


def first_over(steps: np.ndarray, values: np.ndarray, limit: float) -> int | None:
    bad = values > limit  # NaN compares False: excluded
    return int(steps[np.argmax(bad)]) if bad.any() else None


def is_prefix(short: np.ndarray, long: np.ndarray) -> bool:
    return len(short) <= len(long) and np.array_equal(short, long[: len(short)])
