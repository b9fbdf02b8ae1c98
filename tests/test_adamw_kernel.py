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

from migrate import native
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
        out = op(big, small, big, big, Tensor(np.ones(9, np.float32)), Tensor(np.ones(1, np.float32)))
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
    if native.compiler() is None:
        pytest.skip("no C++ compiler here")
    monkeypatch.setenv("MIGRATE_CACHE_DIR", str(tmp_path))
    built = kernels.build()
    assert built is not None and built.parent == tmp_path / "kernels"
    assert [p.name for p in (tmp_path / "kernels").iterdir()] == [built.name]
    assert kernels.build() == built  # the second use finds it


# ---------- the clip folded into the kernel (migrate/train/step/optimizer.py, fold) ----------
INV_SCALE = 1 / 3000  # not a power of two: (g * inv_scale) * coef rounds unlike g * (inv_scale * coef)


def _clip_run(fused, tag, max_norm=1.0, unscale=False, applied=(True, True), scale=3.0):
    """Steps of OptimizerStep over accumulator Parameters refilled before each: ((norm, clipped) per
    step, the step, bits of parameters and moments)."""
    from mindspore import ParameterTuple

    from migrate.train.optim import GradClipper
    from migrate.train.step.optimizer import OptimizerStep

    rng = np.random.default_rng(0)
    params = [Parameter(Tensor(rng.standard_normal(s).astype(np.float32)), name=f"{tag}{fused}.w{i}")
              for i, s in enumerate(SHAPES)]
    opt = AdamW([{"params": params[::2], "weight_decay": 0.1}, {"params": params[1::2], "weight_decay": 0.0}],
                lr=1e-2, betas=(0.9, 0.95), eps=1e-8, fused=fused)
    acc = ParameterTuple([Parameter(Tensor(np.zeros(p.shape, np.float32)), name=f"{tag}{fused}.acc{i}",
                                    requires_grad=False) for i, p in enumerate(opt.parameters)])
    step = OptimizerStep(GradClipper(max_norm, unscale=unscale), opt, acc)
    inv = INV_SCALE if unscale else 1.0
    grads = np.random.default_rng(1)
    norms = []
    for apply in applied:
        for a in acc:
            a.set_data(Tensor((grads.standard_normal(a.shape) * scale / inv).astype(np.float32)))
        norm = step.measure(inv)
        norms.append((norm, step.finish(apply)))
        assert all(not a.asnumpy().any() for a in acc), "the accumulators are zeroed for the next step"
    return norms, step, [a.asnumpy() for a in (*opt.parameters, *opt.exp_avg, *opt.exp_avg_sq)]


def _same_bits(a, b):
    return all(x.view(np.uint32).tobytes() == y.view(np.uint32).tobytes() for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("max_norm, unscale", [(1.0, False), (1e6, False), (1.0, True), (None, False)])
def test_the_kernel_clips_with_the_graphs_bits(max_norm, unscale):
    """max_norm 1: every step clips (norm ~800); 1e6: the coefficient is 1; None: no clip."""
    if kernels.build() is None:
        pytest.skip("no C++ compiler here")
    tag = f"clip{max_norm}{unscale}"
    fused_norms, fused_step, fused = _clip_run(True, tag, max_norm, unscale)
    graph_norms, graph_step, graph = _clip_run(False, tag, max_norm, unscale)
    assert fused_step.step_cell.fold and not graph_step.step_cell.fold
    assert _same_bits(fused, graph)
    for (norm, clipped), (graph_norm, graph_clipped) in zip(fused_norms, graph_norms, strict=True):
        assert norm == graph_norm
        assert clipped == pytest.approx(graph_clipped, rel=1e-6)
        if max_norm == 1.0:
            assert clipped == pytest.approx(norm / (norm + 1e-6), rel=1e-6)
        else:
            assert clipped == norm  # nothing scaled: the norm is the total norm, bit for bit as torch's
    again, _, _ = _clip_run(True, tag + "again", max_norm, unscale)
    assert again == fused_norms  # the kernel's sums do not depend on its threads


def test_the_clip_changes_the_step():
    """Fails if the kernel left the coefficient out: the first moment is (1 - b1) * clipped gradient."""
    if kernels.build() is None:
        pytest.skip("no C++ compiler here")
    (clipped_norms, *_), _, clipped = _clip_run(True, "coef", 1.0, applied=(True,))
    _, _, unclipped = _clip_run(True, "nocoef", None, applied=(True,))
    norm = clipped_norms[0]
    count = len(SHAPES)
    exp_avg, plain_exp_avg = clipped[count:2 * count], unclipped[count:2 * count]
    for m, plain in zip(exp_avg, plain_exp_avg, strict=True):
        np.testing.assert_allclose(m, plain * (1.0 / (norm + 1e-6)), rtol=1e-5, atol=1e-12)
        assert not np.allclose(m, plain)


def test_a_skipped_step_clips_and_zeroes_but_changes_nothing_then_steps_as_the_graph():
    if kernels.build() is None:
        pytest.skip("no C++ compiler here")
    fused_norms, fused_step, fused = _clip_run(True, "skip", applied=(False, True))
    graph_norms, _, graph = _clip_run(False, "skip", applied=(False, True))
    (norm, clipped), _ = fused_norms
    assert clipped == pytest.approx(norm / (norm + 1e-6), rel=1e-6)
    assert fused_step.optimizer.step_count == 1
    assert _same_bits(fused, graph)
    assert fused_norms[0] == graph_norms[0]  # the skip runs the graph's clip on both


def test_the_kernel_scales_value_gradients_as_the_graph_multiplies_and_leaves_them_alone():
    """The one-graph step's call: gradients that are values, scaled (g * inv_scale) * coef, never zeroed."""
    if kernels.build() is None:
        pytest.skip("no C++ compiler here")
    fused, _ = _trained(True, steps=0, tag="values")
    plain, _ = _trained(False, steps=0, tag="values")
    rng = np.random.default_rng(2)
    grads = [rng.standard_normal(p.shape).astype(np.float32) for p in fused.parameters]
    inv, coef = np.float32(INV_SCALE), np.float32(0.37)
    given = ms.mutable(tuple(Tensor(g.copy()) for g in grads))
    sums = fused.update(given, *fused.advance(), Tensor(inv), Tensor(coef), False)
    plain.step([Tensor((g * inv) * coef) for g in grads])
    assert _same_bits([a.asnumpy() for a in (*fused.parameters, *fused.exp_avg, *fused.exp_avg_sq)],
                      [a.asnumpy() for a in (*plain.parameters, *plain.exp_avg, *plain.exp_avg_sq)])
    assert _same_bits([t.asnumpy() for t in given], grads)
    want = [float(np.sum(((g * inv) * coef).astype(np.float64) ** 2)) for g in grads]
    np.testing.assert_allclose([float(s.asnumpy()[0]) for s in sums], want, rtol=1e-6)
