"""The fused AdamW kernel (migrate/train/kernels/adamw.cc): the op-by-op graph's bits in one pass.

AdamW's element-wise chain is fourteen MindSpore CPU kernels per tensor; the fused kernel runs it
in one, operation for operation in the same fp32 order, so every parameter and moment must be bit
for bit what the graph gives (which tests/test_optimizer_step.py holds to torch). Where it cannot
be had the trainer falls back to the graph, and says nothing changes but time.
"""
import mindspore as ms
import numpy as np
import pytest
from mindspore import Parameter, Tensor

from migrate.errors import MigrateError
from migrate.train import kernels
from migrate.train.optim import AdamW

SHAPES = [(6, 5), (5,), (3, 4, 2), (70000,)]   # the last one over the threading threshold


@pytest.fixture(autouse=True)
def graph_mode():
    ms.set_context(mode=ms.GRAPH_MODE)
    yield
    ms.set_context(mode=ms.PYNATIVE_MODE)


def _trained(fused, steps=3, tag=""):
    rng = np.random.default_rng(0)
    params = [Parameter(Tensor(rng.standard_normal(s).astype(np.float32)), name=f"{tag}{fused}.w{i}")
              for i, s in enumerate(SHAPES)]
    opt = AdamW([{"params": params[::2], "weight_decay": 0.1}, {"params": params[1::2], "weight_decay": 0.0}],
                lr=1e-2, betas=(0.9, 0.95), eps=1e-8, fused=fused)
    for _ in range(steps):
        opt.step([Tensor(rng.standard_normal(p.shape).astype(np.float32)) for p in opt.parameters])
    return opt, [a.asnumpy() for a in (*opt.parameters, *opt.exp_avg, *opt.exp_avg_sq)]


def test_the_kernel_gives_the_graphs_bits():
    if kernels.build() is None:
        pytest.skip("no C++ compiler here: the graph runs (tested by test_optimizer_step.py)")
    fused, a = _trained(True)
    plain, b = _trained(False)
    assert fused.fused and not plain.fused
    for x, y in zip(a, b, strict=True):
        assert x.view(np.uint32).tobytes() == y.view(np.uint32).tobytes()


def test_a_tensor_of_another_shape_is_refused_not_read_past():
    op = kernels.adamw_op()
    if op is None:
        pytest.skip("no kernel here")
    small, big = Tensor(np.ones(4, np.float32)), Tensor(np.ones(8, np.float32))
    with pytest.raises(RuntimeError):
        out = op(big, small, big, big, Tensor(np.ones(8, np.float32)))
        out.asnumpy()


def test_without_a_compiler_the_graph_runs_the_same_step(tmp_path, monkeypatch):
    monkeypatch.setenv("MIGRATE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    assert kernels.build() is None and kernels.adamw_op() is None
    opt, _ = _trained(None, steps=1, tag="nocxx")
    assert opt.fused is False
    with pytest.raises(MigrateError, match="fused AdamW kernel is not available"):
        _trained(True, steps=1, tag="demand")


def test_the_switch_turns_it_off(monkeypatch):
    monkeypatch.setenv(kernels.ENV_SWITCH, "off")
    assert kernels.adamw_op() is None


def test_a_build_leaves_no_partial_file(tmp_path, monkeypatch):
    if kernels.compiler() is None:
        pytest.skip("no C++ compiler here")
    monkeypatch.setenv("MIGRATE_CACHE_DIR", str(tmp_path))
    built = kernels.build()
    assert built is not None and built.parent == tmp_path / "kernels"
    assert [p.name for p in (tmp_path / "kernels").iterdir()] == [built.name]
    assert kernels.build() == built  # the second use finds it
