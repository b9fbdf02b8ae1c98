"""The optimizer step after the micro-batches: one compiled graph, or two around the host's decision.

    graphs = step_graphs(training, parallel=..., poisons=..., profile=...)  # OneGraphStep or SplitSteps
    losses = graphs.forward_backward(batch, scale)   # each micro-batch's loss
    graphs.reduce_grads(parallel.reduce_grads)       # several processes: the gradients' mean over dp
    graphs.poison_grad()                             # step fault nan_grad
    norm = graphs.measure(inv_scale); clipped = graphs.finish(apply)

Both implementations have that one interface (`StepGraphs`); the one graph refuses, in one
line, what only the split step can do (`one_graph_refusals` keeps such runs off it).

Most runs (fp32/bf16, health policy warn, one process, at most 8 micro-batches, up to 32 M
parameters) run the whole step as ONE graph (`WholeStep`): nothing on the host can stop the
step, so nothing waits for it; `bench/ms_floor.py` times that cell alone. The others run it
split (`SplitSteps`), the host deciding between graphs:

    step = OptimizerStep(clipper, optimizer, grads)  # grads: the MicroStep's accumulators
    norm = step.measure(inv_scale)     # graph 1: total gradient norm (unscaled first in fp16)
    finite = step.all_finite(norm)     # fp16 only: GradScaler's inf/nan check
    ... the health watch and the fp16 scaler decide on the host ...
    clipped = step.finish(apply)       # graph 2: clip, clipped norm, AdamW when apply, accumulators zeroed

There the accumulated gradients never leave the device as a tuple: the micro-steps add into
Parameters (`steps.MicroStep.grads`), these graphs read them in place and the second one
zeroes them for the next step. Both ways run the same graph code (`grad_norm`,
`clip_and_step`) and give the same numbers bit for bit.

With the fused AdamW kernel (`optim._FusedAdamWUpdate`) the second graph is the norm's pass plus
one pass per tensor: the kernel unscales and clips each gradient on its way in (the graph's fp32
multiplies, so parameters and moments keep their bits), returns its sum of squares for the clipped
norm and, split, zeroes the accumulator in place. That clipped norm is summed in double over fixed
blocks, so it differs from the op graph's fp32 row sums in the last bits (a logged metric, held to
torch's with a tolerance); where the coefficient is 1 it is the total norm, as in torch. A replay's
tap and a skipped step keep the graph's clip.

Numbers, as torch forms them: the norm is clip_grad_norm_'s (the norm of the per-tensor
norms), the coefficient is max_norm * reciprocal(norm + eps) clamped at 1 (a NaN stays NaN, as
in torch), the gradients are multiplied by it, and the clipped norm is measured on the clipped
tensors. Each per-tensor norm sums rows first: MindSpore's CPU ReduceSum over a whole tensor runs on one thread
(measured 12x slower at 115 M parameters); the result differs only in rounding.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Protocol

import mindspore as ms
import numpy as np
from mindspore import Parameter, ParameterTuple, Tensor, nn, ops
from mindspore.common.initializer import initializer

from migrate.errors import MigrateError

_norm = ops.MultitypeFuncGraph("migrate_norm")
_all_finite = ops.MultitypeFuncGraph("migrate_all_finite")
_zero_after = ops.MultitypeFuncGraph("migrate_zero_after")


@_norm.register("Tensor")
def _norm_one(g):
    rows = g.reshape(-1, g.shape[-1]) if len(g.shape) > 1 else g.reshape(1, -1)
    return ops.sqrt(ops.reduce_sum(rows * rows, 1).sum())


@_all_finite.register("Tensor")
def _all_finite_one(g):
    return ops.isfinite(g).all()


@_zero_after.register("Tuple", "Tensor")
def _zero_after_one(done, g):
    return ops.assign(g, ops.depend(ops.zeros_like(g), done))


def _total_norm(hyper_map, grads):
    norms = ops.stack(hyper_map(_norm, grads))
    return ops.sqrt(ops.reduce_sum(norms * norms))


def grad_norm(hyper_map, grads, inv_scale, unscale: bool):
    """clip_grad_norm_'s total norm of `grads`, unscaled first when a loss scale is on (traced in a graph)."""
    if unscale:
        grads = hyper_map(ops.partial(ops.mul, inv_scale), grads)
    return _total_norm(hyper_map, grads)


