"""Fused CPU kernels of the MindSpore trainer, built from their C++ source when first needed.

`adamw_op()` is MindSpore's ops.Custom over adamw.cc (one pass per tensor instead of fourteen
element-wise kernels and the clip's passes; bit for bit the same numbers), or None where it cannot be had: not on CPU,
no C++ compiler, a failed build, or MIGRATE_FUSED_ADAMW=off. The trainer then runs the op-by-op
graph (migrate/train/optim.py), which computes the same bits more slowly.

migrate/native.py builds the library into the user's cache; `make install` builds it ahead.
"""
from __future__ import annotations

from functools import cache
from pathlib import Path

from migrate import native

SOURCE = Path(__file__).with_name("adamw.cc")
ENV_SWITCH = "MIGRATE_FUSED_ADAMW"
SYMBOL = "MigrateAdamW"


def build() -> Path | None:
    """The compiled library (built now if absent), or None with no compiler or a failed build."""
    return native.build(SOURCE)


def wanted() -> bool:
    return not native.switched_off(ENV_SWITCH)


@cache
def _custom_op(library: str):
    import mindspore as ms
    from mindspore import ops

    # param, exp_avg, exp_avg_sq (and, asked, grad) are written in place (adamw.cc); the output is the
    # gradient's sum of squares, one element
    return ops.Custom(f"{library}:{SYMBOL}", out_shape=lambda *shapes: (1,), out_dtype=lambda *dtypes: ms.float32,
                      func_type="aot")


def adamw_op():
    """ops.Custom running adamw.cc, or None (module docstring: when)."""
    import mindspore as ms

    if not wanted() or ms.get_context("device_target") != "CPU":
        return None
    library = build()
    return None if library is None else _custom_op(str(library))

