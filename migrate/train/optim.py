"""Optimizer, gradient clipping, loss accumulation and lr schedule of the
MindSpore trainer, each with torch's semantics and each exposing its knobs as
attributes of the live object (what `migrate hparams` reads):

  AdamW          eps, betas, bias_correction, param_groups[i]["weight_decay" | "names"]
  GradClipper    max_norm, eps (torch's clip_grad_norm_ adds 1e-6 to the norm), unscale
  LrSchedule     name, num_warmup_steps, num_training_steps, kwargs, base_lr; lr(i)
  (the loss divisor of accumulation lives on steps.MicroStep.loss_divisor)

AdamW restates `torch.optim.AdamW` as torch runs it on CPU (the single-tensor
path; foreach/fused are CUDA-only), op by op in fp32 with the scalars made in
Python doubles as torch makes them:

    p *= fp32(1 - lr * wd)                       (only when wd != 0)
    m  = m + fp32(1 - b1) * (g - m)              (lerp_)
    v  = v * fp32(b2) + (fp32(1 - b2) * g) * g   (mul_ + addcmul_)
    p  = p + (fp32(-lr / (1 - b1**t)) * m) / (sqrt(v) / fp32(sqrt(1 - b2**t)) + fp32(eps))

torch's CPU kernels fuse lerp_ and addcmul_ into one FMA and its sqrt is not
always correctly rounded, so single elements differ by an ulp now and then
(measured: parameters agree to ~5e-8 relative after 10 steps; tests check it).
`bias_correction=False` is MindSpore nn.AdamWeightDecay's behaviour, kept for
fault injection. `mindspore.experimental.optim.AdamW` was not used: it has no
bias-correction switch and computes the bias corrections in fp32 tensors.
"""
from __future__ import annotations

import dataclasses

import mindspore as ms
import numpy as np
from mindspore import Parameter, ParameterTuple, Tensor, nn, ops
from mindspore.common.initializer import initializer

from migrate.errors import MigrateError
from migrate.train.config import HFSchedule, RunConfig
from migrate.train.decay import plan_decay_names
from migrate.train.kernels import adamw_op
from migrate.train.schedule import hf_lr

F32 = ms.float32
TORCH_CLIP_EPS = 1e-6  # torch.nn.utils.clip_grad_norm_: max_norm / (total_norm + 1e-6)

_adamw = ops.MultitypeFuncGraph("migrate_adamw")


@_adamw.register("Tensor", "Tensor", "Tensor", "Tensor", "Tensor", "Tensor", "Tensor", "Tensor", "Tensor",
                 "Tensor", "Tensor", "Bool")
def _adamw_one(w1, b2, w2, neg_step, bc2_sqrt, eps, decay, param, grad, exp_avg, exp_avg_sq, use_decay):
    p = param
    if use_decay:
        p = p * decay
    m = exp_avg + w1 * (grad - exp_avg)
    v = exp_avg_sq * b2 + (w2 * grad) * grad
    denom = ops.sqrt(v) / bc2_sqrt + eps
    p = p + (neg_step * m) / denom
    ops.assign(exp_avg, m)
    ops.assign(exp_avg_sq, v)
    ops.assign(param, p)
    return True


class _AdamWUpdate(nn.Cell):
    def __init__(self, params, exp_avg, exp_avg_sq, use_decay):
        super().__init__(auto_prefix=False)
        self.params = params
        self.exp_avg = exp_avg
        self.exp_avg_sq = exp_avg_sq
        self.use_decay = use_decay
        self.hyper_map = ops.HyperMap()

    def construct(self, grads, decays, w1, b2, w2, neg_step, bc2_sqrt, eps):
        return self.hyper_map(ops.partial(_adamw, w1, b2, w2, neg_step, bc2_sqrt, eps), decays, self.params,
                              grads, self.exp_avg, self.exp_avg_sq, self.use_decay)


