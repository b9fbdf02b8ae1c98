"""torch's AdamW as `migrate diff --grads`'s reference (migrate/align/optimizer_reference.py): the float32
step is torch's default CPU AdamW to the bit, the float64 twin (torch's fused kernel) within float64
rounding of an unfused float64 step, both far closer to each other than a wrong step -- and neither
the workspace kept across tensors nor stepping a tensor chunk by chunk changes any of it, whatever
order the shapes come in."""
import numpy as np
import pytest
import torch

from migrate.align.optimizer_reference import TensorByTensorAdamW

SETTINGS = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)


def tensors():
    rng = np.random.default_rng(0)
    shapes = {"w": (64, 33), "b": (7,), "v": (5, 3, 4)}  # large first: later ones reuse its dirty workspace
    params = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}
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


def stepped(params, grads, **settings):
    optimizer = TensorByTensorAdamW(**{**SETTINGS, **settings})
    return {name: optimizer.step(value, grads[name]).copy() for name, value in params.items()}


@pytest.mark.parametrize("chunk", [TensorByTensorAdamW.CHUNK, 100, 7])  # w: 21 chunks of 100 and 12 over
def test_the_float32_step_is_torchs_default_and_the_twin_is_float64(chunk):
    params, grads = tensors()
    fp32, exact = stepped(params, grads, chunk=chunk), stepped(params, grads, exact=True, chunk=chunk)
    default32, default64 = torch_default(params, grads, torch.float32), torch_default(params, grads, torch.float64)
    wrong_lr = stepped(params, grads, lr=1.1e-3)
    for name in params:
        assert fp32[name].dtype == np.float32 and exact[name].dtype == np.float64
        assert fp32[name].shape == params[name].shape
        assert fp32[name].tobytes() == default32[name].tobytes()
        assert np.abs(exact[name] - default64[name]).max() <= 1e-15 * np.abs(default64[name]).max()
        gap = np.abs(fp32[name] - exact[name]).max()
        assert 0 < gap <= 1e-6 * np.abs(exact[name]).max()
        # a step with another learning rate is told apart by two orders of magnitude
        assert np.abs(wrong_lr[name] - exact[name]).max() > 100 * gap


@pytest.mark.parametrize("chunk", [TensorByTensorAdamW.CHUNK, 100])
def test_the_workspace_leaves_no_trace_between_tensors(chunk):
    """The same tensor stepped again after others gives the same bytes: moments start at zero each time
    (each chunk), and the inputs are never written."""
    params, grads = tensors()
    before = {name: p.copy() for name, p in params.items()}
    grads_before = {name: g.copy() for name, g in grads.items()}
    optimizer = TensorByTensorAdamW(**SETTINGS, chunk=chunk)
    first = optimizer.step(params["b"], grads["b"]).copy()
    for name in ("w", "v", "b"):
        last = optimizer.step(params[name], grads[name])
    assert last.tobytes() == first.tobytes()
    assert all(params[name].tobytes() == before[name].tobytes() for name in params)
    assert all(grads[name].tobytes() == grads_before[name].tobytes() for name in grads)  # read in place
