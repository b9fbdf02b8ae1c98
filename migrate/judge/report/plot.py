"""per_layer_error.png: where along the forward pass the two models part."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from migrate.judge.plot import FAIL_COLOR, figure, mark_failures, png_bytes

__all__ = ["render_plot"]

_PLOT_FLOOR = 1e-17


def render_plot(report: Any) -> bytes:
    """per_layer_error.png: max abs and 1 - cosine per forward entry, log scale."""
    report._ensure_final()
    pts = [e for e in report.forward if e.kind != "generation" and e.metrics.get("max_abs") is not None]
    n = len(pts)
    width = min(max(6.0, 0.28 * n + 2.5), 32.0)
    fig = figure(width, 6.0)
    ax1, ax2 = fig.subplots(2, 1, sharex=True)
    verdict = "PASS" if report.passed else "FAIL"
    title = f"Per-layer error, forward order · {report.dtype} · {verdict}"
    nf = report.summary.get("nonfinite")
    if nf:
        title += f"\nNaN/Inf from {nf['location']} ({nf['tensors']} tensors; plotted as gaps)"
    fig.suptitle(title)
    if not n:
        ax1.text(0.5, 0.5, "no forward entries", ha="center", va="center", transform=ax1.transAxes)
    else:
        xs = np.arange(n)

        def val(v):
            v = float(v) if v is not None else math.nan
            return max(v, _PLOT_FLOOR) if not math.isnan(v) else math.nan

        mabs = [val(e.metrics.get("max_abs")) for e in pts]
        omc = [val(1.0 - e.metrics["cosine"]) if e.metrics.get("cosine") is not None and e.kind != "loss"
               else math.nan for e in pts]
        ok = np.array([e.passed for e in pts])
        for ax, ys, label in ((ax1, mabs, "max |ref − got|"), (ax2, omc, "1 − cosine")):
            ys = np.array(ys, dtype=float)
            ax.plot(xs, ys, "-", color="#4a78b5", lw=1, alpha=0.6)
            ax.plot(xs[ok], ys[ok], "o", color="#4a78b5", ms=4, label="pass")
            if (~ok).any():
                mark_failures(ax, xs[~ok], ys[~ok], "fail", ms=7, mew=2)
            ax.set_yscale("log")
            ax.set_ylabel(label)
            ax.grid(True, which="major", alpha=0.3)
        hb = report.thresholds.bounds("hidden")
        if hb.max_abs is not None:
            ax1.axhline(hb.max_abs, color="#999999", ls=":", lw=1, label=f"hidden bound {hb.max_abs:g} (unit scale)")
        if hb.cosine is not None and hb.cosine < 1:
            ax2.axhline(1 - hb.cosine, color="#999999", ls=":", lw=1, label=f"hidden bound 1 − {hb.cosine:g}")
        if report.first_divergence is not None and report.first_divergence in pts:
            k = pts.index(report.first_divergence)
            for ax in (ax1, ax2):
                ax.axvline(k, color=FAIL_COLOR, ls="--", lw=1.2)
            ax1.annotate("first divergence", xy=(k, 0.04), xycoords=("data", "axes fraction"),
                         xytext=(4, 0), textcoords="offset points", color=FAIL_COLOR, fontsize=9,
                         bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "none", "alpha": 0.8})
        if any(v == _PLOT_FLOOR for v in mabs + omc):
            fig.text(0.99, 0.005, f"exact zeros plotted at {_PLOT_FLOOR:g}", ha="right", va="bottom",
                     fontsize=7, color="#666666")
        ax2.set_xticks(xs)
        ax2.set_xticklabels([e.short_label for e in pts], rotation=90, fontsize=7 if n > 30 else 8)
        ax1.legend(loc="upper left", fontsize=8)
        ax2.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    return png_bytes(fig)
