"""torch's AdamW as the reference optimizer of `migrate diff --grads`.

The converted model's parameters and MindSpore's gradients, stepped once by
`torch.optim.AdamW` (fp32 master copies, as mixed precision keeps them; float64 for the noise
reference), give what MindSpore's AdamW step must produce from the same state.
"""
from __future__ import annotations

import numpy as np
import torch


class TensorByTensorAdamW:
    """One torch AdamW step of one tensor at a time (float32; float64 with `exact`), on one workspace
    kept across the tensors.

    float32 is torch's default CPU AdamW (one op per pass, the rounding `migrate train`'s AdamW
    matches). The float64 twin, the noise reference's truth, is torch's fused CPU kernel: one pass
    instead of about eight (0.45 against 0.72 s on a 28 M-element tensor here); its difference from
    the unfused float64 step (~1e-16 relative) is nothing beside float32's (~1e-7).

    `migrate diff --grads` steps the model tensor by tensor; fresh master, gradient and moment
    tensors for each one were the larger part of the reference's time at 254 M (glibc maps and
    unmaps each large block, so every step paid first-touch page faults on all four). Here the
    moments start as zeroed views of the workspace, torch's own lazy initialisation skipped with
    the same values, so the step rounds exactly as a fresh optimizer's does.

    The array `step` returns is a view of the workspace: valid until the next call."""

    SLOTS = 4  # master, gradient, exp_avg, exp_avg_sq

    def __init__(self, *, lr: float, betas, eps: float, weight_decay: float, exact: bool = False):
        self.exact = exact
        self.dtype = torch.float64 if exact else torch.float32
        self.settings = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay}
        self._space = torch.empty(0, dtype=self.dtype)

    def _views(self, shape) -> list[torch.Tensor]:
        n = int(np.prod(shape, dtype=np.int64))
        if self._space.numel() < self.SLOTS * n:
            self._space = torch.empty(self.SLOTS * n, dtype=self.dtype)
        return [self._space[i * n:(i + 1) * n].view(shape) for i in range(self.SLOTS)]

    def step(self, param: np.ndarray, grad: np.ndarray) -> np.ndarray:
        param, grad = np.asarray(param), np.asarray(grad)
        master, gradient, exp_avg, exp_avg_sq = self._views(param.shape)
        master.copy_(torch.from_numpy(param))
        gradient.copy_(torch.from_numpy(grad))
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
        return master.numpy()