def _clamp_max_one(coef):
    """torch.clamp(coef, max=1.0), NaN included: a NaN norm makes a NaN coefficient, so every clipped
    gradient turns NaN as in clip_grad_norm_. MindSpore's clamp / minimum return 1 for NaN on CPU,
    which left all but the poisoned element finite (issue 26); `where` keeps finite values bit for bit."""
    return ops.where(coef > 1.0, ops.ones_like(coef), coef)


def _coefficient(total, max_norm, eps):
    # torch: max_norm / (total + 1e-6) is Tensor.__rtruediv__ = reciprocal * max_norm; clamp(max=1); mul_.
    return _clamp_max_one(ops.reciprocal(total + eps) * max_norm)


def clip_and_step(hyper_map, grads, unscale: bool, clip: bool, update, inv_scale, total, max_norm, eps, adam_args,
                  fold: bool = False, zero: bool = False):
    """(clipped norm, what `update` returned): unscale, clip by `total`, measure, step (traced in a graph).
    fold: `update` is the fused kernel's cell, which unscales, clips, measures and steps in one pass
    (zero: and zeroes the accumulators `grads`)."""
    if fold:
        one = ops.ones_like(total)
        coef = _coefficient(total, max_norm, eps) if clip else one
        sums = update(grads, *adam_args, inv_scale if unscale else one, coef, zero)
        clipped = total
        if clip:  # gradients a coefficient of 1 left as they were have the norm already measured
            clipped = ops.where(coef == 1.0, total, ops.sqrt(ops.stack(sums).sum()))
        return ops.depend(clipped, sums), sums
    if unscale:
        grads = hyper_map(ops.partial(ops.mul, inv_scale), grads)
    clipped = total
    if clip:
        coef = _coefficient(total, max_norm, eps)
        grads = hyper_map(ops.partial(ops.mul, coef), grads)
        clipped = _total_norm(hyper_map, grads)
    done = ()
    if update is not None:
        done = update(grads, *adam_args)
    return clipped, done


class GradNorm(nn.Cell):
    """Total norm of the accumulated gradients (graph 1)."""

    def __init__(self, grads, unscale: bool):
        super().__init__(auto_prefix=False)
        self.grads = grads
        self.unscale = unscale
        self.hyper_map = ops.HyperMap()

    def construct(self, inv_scale):
        return grad_norm(self.hyper_map, self.grads, inv_scale, self.unscale)


class AllFinite(nn.Cell):
    """GradScaler's check: every element of every unscaled gradient finite."""

    def __init__(self, grads):
        super().__init__(auto_prefix=False)
        self.grads = grads
        self.hyper_map = ops.HyperMap()

    def construct(self, inv_scale):
        grads = self.hyper_map(ops.partial(ops.mul, inv_scale), self.grads)
        return ops.stack(self.hyper_map(_all_finite, grads)).all()


class ClipAndStep(nn.Cell):
    """Clip the accumulated gradients, measure the clipped norm, step the optimizer (`update`;
    None: no step) and zero the accumulators (graph 2). fold: `update` is the fused kernel's, which
    does all of it in its one pass over each tensor."""

    def __init__(self, grads, unscale: bool, clip: bool, update=None, fold: bool = False):
        super().__init__(auto_prefix=False)
        self.grads = grads
        self.unscale = unscale
        self.clip = clip
        self.update = update
        self.fold = fold
        self.hyper_map = ops.HyperMap()

    def construct(self, inv_scale, total, max_norm, eps, decays, w1, b2, w2, neg_step, bc2_sqrt, adam_eps):
        clipped, done = clip_and_step(self.hyper_map, self.grads, self.unscale, self.clip, self.update, inv_scale,
                                      total, max_norm, eps, (decays, w1, b2, w2, neg_step, bc2_sqrt, adam_eps),
                                      self.fold, self.fold)
        if self.fold:
            return clipped  # depends on every kernel, each of which zeroed its accumulator
        zeroed = self.hyper_map(ops.partial(_zero_after, done), self.grads)  # after the update read them
        return ops.depend(clipped, zeroed)


