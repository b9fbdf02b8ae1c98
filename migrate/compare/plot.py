"""`migrate compare`'s plot: loss curves (top), the per-step loss rel diff with the noise band
shaded (middle), lr (bottom); failing steps marked."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from migrate.compare.result import CompareResult
from migrate.judge import short
from migrate.judge.plot import FAIL_COLOR, figure, mark_failures, png_bytes, write_png

__all__ = ["render_plot", "write_plot"]

_PLOT_FLOOR = 1e-16


def _spans(steps: np.ndarray, mask: np.ndarray) -> list[tuple[float, float]]:
    """Contiguous runs of True as (first step - 0.5, last step + 0.5)."""
    out, start = [], None
    for i, on in enumerate(mask):
        if on and start is None:
            start = i
        if start is not None and (not on or i == len(mask) - 1):
            end = i if on else i - 1
            out.append((float(steps[start]) - 0.5, float(steps[end]) + 0.5))
            start = None
    return out


def render_plot(result: CompareResult) -> bytes:
    """PNG bytes: loss curves (top), per-step loss rel diff with the noise band (middle), lr (bottom)."""
    r = result
    s = r.steps.astype(float)
    fig = figure(12.0, 9.0)
    ax1, ax2, ax3 = fig.subplots(3, 1, sharex=True, gridspec_kw={"height_ratios": [3, 2.4, 1.4]})
    first = r.first_failure
    title = f"Golden vs MindSpore · {r.dtype} · {'PASS' if r.passed else 'FAIL'}"
    if first is not None:
        title += f" · first out: {first.key}" + (f" at step {first.step}" if first.step is not None else "")
    if r.hparams is not None and r.hparams.differing:
        title += "\nhyperparameters differ: " + ", ".join(
            f"{row.knob} golden {short(row.golden, 24)} ≠ MindSpore {short(row.mindspore, 24)}"
            for row in r.hparams.differing[:3]) + (" …" if len(r.hparams.differing) > 3 else "")
    elif r.hparams is not None and r.hparams.skipped:
        title += " · hyperparameters not cross-checked"
    fig.suptitle(title)

    def failing(*keys):
        return np.isin(r.steps, sorted({s for k in keys for s in r.fail_steps.get(k, [])}))

    step_fail = failing("first", "max", "steps", "tokens", "skipped", "loss_scale")
    band_fail = failing("band")
    lr_fail = failing("lr")
    legend = {"loc": "upper left", "bbox_to_anchor": (1.01, 1.0), "fontsize": 8, "borderaxespad": 0.0}

    # top: loss curves
    ax1.plot(s, r.loss_golden, "-", color="#1f77b4", lw=1.3, label="golden")
    ax1.plot(s, r.loss_ms, "--", color="#ff7f0e", lw=1.3, label="MindSpore")
    if r.loss_noise is not None:
        ax1.plot(s, r.loss_noise, ":", color="#2ca02c", lw=1.1, label="golden, noise run")
    if step_fail.any():
        mark_failures(ax1, s[step_fail], r.loss_ms[step_fail], "step out of tolerance")
    for i, (a, b) in enumerate(_spans(r.steps, band_fail)):
        ax1.axvspan(a, b, color=FAIL_COLOR, alpha=0.08, lw=0, label="outside the noise band" if i == 0 else None)
    ax1.set_ylabel("loss")
    ax1.legend(**legend)
    ax1.grid(True, alpha=0.3)

    # middle: relative loss difference, log scale, bottom set by the data
    series = [r.loss_rel, r.loss_window] + ([r.noise_rel] if r.noise_rel is not None else [])
    pos = np.concatenate([v[np.isfinite(v) & (v > 0)] for v in series])
    bottom = max(float(np.percentile(pos, 5)) / 10.0, _PLOT_FLOOR) if pos.size else 1e-9  # deep dips clip
    bounds = [(r.check("max").limit, "--", "max bound"), (r.check("mean").limit, ":", "mean bound")]
    if r.drift_limit is not None:
        bounds.append((r.drift_limit, "-.", f"drift bound ({r.tolerances.drift:g} × first steps)"))
    bounds = [(v, ls, lab) for v, ls, lab in bounds if v is not None and math.isfinite(v) and v > 0]
    if bounds:
        bottom = min(bottom, min(v for v, _, _ in bounds) / 3.0)  # keep the bound lines in view

    def clip(v):
        v = np.asarray(v, dtype=float)
        return np.where(np.isnan(v), np.nan, np.clip(v, bottom, 1e300))

    if r.noise_band is not None:
        judged = r.band_limit is not None
        upper = r.band_limit if judged else r.noise_band
        label = (f"allowed: max({r.tolerances.band_k:g} × noise band, floor)" if judged
                 else "noise band (window mean; not judged)")
        ax2.fill_between(s, bottom, clip(upper), color="#2ca02c", alpha=0.18, lw=0, label=label)
        ax2.plot(s, clip(r.noise_rel), "-", color="#2ca02c", lw=0.7, alpha=0.7, label="|noise − golden| / golden")
    ax2.plot(s, clip(r.loss_rel), "-", color="#ff7f0e", lw=0.9, label="|MindSpore − golden| / golden")
    ax2.plot(s, clip(r.loss_window), "-", color="#8c564b", lw=1.6,
             label=f"MindSpore, {r.tolerances.window}-step mean")
    for limit, style, label in bounds:
        ax2.axhline(limit, color=FAIL_COLOR, ls=style, lw=1, label=label)
    if step_fail.any():
        mark_failures(ax2, s[step_fail], clip(r.loss_rel[step_fail]), "step out of tolerance")
    if band_fail.any():
        ax2.plot(s[band_fail], clip(r.loss_window[band_fail]), ".", color=FAIL_COLOR, ms=5,
                 label="window mean outside the band")
    drift_fail = failing("drift")
    if drift_fail.any():
        ax2.plot(s[drift_fail], clip(r.drift_sustained[drift_fail]), "v", color="#9467bd", ms=5,
                 label=f"drifting one way for {min(r.tolerances.drift_window, len(s))} steps")
    ax2.set_yscale("log")
    ax2.set_ylim(bottom=bottom)
    ax2.set_ylabel("loss rel diff")
    ax2.legend(**legend)
    ax2.grid(True, which="major", alpha=0.3)

    # bottom: lr
    ax3.plot(s, r.lr_golden, "-", color="#1f77b4", lw=1.3, label="golden")
    ax3.plot(s, r.lr_ms, "--", color="#ff7f0e", lw=1.3, label="MindSpore")
    if lr_fail.any():
        mark_failures(ax3, s[lr_fail], r.lr_ms[lr_fail], "lr out of tolerance", ms=5, mew=1.2)
    ax3.set_ylabel("lr")
    ax3.set_xlabel("step")
    ax3.legend(**legend)
    ax3.grid(True, alpha=0.3)
    ax3.ticklabel_format(axis="y", style="sci", scilimits=(-2, 2))
    fig.subplots_adjust(left=0.07, right=0.76, top=0.93 if "\n" in title else 0.95, bottom=0.06,
                        hspace=0.1)  # tight_layout costs ~0.7 s
    return png_bytes(fig)


def write_plot(result: CompareResult, path: Any) -> Path:
    """Render the plot and write it atomically (a reader never sees a partial PNG)."""
    return write_png(path, render_plot(result))
