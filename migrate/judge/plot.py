"""Matplotlib helpers shared by the plots of `migrate diff` and `migrate compare`.

matplotlib is imported when a plot is drawn, not when a verdict is computed: it costs more
than the rest of a comparison.
"""
from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from migrate.checkpoints.atomic import atomic_write_bytes

__all__ = ["FAIL_COLOR", "figure", "png_bytes", "mark_failures", "write_png"]

FAIL_COLOR = "#d62728"   # whatever failed: crosses, bound lines, the first-failure marker


def figure(width: float, height: float) -> Any:
    """A Figure on an Agg canvas (no display needed), 100 dpi."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def png_bytes(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": "migrate"})  # what lets it be regenerated in place
    return buf.getvalue()


def mark_failures(ax: Any, xs: Any, ys: Any, label: str, ms: float = 6, mew: float = 1.5) -> None:
    """Red crosses on the failing points."""
    ax.plot(xs, ys, "x", color=FAIL_COLOR, ms=ms, mew=mew, label=label)


def write_png(path: Any, png: bytes) -> Path:
    """Written atomically: a reader never sees a partial PNG."""
    return atomic_write_bytes(path, png)
