"""The models' fused CPU ops (migrate/models/fused_ops.cc): RMSNorm, the rotary and softmax's
gradient, each one kernel where the op-by-op graph ran three to eighteen.

The rotary is products and sums of two, so it must give the graph's bits both ways. The norm and
the softmax gradient sum in their own order: within float32 rounding of the graph and of torch's
autograd over HF's formulas. A whole Llama's loss and gradients must be the op-by-op model's within
rounding, and the kernels must refuse shapes they were not written for instead of reading past them.
"""
import mindspore as ms
import numpy as np
import pytest
import torch
from mindspore import Tensor, mint, nn

from migrate import native
from migrate.models import fused_ops
from migrate.models.config import LlamaConfig
from migrate.models.kernels import FusedSoftmaxKernel, SoftmaxKernel
from migrate.models.llama import LlamaForCausalLM
from migrate.models.mode import execution_mode
from migrate.models.rotary import rotate_half

EPS = 1e-5


@pytest.fixture(autouse=True)
def kernels_built():
    if native.build(fused_ops.SOURCE) is None:
        pytest.skip("no C++ compiler here: the models run op by op (every other model test)")


class _Fn(nn.Cell):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def construct(self, *args):
        return self.fn(*args)


class _Weighted(nn.Cell):
    """sum(f(args) * scale): every output element's gradient carries its own weight."""

    def __init__(self, cell, scale):
        super().__init__()
        self.cell = cell
        self.scale = scale

    def construct(self, *args):
        return (self.cell(*args) * self.scale).sum()


def _out_and_grads(cell, args, scale, positions):
    tensors = [Tensor(a) for a in args]
    out = cell(*tensors)
    grads = ms.grad(_Weighted(cell, Tensor(scale)), grad_position=positions)(*tensors)
    grads = grads if isinstance(grads, tuple) else (grads,)
    return [out.asnumpy()] + [g.asnumpy() for g in grads]


class _OpNorm(nn.Cell):
    def construct(self, x, w):
        return w * (x * mint.rsqrt(mint.mean(x * x, -1, keepdim=True) + EPS))


class _FusedNorm(nn.Cell):
    def __init__(self):
        super().__init__()
        self.op = fused_ops.rms_norm_op()
        self.eps = Tensor([EPS], ms.float32)

    def construct(self, x, w):
        return self.op(x, w, self.eps)


def _op_rotary(x, cos, sin):
    return x * cos + rotate_half(x) * sin


def _torch_norm(x, w, scale):
    x, w = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    out = w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS))   # HF LlamaRMSNorm, float32
    (out * torch.tensor(scale)).sum().backward()
    return [out.detach().numpy(), x.grad.numpy(), w.grad.numpy()]


def _torch_softmax(x, scale):
    x = torch.tensor(x, requires_grad=True)
    out = torch.softmax(x, -1)
    (out * torch.tensor(scale)).sum().backward()
    return [out.detach().numpy(), x.grad.numpy()]


def _close(got, want, ulps=8.0):
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype == np.float32
        assert np.abs(w).max() > 0
        np.testing.assert_allclose(g, w, rtol=0, atol=ulps * 2.0 ** -23 * float(np.abs(w).max()))


@pytest.mark.parametrize("mode", ["graph", "pynative"])
@pytest.mark.parametrize("tables", ["shared", "per_row"])
def test_the_rotary_gives_the_graphs_bits_both_ways(mode, tables):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 5, 8)).astype(np.float32)
    table_shape = (5, 8) if tables == "shared" else (2, 1, 5, 8)   # training; a KV-cache step's positions
    angles = rng.uniform(-3, 3, table_shape).astype(np.float32)
    cos, sin = np.cos(angles), np.sin(angles)
    scale = rng.standard_normal(x.shape).astype(np.float32)
    with execution_mode(mode):
        got = _out_and_grads(_Fn(fused_ops.rotary_op()), (x, cos, sin), scale, 0)
        want = _out_and_grads(_Fn(_op_rotary), (x, cos, sin), scale, 0)
    for g, w in zip(got, want, strict=True):
        assert g.view(np.uint32).tobytes() == w.view(np.uint32).tobytes()
    assert np.abs(got[1]).max() > 0


@pytest.mark.parametrize("mode", ["graph", "pynative"])
def test_the_norm_agrees_with_the_graph_and_torch_within_rounding(mode):
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((3, 7, 40)) * 3).astype(np.float32)
    w = rng.normal(1.0, 0.2, 40).astype(np.float32)
    scale = rng.standard_normal(x.shape).astype(np.float32)
    with execution_mode(mode):
        got = _out_and_grads(_FusedNorm(), (x, w), scale, (0, 1))
        graph = _out_and_grads(_OpNorm(), (x, w), scale, (0, 1))
    torch_figures = _torch_norm(x, w, scale)
    _close(got, graph)
    _close(got, torch_figures)


@pytest.mark.parametrize("mode", ["graph", "pynative"])
def test_the_softmax_gradient_agrees_with_the_graph_and_torch_within_rounding(mode):
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((2, 3, 6, 11)) * 4).astype(np.float32)
    scale = rng.standard_normal(x.shape).astype(np.float32)
    with execution_mode(mode):
        fused = _out_and_grads(FusedSoftmaxKernel(fused_ops.softmax_grad_op()), (x,), scale, 0)
        graph = _out_and_grads(SoftmaxKernel(), (x,), scale, 0)
    np.testing.assert_array_equal(fused[0], graph[0])   # the forward is MindSpore's own softmax
    _close(fused, graph)
    _close(fused, _torch_softmax(x, scale))


