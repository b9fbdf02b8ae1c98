"""Recording hooks for any `torch.nn.Module`: a forward hook on every submodule (and the
model itself), records in the module's own `named_modules` names; gradients after the
user's own `backward()` from each parameter's `.grad`."""
from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import torch

from migrate.probe.recording import Recorder


def _is_tensor(x) -> bool:
    return isinstance(x, torch.Tensor) and x.is_floating_point()


def _to_numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach().cpu()
    return t.numpy() if t.dtype == torch.float64 else t.float().numpy()  # a float64 twin stays float64


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


@contextmanager
def record_torch(model: torch.nn.Module, sink, *, inputs: bool = False, params: bool = False,
                 grads: bool = False, include=None):
    """Hooks on while the block runs; on leaving it, parameters (``params``) and the gradients
    a backward in the block left (``grads``) are recorded too, then every hook is removed."""
    recorder = Recorder(sink, _is_tensor, _to_numpy, _dtype, inputs=inputs, include=include)
    handles = [module.register_forward_hook(recorder.forward_hook(name))
               for name, module in model.named_modules() if recorder.wants(name)]
    try:
        yield recorder
        for name, p in model.named_parameters():
            if params:
                recorder.add(name, "param", p)
            if grads and p.grad is not None:
                recorder.add(name, "grad", p.grad)
    finally:
        for handle in handles:
            handle.remove()
