"""MindSpore's execution mode as a scoped setting.

`mindspore.set_context(mode=...)` is process-wide: a command that switched to PyNative for
hooks, or to GRAPH_MODE for export, used to leave the next caller (a test, a notebook, the
trainer) in that mode. Every switch goes through `execution_mode`, which puts the previous
mode back on the way out, error or not.
"""
from __future__ import annotations

from contextlib import contextmanager

import mindspore as ms

MODES = {"graph": ms.GRAPH_MODE, "pynative": ms.PYNATIVE_MODE}


@contextmanager
def execution_mode(mode):
    """Run the block in `mode` ("graph", "pynative" or a MindSpore mode constant)."""
    wanted = MODES[mode] if isinstance(mode, str) else mode
    previous = ms.get_context("mode")
    if wanted != previous:
        ms.set_context(mode=wanted)
    try:
        yield
    finally:
        if ms.get_context("mode") != previous:
            ms.set_context(mode=previous)
