"""The trainer's optimizer step (`migrate.train.step.optimizer`): the gradients accumulated in
place, measured, clipped and stepped as torch's clip_grad_norm_ + AdamW step them, the
accumulators zeroed after every step (taken or skipped), GradScaler's finite check exact, and
the whole step as one graph only where no host decision can intervene. (That the one graph
gives the split graphs' numbers bit for bit: tests/test_step_profile.py, whose profiled run
is split and whose plain run is one graph.)
"""
from __future__ import annotations

from types import SimpleNamespace

import mindspore as ms
import numpy as np
import pytest
import torch
from mindspore import Parameter, ParameterTuple, Tensor

from migrate.train.optim import AdamW, GradClipper
from migrate.train.step.optimizer import OptimizerStep, one_graph_refusals

SHAPES = [(6, 5), (5,), (3, 4, 2)]


@pytest.fixture(autouse=True)
def graph_mode():
    previous = ms.get_context("mode")
    ms.set_context(mode=ms.GRAPH_MODE)
    yield
    ms.set_context(mode=previous)


def _setup(tag, grads, max_norm=1.0, unscale=False):
    rng = np.random.default_rng(0)
    weights = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    params = [Parameter(Tensor(w), name=f"{tag}.w{i}") for i, w in enumerate(weights)]
    optimizer = AdamW([{"params": params[::2], "weight_decay": 0.1}, {"params": params[1::2], "weight_decay": 0.0}],
                      lr=1e-2)
    by_name = dict(zip((p.name for p in params), grads, strict=True))
    acc = ParameterTuple([Parameter(Tensor(by_name[p.name].copy()), name=f"{tag}.acc{i}", requires_grad=False)
                          for i, p in enumerate(optimizer.parameters)])
    return weights, params, optimizer, OptimizerStep(GradClipper(max_norm, unscale=unscale), optimizer, acc)


def _grads(scale):
    rng = np.random.default_rng(1)
    return [(rng.standard_normal(s) * scale).astype(np.float32) for s in SHAPES]


@pytest.mark.parametrize("scale", [0.05, 3.0])  # below and above max_norm 1
def test_step_is_torch_clip_grad_norm_then_adamw(scale):
    grads = _grads(scale)
    weights, params, optimizer, step = _setup(f"torch{scale}", grads)
    norm = step.measure()
    clipped = step.finish(apply=True)

    tparams = [torch.nn.Parameter(torch.tensor(w)) for w in weights]
    topt = torch.optim.AdamW([{"params": tparams[::2], "weight_decay": 0.1},
                              {"params": tparams[1::2], "weight_decay": 0.0}], lr=1e-2)
    for p, g in zip(tparams, grads, strict=True):
        p.grad = torch.tensor(g)
    tnorm = float(torch.nn.utils.clip_grad_norm_(tparams, 1.0))
    tclipped = float(torch.nn.utils.get_total_norm([p.grad for p in tparams]))
    topt.step()

    assert norm == pytest.approx(tnorm, rel=1e-6) and clipped == pytest.approx(tclipped, rel=1e-6)
    assert (clipped < norm) == (tnorm > 1.0) and (clipped == norm) == (tnorm <= 1.0)  # below max_norm: untouched
    for p, t in zip(params, tparams, strict=True):
        np.testing.assert_allclose(p.asnumpy(), t.detach().numpy(), rtol=1e-6, atol=1e-7)
    assert optimizer.step_count == 1
    assert all(not a.asnumpy().any() for a in step.grads)  # zeroed for the next step's micro-batches


