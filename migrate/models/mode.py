"""MindSpore's execution mode as a scoped setting.

`mindspore.set_context(mode=...)` is process-wide: a command that switched to PyNative for
hooks, or to GRAPH_MODE for export, used to leave the next caller (a test, a notebook, the
trainer) in that mode. Every switch goes through `execution_mode`, which puts the previous
mode back on the way out, error or not.

`launch_synchronously_on_cpu` is the other process-wide setting: PyNative's kernels launched
synchronously on the CPU (`models.base`, under every bundled model, makes it when imported).
"""
from __future__ import annotations

from contextlib import contextmanager

import mindspore as ms

from migrate.native import switched_off

SWITCH = "MIGRATE_SYNC_LAUNCH"
MODES = {"graph": ms.GRAPH_MODE, "pynative": ms.PYNATIVE_MODE}


def launch_synchronously_on_cpu() -> bool:
    """On the CPU, PyNative's kernels launched from the calling thread (`mindspore.runtime.launch_blocking`)
    instead of through MindSpore's asynchronous queues, whose threads wait by spinning and yielding
    and took a core from the kernels: a 254 M Llama's forward + backward in PyNative took 4.9-5.7 s
    asynchronously and 1.5-1.6 s launched so, on this project's 2-core machine, the same gradients to the
    bit; graph-mode training ran at the same speed either way (bench/train_speed.py). On a device
    (Ascend, GPU) the queues overlap the host with the device, so they stay. MindSpore takes the
    setting only before its first kernel runs (later it is a no-op): `models.base`, which every
    bundled model stands on, makes it when imported. Asking again changes nothing. True where it
    is made: on the CPU, unless MIGRATE_SYNC_LAUNCH=off (a caller's own process that wants
    MindSpore's default)."""
    if ms.get_context("device_target") != "CPU" or switched_off(SWITCH):
        return False
    ms.runtime.launch_blocking()
    return True


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
