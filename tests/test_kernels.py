"""The projection and attention kernels (`LinearKernel`, `MatMulKernel`: MatMul/BatchMatMul ops with
the transposes as attributes) give what mint's linear (the Dense op) and mint.matmul give, forward
and every gradient, with and without a bias, over 2-d, 3-d and 4-d inputs: bit for bit in
GRAPH_MODE (where MindSpore expands those into the same ops), within float32 rounding in PyNative
(where they run kernels of their own, which at small shapes sum in another order)."""
import mindspore as ms
import numpy as np
import pytest
from mindspore import mint, nn

from migrate.models.kernels import LinearKernel, MatMulKernel
from migrate.models.mode import execution_mode


def _dense(a, b, c):
    return mint.nn.functional.linear(a, b, c)


def _dense_no_bias(a, b, c):
    return mint.nn.functional.linear(a, b)


def _matmul(a, b, c):
    return mint.matmul(a, b)


def _matmul_bt(a, b, c):
    return mint.matmul(a, b.swapaxes(-1, -2))


def _transposed():
    return MatMulKernel(transpose_b=True)


# kind -> (our kernel, mint's form of the same product, shape of a, shape of b)
CASES = {
    "linear_2d": (LinearKernel, _dense, (6, 24), (40, 24)),
    "linear_3d": (LinearKernel, _dense, (2, 5, 24), (40, 24)),
    "linear_bias": (LinearKernel, _dense, (2, 5, 24), (40, 24)),
    "tied_head": (_transposed, _dense_no_bias, (2, 5, 24), (40, 24)),
    "scores": (_transposed, _matmul_bt, (2, 3, 7, 8), (2, 3, 9, 8)),
    "mix": (MatMulKernel, _matmul, (2, 3, 7, 9), (2, 3, 9, 8)),
}


class _Project(nn.Cell):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def construct(self, a, b, c):
        return self.fn(a, b, c)


class _Loss(nn.Cell):
    """A weighted sum of the product, so every gradient element carries its own weight."""

    def __init__(self, project, scale):
        super().__init__()
        self.project = project
        self.scale = scale

    def construct(self, a, b, c):
        return (self.project(a, b, c) * self.scale).sum()


class _Ours(nn.Cell):
    def __init__(self, kernel):
        super().__init__()
        self.kernel = kernel
        self.takes_bias = isinstance(kernel, LinearKernel)

    def construct(self, a, b, c):
        if self.takes_bias:
            return self.kernel(a, b, c)
        return self.kernel(a, b)


def _value_and_grads(project, a, b, c, scale):
    args = [ms.Tensor(a), ms.Tensor(b), None if c is None else ms.Tensor(c)]
    out = project(*args)
    grads = ms.grad(_Loss(project, ms.Tensor(scale)), grad_position=(0, 1) if c is None else (0, 1, 2))(*args)
    return [out.asnumpy()] + [g.asnumpy() for g in grads]


@pytest.mark.parametrize("mode", ["graph", "pynative"])
@pytest.mark.parametrize("kind", list(CASES))
def test_kernels_match_mint(mode, kind):
    make, reference, a_shape, b_shape = CASES[kind]
    rng = np.random.default_rng(len(kind))
    a = rng.standard_normal(a_shape).astype(np.float32)
    b = (rng.standard_normal(b_shape) * 0.1).astype(np.float32)
    c = (rng.standard_normal(b_shape[0]) * 0.1).astype(np.float32) if kind == "linear_bias" else None
    with execution_mode(mode):
        want_out = _Project(reference)(*[None if x is None else ms.Tensor(x) for x in (a, b, c)])
        scale = rng.standard_normal(want_out.shape).astype(np.float32)
        want = _value_and_grads(_Project(reference), a, b, c, scale)
        got = _value_and_grads(_Ours(make()), a, b, c, scale)
    assert len(got) == len(want) == (4 if c is not None else 3)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        if mode == "graph":
            np.testing.assert_array_equal(g, w)
        else:
            np.testing.assert_allclose(g, w, rtol=0, atol=4e-7 * max(1.0, float(np.abs(w).max())))
    assert np.abs(want[1]).max() > 0 and np.abs(want[2]).max() > 0   # gradients that carry figures
