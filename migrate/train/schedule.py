"""transformers' learning-rate schedules as pure Python, for the MindSpore side.

Each `_lambda_*` restates the lr_lambda of `transformers/optimization.py`
(transformers 5) with the same float operations in the same order, so
`base_lr * lambda(step)` is what torch's LambdaLR computes, to the last bit.

`step` is the scheduler's step index as LambdaLR sees it: the lr used by the
optimizer step that runs after `step` completed optimizer steps. A run's
1-based step s therefore trains with `lr_at(s - 1, cfg)`. (On fp16 overflow HF
skips the scheduler step too, so there `step` counts the steps that ran.)
"""
from __future__ import annotations

import math

from migrate.errors import MigrateError
from migrate.train.config import HFSchedule, RunConfig


def _warmup(step: int, warmup: int) -> float:
    return float(step) / float(max(1, warmup))


def _lambda_constant(step, warmup, total, base_lr):
    return 1


def _lambda_constant_with_warmup(step, warmup, total, base_lr):
    if step < warmup:
        return float(step) / float(max(1.0, warmup))  # HF uses 1.0 here, 1 elsewhere
    return 1.0


def _lambda_linear(step, warmup, total, base_lr):
    if step < warmup:
        return _warmup(step, warmup)
    return max(0.0, float(total - step) / float(max(1, total - warmup)))


def _lambda_cosine(step, warmup, total, base_lr, num_cycles=0.5, min_lr_rate=0.0):
    # transformers 5 defines this lambda twice; the later one (with min_lr_rate) wins for both names.
    if step < warmup:
        return _warmup(step, warmup)
    progress = float(step - warmup) / float(max(1, total - warmup))
    factor = 0.5 * (1.0 + math.cos(math.pi * float(num_cycles) * 2.0 * progress))
    factor = factor * (1 - min_lr_rate) + min_lr_rate
    return max(0, factor)


def _lambda_cosine_with_min_lr(step, warmup, total, base_lr, num_cycles=0.5, min_lr=None, min_lr_rate=None):
    if min_lr is not None:
        min_lr_rate = min_lr / base_lr  # HF divides by optimizer.defaults["lr"]
    return _lambda_cosine(step, warmup, total, base_lr, num_cycles, min_lr_rate)


def _lambda_polynomial(step, warmup, total, base_lr, lr_end=1e-7, power=1.0):
    lr_init = base_lr
    if step < warmup:
        return _warmup(step, warmup)
    if step > total:
        return lr_end / lr_init
    lr_range = lr_init - lr_end
    decay_steps = total - warmup
    pct_remaining = 1 - (step - warmup) / decay_steps
    decay = lr_range * pct_remaining**power + lr_end
    return decay / lr_init


LAMBDAS = {
    "constant": _lambda_constant,
    "constant_with_warmup": _lambda_constant_with_warmup,
    "linear": _lambda_linear,
    "cosine": _lambda_cosine,
    "cosine_with_min_lr": _lambda_cosine_with_min_lr,
    "polynomial": _lambda_polynomial,
}


def hf_lr(step: int, schedule: HFSchedule, base_lr: float) -> float:
    """LambdaLR's lr for one HF scheduler name + kwargs."""
    fn = LAMBDAS.get(schedule.name)
    if fn is None:
        raise MigrateError(f"no pure-Python formula for HF schedule {schedule.name!r}")
    factor = fn(step, schedule.num_warmup_steps, schedule.num_training_steps, base_lr, **schedule.kwargs)
    return base_lr * factor


def lr_at(step: int, cfg: RunConfig) -> float:
    """The lr of the optimizer step after `step` completed steps (0-based, LambdaLR's index)."""
    return float(hf_lr(step, cfg.hf_schedule(), cfg.optimizer.lr))


def lr_table(cfg: RunConfig) -> list[float]:
    """lr for every optimizer step of the run, index 0 = step 1."""
    schedule = cfg.hf_schedule()
    return [float(hf_lr(s, schedule, cfg.optimizer.lr)) for s in range(cfg.total_steps)]