def test_a_skipped_step_measures_zeroes_and_changes_nothing():
    grads = _grads(3.0)
    weights, params, optimizer, step = _setup("skip", grads)
    norm = step.measure()
    clipped = step.finish(apply=False)
    assert norm > 1.0 and clipped == pytest.approx(1.0 * norm / (norm + 1e-6), rel=1e-6)
    assert optimizer.step_count == 0
    assert all(np.array_equal(p.asnumpy(), w) for p, w in zip(params, weights, strict=True))
    assert all(not m.asnumpy().any() for m in optimizer.exp_avg)
    assert all(not a.asnumpy().any() for a in step.grads)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_a_nonfinite_gradient_is_clipped_and_stepped_as_torch_does(bad):
    # Health policy warn steps on: clip_grad_norm_'s NaN norm makes every gradient NaN (every
    # weight NaN after AdamW); an inf norm makes the coefficient 0 (inf * 0 = NaN in that element
    # only). MindSpore's clamp returned 1 for a NaN coefficient, leaving all but one weight finite.
    grads = _grads(3.0)
    grads[1][2] = bad
    weights, params, _, step = _setup(f"bad{bad}", grads)
    step.measure()
    step.finish(apply=True)

    tparams = [torch.nn.Parameter(torch.tensor(w)) for w in weights]
    topt = torch.optim.AdamW([{"params": tparams[::2], "weight_decay": 0.1},
                              {"params": tparams[1::2], "weight_decay": 0.0}], lr=1e-2)
    for p, g in zip(tparams, grads, strict=True):
        p.grad = torch.tensor(g)
    torch.nn.utils.clip_grad_norm_(tparams, 1.0)
    topt.step()
    for p, t in zip(params, tparams, strict=True):
        ours, theirs = p.asnumpy(), t.detach().numpy()
        assert np.array_equal(np.isnan(ours), np.isnan(theirs)), p.name
        np.testing.assert_allclose(ours[~np.isnan(ours)], theirs[~np.isnan(theirs)], rtol=1e-6, atol=1e-7)
    assert np.isnan(params[0].asnumpy()).all() == (bad != np.inf)


def test_finite_check_is_gradscalers():
    # A finite element whose square overflows: the norm is inf, yet GradScaler steps.
    grads = _grads(0.05)
    grads[1][0] = 3e19
    _, _, _, step = _setup("huge", grads, unscale=True)
    norm = step.measure(inv_scale=1.0)
    assert norm == float("inf") and step.all_finite(norm)
    grads[1][0] = np.nan
    _, _, _, step = _setup("nan", grads, unscale=True)
    norm = step.measure(inv_scale=0.5)
    assert not np.isfinite(norm) and not step.all_finite(norm)
    _, _, _, step = _setup("fine", _grads(0.05), unscale=True)
    assert step.all_finite(step.measure(inv_scale=0.5))


@pytest.mark.slow
def test_unscaled_before_measuring_and_clipping():
    grads = _grads(3.0)
    _, _, _, plain = _setup("plain", grads)
    _, _, _, scaled = _setup("scaled", [g * 1024 for g in grads], unscale=True)
    assert scaled.measure(inv_scale=1 / 1024) == pytest.approx(plain.measure(), rel=1e-6)
    assert scaled.finish(apply=True) == pytest.approx(plain.finish(apply=True), rel=1e-6)


def _run(**changes):
    cfg = SimpleNamespace(health=SimpleNamespace(policy="warn"), grad_accum_steps=2)
    for key, value in changes.items():
        setattr(cfg.health if key == "policy" else cfg, key, value)
    params = [SimpleNamespace(shape=(1000, 1000))]
    return SimpleNamespace(cfg=cfg, scaler=None, model=SimpleNamespace(get_parameters=lambda: iter(params)),
                           micro=SimpleNamespace(grad_factors=None, accum_dtype="float32"))


@pytest.mark.parametrize("change, why", [
    ({}, None),
    ({"scaler": object()}, "fp16"),
    ({"policy": "skip"}, "health policy skip"),
    ({"parallel": object()}, "several processes"),
    ({"poisons": True}, "nan_grad"),
    ({"profile": True}, "--profile"),
    ({"grad_accum_steps": 9}, "9 micro-batches"),
    ({"big": True}, "40 M parameters"),
    ({"observed": True}, "a replay observes"),
    ({"grad_factors": (1.0, 1.01)}, "an injected gradient fault"),
    ({"accum_dtype": "bfloat16"}, "accumulates the gradients in bfloat16"),
])
def test_one_graph_only_where_no_host_decision_can_intervene(change, why):
    training = _run(**{k: v for k, v in change.items() if k in ("policy", "grad_accum_steps")})
    if "scaler" in change:
        training.scaler = change["scaler"]
    if "big" in change:
        training.model = SimpleNamespace(get_parameters=lambda: iter([SimpleNamespace(shape=(40_000, 1000))]))
    if "grad_factors" in change:
        training.micro.grad_factors = change["grad_factors"]
    if "accum_dtype" in change:
        training.micro.accum_dtype = change["accum_dtype"]
    reasons = one_graph_refusals(training, **{k: v for k, v in change.items() if k in ("parallel", "poisons",
                                                                                       "profile", "observed")})
    assert reasons == [] if why is None else (len(reasons) == 1 and why in reasons[0])