class OptimizerStep:
    """Clip the accumulated gradients and step AdamW on them (see the module docstring).

    `grads`: the ParameterTuple the micro-steps accumulate into, in the order of
    `optimizer.parameters`.
    """

    def __init__(self, clipper, optimizer, grads, update=None):
        self.clipper = clipper
        self.optimizer = optimizer
        self.grads = grads
        clip = clipper.max_norm is not None
        self.norm_cell = GradNorm(grads, clipper.unscale)
        # The fused kernel clips and zeroes fp32 accumulators itself; a replay's tap needs the clipped
        # gradients as tensors, so it keeps the graph's clip.
        fold = update is None and optimizer.fused and all(g.dtype == ms.float32 for g in grads)
        self.step_cell = ClipAndStep(grads, clipper.unscale, clip, update or optimizer.update, fold)
        self._skip_cell = None   # built on the first skipped step
        self._finite_cell = None  # built on the first fp16 step whose norm is not finite
        self._inv_scale = self._total = None

    def cells(self) -> list:
        """The cells built so far (the skip and finite checks on first use)."""
        return [c for c in (self.norm_cell, self.step_cell, self._skip_cell, self._finite_cell) if c is not None]

    def measure(self, inv_scale: float = 1.0) -> float:
        """The total gradient norm before clipping (graph 1)."""
        self._inv_scale = Tensor(np.float32(inv_scale))
        self._total = self.norm_cell(self._inv_scale)
        return float(self._total.asnumpy())

    def all_finite(self, norm: float) -> bool:
        """Every unscaled gradient element finite. A finite norm says so at no cost (a square
        of a non-finite element is not finite); otherwise each element is checked, as GradScaler
        does, so a finite gradient whose squares overflow still steps."""
        if math.isfinite(norm):
            return True
        if self._finite_cell is None:
            self._finite_cell = AllFinite(self.grads)
        return bool(self._finite_cell(self._inv_scale).asnumpy())

    def finish(self, apply: bool) -> float:
        """Clip and (apply) step AdamW; the accumulators are zeroed either way. Returns the clipped norm."""
        if apply:
            cell, args = self.step_cell, self.optimizer.advance()
        else:
            if self._skip_cell is None:
                self._skip_cell = ClipAndStep(self.grads, self.clipper.unscale, self.clipper.max_norm is not None)
            cell, args = self._skip_cell, self.optimizer.step_args(self.optimizer.step_count + 1)
        clipped = cell(self._inv_scale, self._total, *clip_tensors(self.clipper), *args)
        return float(clipped.asnumpy())

    def replace_grads(self, values) -> None:
        """Write reduced (data-parallel) gradients back into the accumulators."""
        for buffer, value in zip(self.grads, values, strict=True):
            buffer.set_data(value)

    def poison_first(self) -> None:
        """A NaN in the first gradient's first element (step fault nan_grad, before unscaling)."""
        first = self.grads[0].asnumpy().copy()
        first.reshape(-1)[0] = np.nan
        self.grads[0].set_data(Tensor(first))


# ---------- the whole step as one graph ----------
MAX_UNROLLED_MICRO_BATCHES = 8          # the micro-batches are unrolled: compile time grows with them
ONE_GRAPH_MAX_PARAMETERS = 32_000_000   # measured: 1 M faster as one graph, 115 M faster split (DESIGN)


class WholeStep(nn.Cell):
    """Every micro-batch's forward + backward, then the norm, clip, clipped norm and AdamW: one
    graph per optimizer step. The gradients stay values (no accumulators to write and zero).
    Returns (per-micro-batch losses, total norm, clipped norm)."""

    def __init__(self, micro, clipper, optimizer, accum: int):
        super().__init__(auto_prefix=False)
        self.grad_fn = ops.value_and_grad(micro.forward, None, micro.weights, has_aux=True)  # MicroStep's loss
        self.update = optimizer.update
        self.fold = optimizer.fused  # the kernel clips; the gradients are values, never zeroed
        self.unscale, self.clip = clipper.unscale, clipper.max_norm is not None
        self.accum = accum
        self.hyper_map = ops.HyperMap()

    def construct(self, ids, targets, scale, inv_scale, max_norm, eps, decays, w1, b2, w2, neg_step, bc2_sqrt,
                  adam_eps):
        (_, loss), grads = self.grad_fn(ids[0], targets[0], scale)
        losses = (loss,)
        for i in range(1, self.accum):  # unrolled at compile time
            (_, loss), more = self.grad_fn(ids[i], targets[i], scale)
            losses = losses + (loss,)
            grads = self.hyper_map(ops.add, grads, more)
        total = grad_norm(self.hyper_map, grads, inv_scale, self.unscale)
        clipped, done = clip_and_step(self.hyper_map, grads, self.unscale, self.clip, self.update, inv_scale, total,
                                      max_norm, eps, (decays, w1, b2, w2, neg_step, bc2_sqrt, adam_eps), self.fold)
        return ops.depend(ops.stack(losses), done), total, clipped  # the update's assigns are part of the output