def _llama(fused: bool, **change):
    cfg = LlamaConfig(vocab_size=96, hidden_size=48, intermediate_size=80, num_layers=2, num_heads=6,
                      n_kv_heads=2, seq_length=16, rms_norm_eps=EPS, **change)
    model = LlamaForCausalLM(cfg, seed=11)
    if fused:
        # 2 layers x (2 norms, q and k share one rotary cell, 1 softmax) + the final norm
        assert fused_ops.use_fused_ops(model) == 2 * 4 + 1
    return model


class _LmLoss(nn.Cell):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def construct(self, ids):
        return self.model(ids, None, ids)[1]


def _loss_and_grads(model, ids):
    params = model.trainable_params()
    grad_fn = ms.value_and_grad(_LmLoss(model), None, params)
    loss, grads = grad_fn(ids)
    return float(loss.asnumpy()), {p.name: g.asnumpy() for p, g in zip(params, grads, strict=True)}


@pytest.mark.parametrize("mode", ["graph", "pynative"])
def test_a_llama_trains_the_same_fused_or_op_by_op(mode):
    ids = Tensor(np.random.default_rng(6).integers(0, 96, (2, 16)).astype(np.int32))
    with execution_mode(mode):
        fused = _llama(True)
        plain = _llama(False)
        layer = fused.model.layers[0]
        assert layer.attention_norm.fused is not None and layer.attention.rotary.fused is not None
        assert isinstance(layer.attention.softmax, FusedSoftmaxKernel)
        assert plain.model.layers[0].attention_norm.fused is None
        assert type(plain.model.layers[0].attention.softmax) is SoftmaxKernel
        loss_f, grads_f = _loss_and_grads(fused, ids)
        loss_p, grads_p = _loss_and_grads(plain, ids)
    assert abs(loss_f - loss_p) <= 1e-6 * abs(loss_p)
    assert grads_f.keys() == grads_p.keys()
    for name, want in grads_p.items():
        assert np.abs(want).max() > 0, name
        np.testing.assert_allclose(grads_f[name], want, rtol=0, atol=4e-6 * float(np.abs(want).max()), err_msg=name)


def test_a_damaged_gradient_is_caught_by_the_comparison():
    """The comparison above can fail: the norm's gradient off by one part in 10^4 is seen."""
    ids = Tensor(np.random.default_rng(6).integers(0, 96, (2, 16)).astype(np.int32))
    with execution_mode("pynative"):
        plain = _llama(False)
        _, grads = _loss_and_grads(plain, ids)
    name = next(n for n in grads if "attention_norm" in n)
    damaged = grads[name] * (1 + 1e-4)
    with pytest.raises(AssertionError):
        np.testing.assert_allclose(damaged, grads[name], rtol=0, atol=4e-6 * float(np.abs(grads[name]).max()))


@pytest.mark.parametrize("case", ["odd_head_dim", "table_of_another_length", "norm_weight_too_short"])
def test_shapes_the_kernels_were_not_written_for_are_refused(case):
    with execution_mode("pynative"), pytest.raises(RuntimeError):
        if case == "odd_head_dim":
            out = fused_ops.rotary_op()(Tensor(np.ones((1, 2, 3, 5), np.float32)),
                                        Tensor(np.ones((3, 5), np.float32)), Tensor(np.ones((3, 5), np.float32)))
        elif case == "table_of_another_length":
            out = fused_ops.rotary_op()(Tensor(np.ones((1, 2, 3, 4), np.float32)),
                                        Tensor(np.ones((4, 4), np.float32)), Tensor(np.ones((4, 4), np.float32)))
        else:
            out = fused_ops.rms_norm_op()(Tensor(np.ones((2, 8), np.float32)), Tensor(np.ones(4, np.float32)),
                                          Tensor([EPS], ms.float32))
        out.asnumpy()


def test_switched_off_or_without_a_compiler_the_models_run_op_by_op(tmp_path, monkeypatch):
    monkeypatch.setenv(fused_ops.ENV_SWITCH, "off")
    assert fused_ops.rms_norm_op() is None and fused_ops.rotary_op() is None and fused_ops.softmax_grad_op() is None
    assert fused_ops.use_fused_ops(_llama(False)) == 0
    monkeypatch.delenv(fused_ops.ENV_SWITCH)
    monkeypatch.setenv("MIGRATE_CACHE_DIR", str(tmp_path))   # nothing built there, and nothing to build with
    monkeypatch.setattr(native, "compiler", lambda: None)
    assert fused_ops.rms_norm_op() is None and fused_ops.softmax_grad_op() is None
    model = _llama(False)
    assert fused_ops.use_fused_ops(model) == 0
    assert model.model.layers[0].attention_norm.fused is None
    assert type(model.model.layers[0].attention.softmax) is SoftmaxKernel


def test_cells_that_compute_otherwise_keep_their_ops():
    """Gemma's (1 + weight) norm and an emulated-bf16 model's rounding are not the kernels' float32."""
    gemma = _llama(False, rms_norm_unit_offset=True)
    fused_ops.use_fused_ops(gemma)
    assert gemma.model.layers[0].attention_norm.fused is None
    assert gemma.model.layers[0].attention.rotary.fused is not None
    low = _llama(False, compute_dtype="bfloat16")
    fused_ops.use_fused_ops(low)
    assert low.model.norm_out.fused is None and low.model.layers[0].attention.rotary.fused is None


def test_the_trainer_builds_its_model_with_the_fused_ops(tmp_path):
    from migrate.demo_train import prepare
    from migrate.train.building import build_training
    from migrate.train.config import RunConfig

    training = build_training(RunConfig.load(prepare(tmp_path / "demo")))
    layer = training.model.model.layers[0]
    assert layer.attention_norm.fused is not None and layer.attention.rotary.fused is not None
    assert isinstance(layer.attention.softmax, FusedSoftmaxKernel)
