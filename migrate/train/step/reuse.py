"""Compile a run's step once per process: a later run (or a fault that starts mid-run) whose step
graphs would be the same trains on the graphs already compiled, its own values loaded into them.

MindSpore compiles a graph per Cell instance; on a CPU that is most of a short run (a 2-layer
test model: ~7 s of compile, ~1 s of steps). A fresh build costs little without it, so a run is
always built fresh (`building.build_training`) and only then, where its graphs' `signature` equals
a held set's, its state is loaded into the held objects:

    training, graphs = adopt(fresh, fresh_graphs, held=None)

Every value the graphs read lives in Parameters (weights, moments, accumulators), copied from
the fresh objects; every setting they read is a host value taken from the fresh objects
(`AdamW.take_settings`, the clipper's) or a graph input (lr, betas, eps, bias correction, clip
max norm and epsilon). What a graph bakes in as a constant is in the signature: the model's
config, class and parameters, precision, recompute, LoRA, the accumulation divisor and dtype, a
gradient fault's factors, the decay groups, the fused AdamW kernel (it also clips and zeroes the
accumulators, unless a replay taps them: `micro.taps`), clip on/off, loss scaling,
one graph or split. A graph with randomness (dropout) is never reused: its RNG would go on.

Two holders: a run's own objects when a fault starting at step k rebuilds them (`held`: always,
e.g. `--fault beta2@3` changes graph inputs only and compiles nothing more), and, opt-in, the last
few runs of the process (`keep_compiled_steps()`: a sweep, a notebook, the test suite). With it on,
a finished run's live objects become the next matching run's; default off, a run holds nothing
after it returns.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
from collections import OrderedDict

import mindspore as ms

KEPT_RUNS = 4  # the runs whose compiled steps a process keeps by default (least recently used first out)
_kept: OrderedDict[tuple, _Kept] = OrderedDict()
_keeping = False
_limit = KEPT_RUNS


@dataclasses.dataclass
class _Kept:
    training: object
    graphs: object
    busy: bool = True  # a run trains on it: no other run may take it until `release`


@contextlib.contextmanager
def keep_compiled_steps(runs: int = KEPT_RUNS):
    """Inside: each run's compiled step is kept for later runs in this process whose graphs are the
    same, the last `runs` runs' at most. Leaving the outermost block forgets them.
    Dropping a kept run can cost more than its own graphs: in tests/test_replay.py, with four kept,
    the eviction of one made MindSpore compile another kept run's one-graph step anew (11 s) when
    it was taken up again; with more kept, it was not."""
    global _keeping, _limit
    before, limit_before = _keeping, _limit
    _keeping, _limit = True, runs
    try:
        yield
    finally:
        _keeping, _limit = before, limit_before
        if not before:
            _kept.clear()


def adopt(fresh, fresh_graphs, held=None) -> tuple:
    """(training, graphs) to train with: `held` (a (training, graphs) pair: the run's own), or a kept
    run no other run is using, when its signature is `fresh`'s -- with `fresh`'s values and settings
    loaded into it -- else the fresh pair (kept, when keeping)."""
    sig = signature(fresh, fresh_graphs)
    if sig is None:
        return fresh, fresh_graphs
    candidates = [held] if held is not None else []
    kept = _kept.get(sig) if _keeping else None
    if kept is not None and not kept.busy:
        candidates.append((kept.training, kept.graphs))
    for training, graphs in candidates:
        if signature(training, graphs) == sig and _load_into(training, graphs, fresh):
            if _keeping:
                _keep(sig, training, graphs)
            return _with_settings(training, fresh), graphs
    if _keeping:
        _keep(sig, fresh, fresh_graphs)
    return fresh, fresh_graphs


def release(training) -> None:
    """The run on `training`'s model has ended: its kept graphs may serve the next run."""
    for kept in _kept.values():
        if kept.training.model is training.model:
            kept.busy = False


def _keep(sig, training, graphs) -> None:
    _kept[sig] = _Kept(training, graphs)
    _kept.move_to_end(sig)
    while len(_kept) > _limit:
        _kept.popitem(last=False)


def signature(training, graphs) -> tuple | None:
    """Everything the step graphs bake in besides values; None: never reused (randomness inside)."""
    cfg, model, micro, opt, clipper = training.cfg, training.model, training.micro, training.optimizer, training.clipper
    if cfg.dropout or (cfg.lora is not None and cfg.lora.dropout):
        return None
    factors = None if micro.grad_factors is None else tuple(float(f.asnumpy()) for f in micro.grad_factors)
    return (
        ms.get_context("mode"), ms.get_context("device_target"), type(graphs).__qualname__,
        f"{type(model).__module__}.{type(model).__qualname__}",
        json.dumps(training.model_config.to_dict(), sort_keys=True, default=str),
        tuple((p.name, tuple(p.shape), str(p.dtype), bool(p.requires_grad)) for p in model.get_parameters()),
        cfg.seq_length, cfg.micro_batch_size, cfg.grad_accum_steps, cfg.dtype, bool(cfg.recompute),
        repr(cfg.lora), cfg.health.policy,
        micro.loss_divisor, micro.accum_dtype, factors, micro.taps is not None,
        tuple((tuple(g["names"]), g["weight_decay"] != 0) for g in opt.param_groups), opt.fused,
        clipper.max_norm is not None, clipper.unscale, training.scaler is not None,
    )


def _state(training) -> list:
    """Every Parameter a run's step graphs read or write, in a fixed order."""
    micro, opt = training.micro, training.optimizer
    return [*training.model.get_parameters(), *opt.exp_avg, *opt.exp_avg_sq, *micro.grads, *(micro.taps or ())]


def _graph_parameters(graphs) -> list:
    """The Parameters the compiled cells of `graphs` (`optimizer.StepGraphs`) hold."""
    return [p for cell in graphs.cells() for p in cell.get_parameters()]


def _load_into(held, held_graphs, fresh) -> bool:
    """Copy every state value of `fresh` into `held`'s Parameters; False (nothing copied) when the
    two do not pair up name for name and shape for shape, or the graphs hold a Parameter outside
    the state (a replay's taps) or one not in fp32 (MindSpore's CPU cannot copy bf16 here)."""
    mine, theirs = _state(held), _state(fresh)
    known = {id(p) for p in mine}
    if len(mine) != len(theirs) or any(id(p) not in known for p in _graph_parameters(held_graphs)) or any(
            a.name != b.name or tuple(a.shape) != tuple(b.shape) or a.dtype != b.dtype or a.dtype != ms.float32
            for a, b in zip(mine, theirs, strict=True)):
        return False
    for target, source in zip(mine, theirs, strict=True):
        if target is not source:
            target.set_data(source.value().copy())
    return True


def _with_settings(held, fresh):
    """`held`'s objects (whose graphs are compiled) doing what `fresh`'s do: host settings and the
    run's own host objects (config, schedule, loss scaler, plan, LoRA record) are `fresh`'s."""
    held.optimizer.take_settings(fresh.optimizer)
    vars(held.clipper).update(vars(fresh.clipper))
    return dataclasses.replace(fresh, model=held.model, micro=held.micro, optimizer=held.optimizer,
                               clipper=held.clipper)