class _FusedAdamWUpdate(nn.Cell):
    """`_AdamWUpdate` through one fused CPU kernel per tensor (migrate/train/kernels/adamw.cc): the
    same operations in the same order, so the same bits, in one pass over memory instead of fourteen,
    the parameter and moments written in place.

    Called as `_AdamWUpdate` is, the gradients are used as given. With inv_scale and coef (fp32
    scalars) each gradient is first unscaled and clipped on the way in, (g * inv_scale) * coef, the
    graph's two multiplies; zero: the gradients are accumulator Parameters, zeroed in place once read.
    Returns each tensor's sum of squares of the gradient it used (the clipped norm's parts)."""

    def __init__(self, params, exp_avg, exp_avg_sq, use_decay, fused):
        super().__init__(auto_prefix=False)
        self.params = params
        self.exp_avg = exp_avg
        self.exp_avg_sq = exp_avg_sq
        self.use_decay = tuple(bool(use) for use in use_decay)
        self.count = len(params)
        self.fused = fused

    def construct(self, grads, decays, w1, b2, w2, neg_step, bc2_sqrt, eps, inv_scale=None, coef=None, zero=False):
        one = ops.ones_like(w1)  # x * 1.0f is x exactly: an unscale, clip or decay that is off
        inv_scale = one if inv_scale is None else inv_scale
        coef = one if coef is None else coef
        zeroing = one if zero else ops.zeros_like(w1)
        # One stack a step: its kernel inputs are the same for every tensor (adamw.cc)
        shared = ops.stack((w1, b2, w2, neg_step, bc2_sqrt, eps, inv_scale, coef, zeroing))
        sums = ()  # one entry per tensor, as _AdamWUpdate's HyperMap returns
        for i in range(self.count):
            decay = decays[i] if self.use_decay[i] else one
            if zero:
                # The accumulator Parameter itself (a cast or depend could hand over a copy); nothing else in
                # its graph reads the accumulators, and they exist before it runs.
                grad = grads[i]
            else:
                # The kernel writes parameter and moments in place, which MindSpore does not see as a write:
                # no kernel may run before every gradient is there (a weight's backward may still read it,
                # with clipping off), hence each depends on all of them; its sum is what the graph returns.
                grad = ops.depend(grads[i].astype(F32), grads)
            sums = sums + (self.fused(self.params[i], grad, self.exp_avg[i], self.exp_avg_sq[i], shared, decay),)
        return sums


def _update_cell(params, exp_avg, exp_avg_sq, use_decay, fused: bool | None):
    """The fused update where the kernel is there and every tensor is fp32 (fused None: if it can be
    had), else the op-by-op graph; and which one it is."""
    op = adamw_op() if fused is not False and all(p.dtype == F32 for p in params) else None
    if fused and op is None:
        raise MigrateError("the fused AdamW kernel is not available here (no C++ compiler, a failed build, or "
                           "not on CPU)")
    if op is None:
        return _AdamWUpdate(params, exp_avg, exp_avg_sq, use_decay), False
    return _FusedAdamWUpdate(params, exp_avg, exp_avg_sq, use_decay, op), True


def host_view(tensor) -> np.ndarray | None:
    """The tensor's own memory as a numpy array, where it lies in host memory (on the CPU), else None.
    Not asked on a device, where `asnumpy` would copy the whole tensor to find out."""
    if ms.get_context("device_target") != "CPU":
        return None
    view = tensor.asnumpy()
    return view if view.flags.writeable and view.ctypes.data == tensor.data_ptr() else None


def overwrite(tensor, values) -> None:
    """`values` (an array of the tensor's shape, or a scalar) written into the tensor's own memory:
    through numpy where it lies on the host, else by `Tensor.copy_`. Inside `migrate diff --grads`
    `Tensor.copy_` from numpy ran at a tenth of memcpy's speed (0.48 s for SmolLM2's 135 M parameters),
    and copying np.zeros in faulted each of its fresh pages."""
    view = host_view(tensor)
    if view is not None:
        np.copyto(view, values)
    else:
        tensor.copy_(ms.from_numpy(np.ascontiguousarray(np.broadcast_to(values, tensor.shape), np.float32)))


