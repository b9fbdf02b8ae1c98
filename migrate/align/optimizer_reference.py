"""torch's AdamW as the reference optimizer of `migrate diff --grads`.

The converted model's parameters and MindSpore's gradients, stepped once by
`torch.optim.AdamW` (fp32 master copies, as mixed precision keeps them; float64 for the noise
reference), give what MindSpore's AdamW step must produce from the same state.
"""
from __future__ import annotations

import numpy as np
import torch


def torch_adamw_step(params: dict[str, np.ndarray], grads: dict[str, np.ndarray], *, lr: float, betas,
                     eps: float, weight_decay: float, exact: bool = False) -> dict[str, np.ndarray]:
    """The parameters after one torch AdamW step from `grads`, by name (float32; float64 with exact).

    float32 is torch's default CPU AdamW (one op per pass, the rounding `migrate train`'s AdamW
    matches). The float64 twin, the noise reference's truth, is torch's fused CPU kernel: one pass
    instead of about eight (0.45 against 0.72 s on a 28 M-element tensor here); its difference from
    the unfused float64 step (~1e-16 relative) is nothing beside float32's (~1e-7)."""
    dtype = torch.float64 if exact else torch.float32
    names = list(params)
    masters = []
    for name in names:
        # One copy: widened to float64 and cloned was two of every parameter for the noise reference.
        master = torch.from_numpy(np.asarray(params[name])).to(dtype, copy=True).requires_grad_(True)
        master.grad = torch.from_numpy(np.asarray(grads[name])).to(dtype)
        masters.append(master)
    torch.optim.AdamW(masters, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, fused=exact or None).step()
    return {name: m.detach().numpy() for name, m in zip(names, masters, strict=True)}
