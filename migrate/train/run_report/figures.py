"""The report's figures as PNG bytes (matplotlib through `migrate.judge.plot`): the run's curves
(loss with the golden's and the health events, lr, grad norm before / after clipping, loss
scale in fp16) and its step time."""
from __future__ import annotations

import numpy as np

from migrate.judge.plot import FAIL_COLOR, figure, png_bytes
from migrate.train.run_report.run_files import RunFiles
from migrate.train.run_report.timing import Timing

_RUN, _GOLDEN = "#ff7f0e", "#1f77b4"
_LEGEND = {"loc": "upper left", "bbox_to_anchor": (1.01, 1.0), "fontsize": 8, "borderaxespad": 0.0}


def curves_png(run: RunFiles, golden: RunFiles | None = None) -> bytes:
    m = run.metrics
    scale = m.loss_scale is not None and np.isfinite(m.loss_scale).any()
    panels = 4 if scale else 3
    fig = figure(12.0, 2.6 * panels + 0.6)
    axes = fig.subplots(panels, 1, sharex=True)
    s = m.steps.astype(float)
    ax = axes[0]
    if golden is not None:
        ax.plot(golden.metrics.steps, golden.metrics.loss, "-", color=_GOLDEN, lw=1.2, label="golden")
    ax.plot(s, m.loss, "--" if golden is not None else "-", color=_RUN, lw=1.3, label=run.side)
    for i, step in enumerate(sorted({int(e["step"]) for e in run.health if "step" in e})):
        ax.axvline(step, color=FAIL_COLOR, lw=0.8, alpha=0.6, label="health event" if i == 0 else None)
    if m.skipped is not None and m.skipped.any():
        ax.plot(s[m.skipped], np.nan_to_num(m.loss[m.skipped], nan=np.nanmax(m.loss)), "v", color=FAIL_COLOR,
                ms=5, label="skipped step")
    ax.set_ylabel("loss")

    ax = axes[1]
    if golden is not None:
        ax.plot(golden.metrics.steps, golden.metrics.lr, "-", color=_GOLDEN, lw=1.2, label="golden")
    ax.plot(s, m.lr, "--" if golden is not None else "-", color=_RUN, lw=1.3, label=run.side)
    ax.set_ylabel("lr")
    ax.ticklabel_format(axis="y", style="sci", scilimits=(-2, 2))

    ax = axes[2]
    if golden is not None:
        ax.plot(golden.metrics.steps, golden.metrics.grad_norm, "-", color=_GOLDEN, lw=1.0, label="golden, before clip")
    ax.plot(s, m.grad_norm, "--" if golden is not None else "-", color=_RUN, lw=1.2, label=f"{run.side}, before clip")
    if m.grad_norm_clipped is not None:
        ax.plot(s, m.grad_norm_clipped, ":", color="#2ca02c", lw=1.2, label=f"{run.side}, after clip")
    ax.set_ylabel("grad norm")
    if np.nanmax(m.grad_norm, initial=0) > 0:
        ax.set_yscale("log")

    if scale:
        ax = axes[3]
        ax.plot(s, m.loss_scale, "-", color=_RUN, lw=1.2, label="loss scale")
        ax.set_yscale("log")
        ax.set_ylabel("loss scale")
    for ax in axes:
        ax.grid(True, alpha=0.3)
        ax.legend(**_LEGEND)
    axes[-1].set_xlabel("step")
    fig.suptitle(f"{run.folder} · {run.side}" + (f" vs golden {golden.folder}" if golden else ""))
    fig.subplots_adjust(left=0.07, right=0.78, top=0.94, bottom=0.06, hspace=0.12)
    return png_bytes(fig)


def timing_png(timing: Timing) -> bytes:
    fig = figure(12.0, 3.6)
    ax = fig.subplots(1, 1)
    ax.bar(timing.steps, timing.seconds, width=0.9, color="#9467bd", label="step wall time (s)")
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("seconds")
    ax.grid(True, alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    if timing.tokens_per_s is not None:
        twin = ax.twinx()
        twin.plot(timing.steps, timing.tokens_per_s, "-", color="#2ca02c", lw=1.2, label="tokens/s")
        twin.set_ylabel("tokens/s")
        h2, l2 = twin.get_legend_handles_labels()
        handles, labels = handles + h2, labels + l2
    ax.legend(handles, labels, loc="upper right", fontsize=8)
    fig.subplots_adjust(left=0.07, right=0.92, top=0.95, bottom=0.14)
    return png_bytes(fig)
