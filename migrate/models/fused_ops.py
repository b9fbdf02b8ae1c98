"""Fused float32 CPU ops of the bundled models' training step (fused_ops.cc), each forward bound to
its backward, and the switch that puts them into a model.

    count = use_fused_ops(model)   # the trainer's model, before its step compiles: cells switched
    norm = rms_norm_op()           # (x, weight, eps) -> weight * (x * rsqrt(mean(x²) + eps)); or None
    grad = softmax_grad_op()       # (y, dy) -> (dy - sum(dy * y)) * y over the last axis; or None
    rotary = rotary_op()           # (x, cos, sin) -> x * cos + rotate_half(x) * sin; or None

Each op answers None where it cannot be had: not on CPU, no C++ compiler, a failed build, or
MIGRATE_FUSED_OPS=off; the cells then compute op by op, the same figures within float32 rounding
(tests/test_fused_ops.py). Only the trainer switches them on: its step graph returns tensors, and a
graph whose output holds a None (a model called at top level: `logits, loss, None`) is run by
MindSpore's any-type actor, which cannot call these ops' Python shape inference ("The prim is not a
PrimitivePy"). diff, generate and the rest keep the op-by-op cells and their figures.
"""
from __future__ import annotations

from pathlib import Path

from migrate import native
from migrate.models.base import F32
from migrate.models.kernels import FusedSoftmaxKernel, SoftmaxKernel
from migrate.models.llama import RMSNorm
from migrate.models.rotary import RotateHalf

SOURCE = Path(__file__).with_name("fused_ops.cc")
ENV_SWITCH = "MIGRATE_FUSED_OPS"


def _library() -> str | None:
    import mindspore as ms

    if native.switched_off(ENV_SWITCH) or ms.get_context("device_target") != "CPU":
        return None
    built = native.build(SOURCE)
    return None if built is None else str(built)


def _rms_norm(library: str):
    from mindspore import ops

    grad = ops.Custom(f"{library}:MigrateRmsNormGrad", out_shape=lambda x, w, eps, dy: (x, w),
                      out_dtype=lambda x, w, eps, dy: (x, w), func_type="aot")

    def bprop(x, weight, eps, out, dout):
        dx, dweight = grad(x, weight, eps, dout)
        return dx, dweight, ops.zeros_like(eps)

    return ops.Custom(f"{library}:MigrateRmsNorm", out_shape=lambda x, w, eps: x, out_dtype=lambda x, w, eps: x,
                      func_type="aot", bprop=bprop)


def _softmax_grad(library: str):
    from mindspore import ops

    return ops.Custom(f"{library}:MigrateSoftmaxGrad", out_shape=lambda y, dy: y, out_dtype=lambda y, dy: y,
                      func_type="aot")


def _rotary(library: str):
    from mindspore import ops

    grad = ops.Custom(f"{library}:MigrateRotaryGrad", out_shape=lambda dy, cos, sin: dy,
                      out_dtype=lambda dy, cos, sin: dy, func_type="aot")

    def bprop(x, cos, sin, out, dout):
        # the tables are constants of the positions: no gradient flows to them
        return grad(dout, cos, sin), ops.zeros_like(cos), ops.zeros_like(sin)

    return ops.Custom(f"{library}:MigrateRotary", out_shape=lambda x, cos, sin: x, out_dtype=lambda x, cos, sin: x,
                      func_type="aot", bprop=bprop)


def rms_norm_op():
    """ops.Custom of HF LlamaRMSNorm in float32 with its fused gradient, or None (module docstring)."""
    library = _library()
    return None if library is None else _rms_norm(library)


def softmax_grad_op():
    """ops.Custom of softmax's gradient from its output, or None (module docstring)."""
    library = _library()
    return None if library is None else _softmax_grad(library)


def rotary_op():
    """ops.Custom of HF's apply_rotary_pos_emb on one of q, k (b, heads, s, d) with its gradient, or
    None (module docstring). Bit for bit the graph's, both ways."""
    library = _library()
    return None if library is None else _rotary(library)


def _plain_float32(precision) -> bool:
    return precision.params == F32 and precision.act == F32 and not precision.sites


def use_fused_ops(model) -> int:
    """Put the fused ops into `model`'s plain float32 RMSNorm and rotary cells and its attention softmax
    kernels (exact types: a Gemma norm, a fault's or a sharded kernel computes something else). The
    number of cells switched; 0 where the ops cannot be had. Call before the model's graphs compile."""
    library = _library()
    if library is None:
        return 0
    switched = 0
    for _, cell in list(model.cells_and_names()):
        if type(cell) is RMSNorm and _plain_float32(cell.precision):
            cell.fused = _rms_norm(library)
        elif type(cell) is RotateHalf and _plain_float32(cell.precision):
            cell.fused = _rotary(library)
        elif type(getattr(cell, "softmax", None)) is SoftmaxKernel:
            cell.softmax = FusedSoftmaxKernel(_softmax_grad(library))
        else:
            continue
        switched += 1
    return switched
