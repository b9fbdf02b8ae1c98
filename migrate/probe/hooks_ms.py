"""Recording hooks for any MindSpore `nn.Cell` (PyNative: forward hooks run on CPU too): a
forward hook on every cell of `cells_and_names`, records in the cells' own names. The block
runs in PyNative (`models.mode.execution_mode`); the caller's mode is back after it.
MindSpore has no `.grad`: pass the gradients its own `value_and_grad` returned to
`Recorder.add(name, "grad", g)` (or `record_gradients`)."""
from __future__ import annotations

from contextlib import contextmanager

import mindspore as ms
import numpy as np

from migrate.models.mode import execution_mode
from migrate.probe.recording import Recorder

_FLOATS = (ms.float16, ms.float32, ms.float64, ms.bfloat16)


def _is_tensor(x) -> bool:
    return isinstance(x, ms.Tensor) and x.dtype in _FLOATS


def _to_numpy(t) -> np.ndarray:
    return t.astype(ms.float32).asnumpy()


def _dtype(t) -> str:
    return {ms.float16: "float16", ms.float32: "float32", ms.float64: "float64",
            ms.bfloat16: "bfloat16"}[t.dtype]


@contextmanager
def record_ms(model: ms.nn.Cell, sink, *, inputs: bool = False, params: bool = False, include=None):
    with execution_mode("pynative"):  # forward hooks run in PyNative only
        recorder = Recorder(sink, _is_tensor, _to_numpy, _dtype, inputs=inputs, include=include)
        handles = [cell.register_forward_hook(recorder.forward_hook(name))
                   for name, cell in model.cells_and_names() if recorder.wants(name)]
        try:
            yield recorder
            if params:
                for name, p in model.parameters_and_names():
                    recorder.add(name, "param", p)
        finally:
            for handle in handles:
                handle.remove()


def record_gradients(recorder: Recorder, params, grads) -> None:
    """Record MindSpore gradients (`value_and_grad`'s, in `params`' order) under the parameters' names."""
    for p, g in zip(params, grads, strict=True):
        recorder.add(p.name, "grad", g)
