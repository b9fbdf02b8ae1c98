"""The projection kernels: `LinearKernel` (a 2-d MatMul with Wᵀ as the op's attribute) and a tied
head's `MatMulKernel(transpose_b=True)` give mint's linear (the Dense op) forward and every
gradient, with and without a bias, over 2-d and 3-d inputs: bit for bit in GRAPH_MODE (where
MindSpore expands Dense into the same MatMul), within float32 rounding in PyNative (where Dense
runs a kernel of its own, which at small shapes sums in another order)."""
import mindspore as ms
import numpy as np
import pytest
from mindspore import mint, nn

from migrate.models.kernels import LinearKernel, MatMulKernel
from migrate.models.mode import execution_mode


class _Loss(nn.Cell):
    """A weighted sum of the projection, so every gradient element carries its own weight."""

    def __init__(self, project, scale):
        super().__init__()
        self.project = project
        self.scale = scale

    def construct(self, x, weight, bias):
        return (self.project(x, weight, bias) * self.scale).sum()


class _Dense(nn.Cell):
    def construct(self, x, weight, bias):
        return mint.nn.functional.linear(x, weight, bias)


class _Ours(nn.Cell):
    def __init__(self, kernel):
        super().__init__()
        self.kernel = kernel

    def construct(self, x, weight, bias):
        return self.kernel(x, weight) if isinstance(self.kernel, MatMulKernel) else self.kernel(x, weight, bias)


def _value_and_grads(project, x, weight, bias, scale):
    loss = _Loss(project, ms.Tensor(scale))
    args = [ms.Tensor(a) for a in (x, weight)] + [None if bias is None else ms.Tensor(bias)]
    positions = (0, 1) if bias is None else (0, 1, 2)
    out = project(*args)
    grads = ms.grad(loss, grad_position=positions)(*args)
    return [out.asnumpy()] + [g.asnumpy() for g in grads]


@pytest.mark.parametrize("mode", ["graph", "pynative"])
@pytest.mark.parametrize("shape", [(6, 24), (2, 5, 24)])
@pytest.mark.parametrize("kind", ["linear", "linear_bias", "tied_head"])
def test_projection_kernels_match_dense(mode, shape, kind):
    rng = np.random.default_rng(len(shape) * 10 + len(kind))
    x = rng.standard_normal(shape).astype(np.float32)
    weight = (rng.standard_normal((40, 24)) * 0.1).astype(np.float32)
    bias = (rng.standard_normal(40) * 0.1).astype(np.float32) if kind == "linear_bias" else None
    scale = rng.standard_normal(shape[:-1] + (40,)).astype(np.float32)
    kernel = MatMulKernel(transpose_b=True) if kind == "tied_head" else LinearKernel()
    with execution_mode(mode):
        want = _value_and_grads(_Dense(), x, weight, bias, scale)
        got = _value_and_grads(_Ours(kernel), x, weight, bias, scale)
    assert len(got) == len(want) == (4 if bias is not None else 3)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        if mode == "graph":
            np.testing.assert_array_equal(g, w)
        else:
            np.testing.assert_allclose(g, w, rtol=0, atol=4e-7 * max(1.0, float(np.abs(w).max())))
    assert np.abs(want[1]).max() > 0 and np.abs(want[2]).max() > 0   # gradients that carry figures

