"""torch's AdamW as the reference optimizer of `migrate diff --grads`.

The converted model's parameters and MindSpore's gradients, stepped once by
`torch.optim.AdamW` (fp32 master copies, as mixed precision keeps them; float64 for the noise
reference), give what MindSpore's AdamW step must produce from the same state.
"""
from __future__ import annotations

import numpy as np
import torch


class TensorByTensorAdamW:
    """One torch AdamW step of one tensor at a time (float32; float64 with `exact`), a chunk of it at
    a time, on a workspace kept across the tensors.

    float32 is torch's default CPU AdamW (one op per pass, the rounding `migrate train`'s AdamW
    matches). The float64 twin, the noise reference's truth, is torch's fused CPU kernel: one pass
    instead of about eight (0.45 against 0.72 s on a 28 M-element tensor here); its difference from
    the unfused float64 step (~1e-16 relative) is nothing beside float32's (~1e-7).

    AdamW is elementwise, so a tensor stepped `chunk` elements at a time takes the very step it takes
    whole (the tests hold them to the bit). Chunks keep the optimizer's passes in the cache, and the
    memory it touches to one output the size of the largest tensor plus a gradient and two moments of
    one chunk, where whole-tensor slots took four times the largest tensor (1.5 GiB at 254 M, with
    the float64 twin) of memory written for the first time: on this VM a step of the 254 M model
    paid 2 s, most of it first-touch page faults. The moments start at zero in each chunk, torch's
    own lazy initialisation skipped with the same values, so the step rounds as a fresh optimizer's.

    The array `step` returns is a view of the workspace: valid until the next call."""

    CHUNK = 1 << 18  # elements a step: float64 master, gradient and moments 8 MiB, within the L3 cache

    def __init__(self, *, lr: float, betas, eps: float, weight_decay: float, exact: bool = False,
                 chunk: int = CHUNK):
        self.exact = exact
        self.chunk = chunk
        self.dtype = torch.float64 if exact else torch.float32
        self.settings = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay}
        self._out = torch.empty(0, dtype=self.dtype)
        self._work = torch.empty(0, dtype=self.dtype)   # gradient, exp_avg, exp_avg_sq of one chunk

    def step(self, param: np.ndarray, grad: np.ndarray) -> np.ndarray:
        param, grad = np.asarray(param), np.asarray(grad)
        n = param.size
        if self._out.numel() < n:
            self._out = torch.empty(n, dtype=self.dtype)
        width = min(self.chunk, n)
        if self._work.numel() < 3 * width:
            self._work = torch.empty(3 * width, dtype=self.dtype)
        out = self._out[:n]
        flat_param, flat_grad = torch.from_numpy(param.reshape(-1)), torch.from_numpy(grad.reshape(-1))
        for lo in range(0, n, self.chunk):
            hi = min(lo + self.chunk, n)
            m = hi - lo
            master = out[lo:hi]
            gradient, exp_avg, exp_avg_sq = (self._work[k * width:k * width + m] for k in range(3))
            master.copy_(flat_param[lo:hi])
            gradient.copy_(flat_grad[lo:hi])
            exp_avg.zero_()
            exp_avg_sq.zero_()
            master.grad = gradient
            optimizer = torch.optim.AdamW([master], fused=self.exact or None, **self.settings)
            # What AdamW's lazy initialisation would make, on the workspace instead of new memory;
            # the step counter's dtype and placement follow torch's (float32 on the device when fused).
            step = torch.zeros((), dtype=torch.float32) if self.exact else torch.tensor(0.0)
            optimizer.state[master] = {"step": step, "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq}
            optimizer.step()
            master.grad = None
        return out.view(param.shape).numpy()