class TappedUpdate(nn.Cell):
    """AdamW's update cell with a recording tap on its input: the clipped gradients it is handed are
    copied into `taps` (Parameters) as the update reads them. Only a replayed step uses it
    (`SplitSteps(observe=...)`); the update itself is the optimizer's own cell, unchanged."""

    def __init__(self, update, params):
        super().__init__(auto_prefix=False)
        self.update_cell = update
        self.taps = ParameterTuple([Parameter(initializer("zeros", p.shape, ms.float32), name="replay_tap." + p.name,
                                              requires_grad=False) for p in params])
        self.hyper_map = ops.HyperMap()

    def construct(self, grads, decays, w1, b2, w2, neg_step, bc2_sqrt, eps):
        tapped = self.hyper_map(ops.assign, self.taps, grads)
        return ops.depend(self.update_cell(grads, decays, w1, b2, w2, neg_step, bc2_sqrt, eps), tapped)


class StepGraphs(Protocol):
    """What the trainer's loop calls on a step implementation (`SplitSteps`, `OneGraphStep`)."""

    def cells(self) -> list: ...

    def forward_backward(self, batch, scale) -> list[float]: ...

    def reduce_grads(self, reduce: Callable[[tuple], tuple]) -> None: ...

    def poison_grad(self) -> None: ...

    def measure(self, inv_scale: float) -> float: ...

    def all_finite(self, norm: float) -> bool: ...

    def finish(self, apply: bool) -> float: ...


class SplitSteps:
    """The step as micro-steps (one graph each, into the accumulators) and `OptimizerStep`'s two
    graphs, the host deciding between them: what every run can use."""

    def __init__(self, training, observe=None):
        self.micro = training.micro
        self.optimizer = training.optimizer
        self.tap = TappedUpdate(training.optimizer.update, training.optimizer.parameters) \
            if observe is not None else None
        self.update = OptimizerStep(training.clipper, training.optimizer, training.micro.grads, self.tap)
        self.observe = observe  # `migrate replay`'s recorder, told each seam's values (see golden's optimizer_step)
        if observe is not None:
            training.micro.tap()  # each micro-batch's gradient as it is added, to judge the accumulation
        self._norm = None

    def cells(self) -> list:
        """The cells whose graphs this step compiles (`reuse`: which Parameters they hold)."""
        return [self.micro, *([self.tap] if self.tap is not None else []), *self.update.cells()]

    def forward_backward(self, batch, scale) -> list[float]:
        """batch: each micro-batch's rows (seq_length + 1 tokens); returns their losses."""
        losses = []
        for index, rows in enumerate(batch):
            losses.append(float(self.micro(*_split_rows(rows), scale).asnumpy()))
            if self.observe is not None:  # the accumulated gradients, scaled in fp16, as the golden's .grad
                taps = getattr(self.micro, "taps", None)
                self.observe.micro(index, losses[-1], self._named(self.update.grads),
                                   added=self._named(taps) if taps is not None else None)
        return losses

    def _named(self, tensors) -> dict:
        """parameter name -> numpy copy of `tensors` (in the optimizer's parameter order)."""
        return {p.name: t.asnumpy().astype(np.float32) for p, t in zip(self.optimizer.parameters, tensors,
                                                                       strict=True)}

    def reduce_grads(self, reduce: Callable[[tuple], tuple]) -> None:
        """Replace the accumulated gradients by reduce(their values): dp's mean over ranks."""
        self.update.replace_grads(reduce(tuple(p.value() for p in self.update.grads)))

    def poison_grad(self) -> None:
        """Step fault nan_grad: a NaN in the first accumulated gradient element (before unscaling)."""
        self.update.poison_first()

    def measure(self, inv_scale: float) -> float:
        self._norm = self.update.measure(inv_scale)
        return self._norm

    def all_finite(self, norm: float) -> bool:
        return self.update.all_finite(norm)

    def finish(self, apply: bool) -> float:
        lr = self.optimizer.lr
        clipped = self.update.finish(apply)
        if self.observe is not None:  # the clipped gradients: what the tap copied as AdamW read them
            opt = self.optimizer
            self.observe.clipped(self._norm, clipped, self._named(self.tap.taps) if apply else None)
            self.observe.stepped(lr, {"exp_avg": self._named(opt.exp_avg), "exp_avg_sq": self._named(opt.exp_avg_sq)},
                                 self._named(opt.parameters), not apply)
        return clipped