class AdamW:
    """torch.optim.AdamW on MindSpore Parameters (see the module docstring).

    `groups`: [{"params": [Parameter, ...], "weight_decay": float}, ...]; empty
    groups are dropped, as the golden script does. `step(grads)` takes the
    gradients in the order of `self.parameters`.
    """

    def __init__(self, groups, lr: float, betas=(0.9, 0.999), eps: float = 1e-8, bias_correction: bool = True,
                 fused: bool | None = None):
        groups = [g for g in groups if g["params"]]
        if not groups:
            raise MigrateError("the optimizer got no parameters")
        self.betas = (float(betas[0]), float(betas[1]))
        self.eps = float(eps)
        self.bias_correction = bool(bias_correction)
        self.lr = float(lr)
        self.param_groups = [{"params": list(g["params"]), "names": [p.name for p in g["params"]],
                              "weight_decay": float(g["weight_decay"]), "lr": self.lr, "betas": self.betas,
                              "eps": self.eps, "bias_correction": self.bias_correction} for g in groups]
        params = [p for g in self.param_groups for p in g["params"]]
        self.parameters = ParameterTuple(params)
        self._group_of = [i for i, g in enumerate(self.param_groups) for _ in g["params"]]
        # Moments always fp32, named as MindFormers names them; allocated lazily (on first use).
        self.exp_avg = ParameterTuple([Parameter(initializer("zeros", p.shape, F32), name="adam_m." + p.name)
                                       for p in params])
        self.exp_avg_sq = ParameterTuple([Parameter(initializer("zeros", p.shape, F32), name="adam_v." + p.name)
                                          for p in params])
        self.step_count = 0
        use_decay = tuple(self.param_groups[g]["weight_decay"] != 0 for g in self._group_of)
        # fused: the one-pass CPU kernel (None: where it can be had; the same bits either way)
        self._update, self.fused = _update_cell(self.parameters, self.exp_avg, self.exp_avg_sq, use_decay, fused)

    def zero_moments(self) -> None:
        """Both moments as zeros made by MindSpore (`ops.zeros`) instead of on the lazy initializer's
        first use: a one-step optimizer (`migrate diff --grads`' reference step) pays for every moment
        once, and the initializer's way cost most of it (the first step of a fresh AdamW on a 32 M-element
        tensor: 1.73 s, 0.37 s with its moments zeroed so; measured)."""
        for moment in (*self.exp_avg, *self.exp_avg_sq):
            moment.set_data(ops.zeros(moment.shape, F32))

    def restart(self) -> None:
        """As new on the same Parameters: step count 0 and both moments zero, written into the moments'
        own memory (`migrate diff --grads` steps many tensors of one shape through one optimizer)."""
        self.step_count = 0
        for moment in (*self.exp_avg, *self.exp_avg_sq):
            overwrite(moment, 0.0)

    def set_lr(self, lr: float) -> None:
        self.lr = float(lr)
        for g in self.param_groups:
            g["lr"] = self.lr

    def take_settings(self, other: AdamW) -> None:
        """`other`'s hyperparameters and step count on these Parameters (the same groups): a run
        trained on compiled graphs built for another (`migrate.train.step.reuse`)."""
        self.betas, self.eps, self.bias_correction = other.betas, other.eps, other.bias_correction
        self.lr, self.step_count = other.lr, other.step_count
        for mine, theirs in zip(self.param_groups, other.param_groups, strict=True):
            mine.update({key: value for key, value in theirs.items() if key != "params"})

    def scalars(self, step: int) -> dict[str, float]:
        """The Python-double scalars of optimizer step `step` (1-based), as torch forms them."""
        b1, b2 = self.betas
        lr = self.lr
        if self.bias_correction:
            step_size = lr / (1 - b1 ** step)
            bc2_sqrt = (1 - b2 ** step) ** 0.5
        else:
            step_size, bc2_sqrt = lr, 1.0
        return {"w1": 1 - b1, "b2": b2, "w2": 1 - b2, "neg_step": -step_size, "bc2_sqrt": bc2_sqrt, "eps": self.eps,
                "decays": [1 - lr * g["weight_decay"] for g in self.param_groups]}

    def step(self, grads) -> None:
        """One optimizer step on `grads` (in the order of `self.parameters`), as its own graph."""
        self._update(ms.mutable(tuple(grads)), *self.advance())

    def advance(self) -> tuple:
        """Count one optimizer step and return its arguments for `update` (a graph that embeds
        `update` steps the optimizer inside it, `migrate.train.step.optimizer`)."""
        self.step_count += 1
        return self.step_args(self.step_count)

    def step_args(self, step: int) -> tuple:
        """(decays, w1, b2, w2, neg_step, bc2_sqrt, eps) of optimizer step `step` as fp32 tensors."""
        s = self.scalars(step)
        group_decay = [Tensor(np.float32(d)) for d in s["decays"]]
        decays = ms.mutable(tuple(group_decay[g] for g in self._group_of))
        return (decays, *(Tensor(np.float32(s[k])) for k in ("w1", "b2", "w2", "neg_step", "bc2_sqrt", "eps")))

    @property
    def update(self) -> nn.Cell:
        """The cell that applies one step: update(grads, *step_args) (assigns parameters and moments).
        Where `fused`, update(grads, *step_args, inv_scale, coef, zero) also unscales, clips and zeroes
        (`_FusedAdamWUpdate`)."""
        return self._update

    # ---------- state ----------
    def state_dict(self) -> dict[str, np.ndarray]:
        state = {p.name: p.asnumpy() for p in (*self.exp_avg, *self.exp_avg_sq)}
        state["step"] = np.asarray(self.step_count, np.int64)
        return state

    def load_state_dict(self, state: dict) -> None:
        for p in (*self.exp_avg, *self.exp_avg_sq):
            if p.name not in state:
                raise MigrateError(f"optimizer state has no {p.name}")
            value = np.asarray(state[p.name], np.float32)
            if value.shape != tuple(p.shape):
                raise MigrateError(f"optimizer state {p.name} has shape {value.shape}, expected {tuple(p.shape)}")
            p.set_data(Tensor(value))
        self.step_count = int(state["step"])


