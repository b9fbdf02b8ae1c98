"""torch's AdamW as `migrate diff --grads`'s reference (migrate/align/optimizer_reference.py): the float32
step is torch's default CPU AdamW to the bit, the float64 twin (torch's fused kernel) within float64
rounding of an unfused float64 step, and both far closer to each other than a wrong step."""
import numpy as np
import torch

from migrate.align.optimizer_reference import torch_adamw_step

SETTINGS = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)


def tensors():
    rng = np.random.default_rng(0)
    params = {"w": rng.standard_normal((64, 33)).astype(np.float32), "b": rng.standard_normal(7).astype(np.float32)}
    grads = {name: (rng.standard_normal(p.shape) * 1e-3).astype(np.float32) for name, p in params.items()}
    return params, grads


def torch_default(params, grads, dtype):
    out = {}
    for name, value in params.items():
        master = torch.from_numpy(value).to(dtype, copy=True).requires_grad_(True)
        master.grad = torch.from_numpy(grads[name]).to(dtype)
        torch.optim.AdamW([master], **SETTINGS).step()
        out[name] = master.detach().numpy()
    return out


def test_the_float32_step_is_torchs_default_and_the_twin_is_float64():
    params, grads = tensors()
    fp32 = torch_adamw_step(params, grads, **SETTINGS)
    exact = torch_adamw_step(params, grads, exact=True, **SETTINGS)
    default32, default64 = torch_default(params, grads, torch.float32), torch_default(params, grads, torch.float64)
    for name in params:
        assert fp32[name].dtype == np.float32 and exact[name].dtype == np.float64
        assert fp32[name].tobytes() == default32[name].tobytes()
        assert np.abs(exact[name] - default64[name]).max() <= 1e-15 * np.abs(default64[name]).max()
        gap = np.abs(fp32[name] - exact[name]).max()
        assert 0 < gap <= 1e-6 * np.abs(exact[name]).max()
        # a step with another learning rate is told apart by two orders of magnitude
        wrong = torch_adamw_step(params, grads, **{**SETTINGS, "lr": 1.1e-3})[name]
        assert np.abs(wrong - exact[name]).max() > 100 * gap