class OneGraphStep:
    """The step as one `WholeStep` launch; only for runs no host decision can interrupt
    (`one_graph_refusals`). The same numbers as `SplitSteps`, bit for bit (a test holds it)."""

    def __init__(self, training, accum: int):
        self.cell = WholeStep(training.micro, training.clipper, training.optimizer, accum)
        self.optimizer, self.clipper = training.optimizer, training.clipper
        self._norm = self._clipped = None

    def cells(self) -> list:
        """The cell whose graph this step compiles."""
        return [self.cell]

    def forward_backward(self, batch, scale) -> list[float]:
        ids, targets = _split_rows(np.stack(batch))
        losses, norm, clipped = self.cell(ids, targets, scale, Tensor(np.float32(1.0)), *clip_tensors(self.clipper),
                                          *self.optimizer.advance())
        self._norm, self._clipped = float(norm.asnumpy()), float(clipped.asnumpy())
        return [float(x) for x in losses.asnumpy()]

    def reduce_grads(self, reduce) -> None:
        raise MigrateError("a one-graph step reduces no gradients between graphs (several processes run split)")

    def poison_grad(self) -> None:
        raise MigrateError("a one-graph step cannot poison its gradients (a nan_grad step fault runs split)")

    def measure(self, inv_scale: float) -> float:
        return self._norm

    def all_finite(self, norm: float) -> bool:
        return math.isfinite(norm)

    def finish(self, apply: bool) -> float:
        if not apply:
            raise MigrateError("a one-graph step has already stepped the optimizer; it cannot be skipped")
        return self._clipped


def clip_tensors(clipper) -> tuple:
    """(max_norm, eps) of the clipper as the fp32 tensors the graphs take (max_norm 0: no clip)."""
    return Tensor(np.float32(clipper.max_norm or 0.0)), Tensor(np.float32(clipper.eps))


def _split_rows(rows):
    """(inputs, targets) of rows of seq_length + 1 tokens: row[:-1] and row[1:] (any leading axes)."""
    return Tensor(np.ascontiguousarray(rows[..., :-1])), Tensor(np.ascontiguousarray(rows[..., 1:]))


def one_graph_refusals(training, *, parallel=None, poisons: bool = False, profile: bool = False,
                       observed: bool = False) -> list[str]:
    """Why this run's step cannot be one graph (empty: it can)."""
    cfg = training.cfg
    reasons = []
    if observed:
        reasons.append("a replay observes the gradients, norm and update between the graphs (`migrate replay`)")
    if training.micro.grad_factors is not None:
        reasons.append("an injected gradient fault acts at the micro-step's seam (`MicroStep.adjust`)")
    if training.micro.accum_dtype != "float32":
        reasons.append(f"an injected fault accumulates the gradients in {training.micro.accum_dtype} (`MicroStep`)")
    if training.scaler is not None:
        reasons.append("fp16: the loss scaler decides on the host whether a step is taken")
    if cfg.health.policy != "warn":
        reasons.append(f"health policy {cfg.health.policy}: the watch decides on the host whether a step is taken")
    if parallel is not None:
        reasons.append("several processes: the gradients are reduced between the graphs")
    if poisons:
        reasons.append("a nan_grad step fault poisons the accumulated gradients between the graphs")
    if profile:
        reasons.append("--profile times each phase as its own graph")
    if cfg.grad_accum_steps > MAX_UNROLLED_MICRO_BATCHES:
        reasons.append(f"{cfg.grad_accum_steps} micro-batches (one graph unrolls at most {MAX_UNROLLED_MICRO_BATCHES})")
    size = sum(math.prod(p.shape) for p in training.model.get_parameters())
    if size > ONE_GRAPH_MAX_PARAMETERS:
        reasons.append(f"{size / 1e6:.0f} M parameters: above {ONE_GRAPH_MAX_PARAMETERS / 1e6:.0f} M the split "
                       f"graphs ran faster here")
    return reasons


def step_graphs(training, observe=None, **why):
    """The step's graphs for this run: one graph when nothing forbids it, else the split ones.
    observe: told what the step computes as it goes (`SplitSteps`; `migrate replay`)."""
    if one_graph_refusals(training, observed=observe is not None, **why):
        return SplitSteps(training, observe)
    return OneGraphStep(training, training.cfg.grad_accum_steps)