def param_groups(model, cfg: RunConfig, plan, decay_rule: str = "hf") -> list[dict]:
    """[decayed, not decayed] trainable parameters of the bundled model.

    decay_rule "hf": HF Trainer's groups carried over through the keymap
    (`decay.plan_decay_names`, the run's plan); "mindspore": nn.AdamWeightDecay's default filter, which
    decays every parameter whose name lacks "beta"/"gamma" (biases and norm
    weights included) -- a fault to inject, never the default.
    """
    params = list(model.trainable_params())
    names = [p.name for p in params]
    if decay_rule == "hf":
        decay = plan_decay_names(names, plan, cfg.optimizer.no_decay)
    elif decay_rule == "mindspore":
        decay = {n for n in names if "beta" not in n and "gamma" not in n}
    else:
        raise MigrateError(f"unknown decay rule {decay_rule!r}")
    return [{"params": [p for p in params if p.name in decay], "weight_decay": cfg.optimizer.weight_decay},
            {"params": [p for p in params if p.name not in decay], "weight_decay": 0.0}]


# ---------- clipping ----------
class GradClipper:
    """torch.nn.utils.clip_grad_norm_ (norm type 2) over the accumulated gradients: the knobs.

    The graphs that measure and clip live in `migrate.train.step.optimizer`. With a
    loss scale the gradients are first unscaled (GradScaler.unscale_). `max_norm`
    None or 0: nothing is clipped, the norm is still computed. The clipped norm is
    measured on the clipped tensors (logged as grad_norm_clipped): it is the one
    figure that shows the clip epsilon, since AdamW is nearly blind to a gradient
    scale of 1 + 1e-6 / norm, and so is the loss curve.
    """

    def __init__(self, max_norm: float | None, eps: float = TORCH_CLIP_EPS, unscale: bool = False):
        self.max_norm = float(max_norm) if max_norm else None
        self.eps = float(eps)
        self.unscale = unscale

    def coefficient(self, total_norm: float) -> float:
        """The clip coefficient for a total norm (Python doubles; for reports and probes)."""
        if self.max_norm is None:
            return 1.0
        return min(self.max_norm / (total_norm + self.eps), 1.0)


# ---------- schedule ----------
class LrSchedule:
    """The HF schedule of the run config as `lr(i)`: i = LambdaLR's index (optimizer steps done).

    `warmup_shift` moves the warmup length, `lag` makes the schedule run that many steps late
    (fault injection only).
    """

    def __init__(self, cfg: RunConfig, warmup_shift: int = 0, lag: int = 0):
        hf = cfg.hf_schedule()
        self.hf: HFSchedule = dataclasses.replace(hf, num_warmup_steps=hf.num_warmup_steps + warmup_shift)
        self.base_lr = float(cfg.optimizer.lr)
        self.lag = int(lag)

    name = property(lambda self: self.hf.name)
    num_warmup_steps = property(lambda self: self.hf.num_warmup_steps)
    num_training_steps = property(lambda self: self.hf.num_training_steps)
    kwargs = property(lambda self: dict(self.hf.kwargs))

    def lr(self, index: int) -> float:
        return float(hf_lr(max(index - self.lag, 0), self.hf, self.base_lr))

    def table(self, steps: int | None = None) -> list[float]:
        return [self.lr(i) for i in range(self.num_training_steps if steps is None else steps)]

