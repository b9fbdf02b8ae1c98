"""MindFormers 2.0.0's lr schedules (core/lr/lr_schedule.py), restated in numpy.

`lr(section, step)` is what the schedule cell returns for the optimizer's global_step
`step`. MindFormers' AdamW reads the lr at global_step before incrementing it, so
optimizer step s (1-based) trains with lr(s - 1): LambdaLR's index, as in
`migrate.train.schedule`. In float64 (the default) this is the formula; with
dtype=np.float32 it follows the cells' float32 evaluation (Tensor constants, P.Cos).
`effective(section, steps_trained)` resolves what MindFormers fills in:
total_steps -1/None -> the steps trained, warmup_ratio -> int(total * ratio) (a floor,
where HF TrainingArguments rounds up).
"""
from __future__ import annotations

import math

import numpy as np

from migrate.errors import MigrateError

TYPES = ("ConstantWarmUpLR", "LinearWithWarmUpLR", "CosineWithWarmUpLR", "PolynomialWithWarmUpLR")
# registry aliases of the same classes (mindformers.core.lr)
ALIASES = {"constant_with_warmup": "ConstantWarmUpLR", "linear": "LinearWithWarmUpLR",
           "cosine": "CosineWithWarmUpLR", "polynomial": "PolynomialWithWarmUpLR"}


def effective(section: dict, steps_trained: int | None) -> dict:
    """The schedule's arguments after MindFormers' defaults and its trainer's fill-ins."""
    kind = ALIASES.get(section.get("type"), section.get("type"))
    if kind not in TYPES:
        raise MigrateError(f"lr_schedule.type {section.get('type')!r}: migrate models {', '.join(TYPES)}")
    total = section.get("total_steps")
    if total is None or total == -1:
        if steps_trained is None:
            raise MigrateError("lr_schedule.total_steps is -1 (the steps trained) and the dataset size is unknown")
        total = steps_trained
    ratio = section.get("warmup_ratio")
    warmup = int(total * ratio) if ratio is not None else section.get("warmup_steps")
    out = {"type": kind, "learning_rate": float(section["learning_rate"]), "total_steps": int(total),
           "warmup_steps": int(warmup or 0), "warmup_lr_init": float(section.get("warmup_lr_init", 0.0))}
    if kind == "CosineWithWarmUpLR":
        decay = section.get("decay_steps")
        if section.get("decay_ratio") is not None:
            decay = int(total * section["decay_ratio"])
        out.update(lr_end=float(section.get("lr_end", 0.0)), num_cycles=float(section.get("num_cycles", 0.5)),
                   decay_steps=max(1, int(decay)) if decay is not None else max(1, int(total)),
                   cosine_steps=max(1, int(total) - out["warmup_steps"]))
    elif kind == "PolynomialWithWarmUpLR":
        decay = section.get("decay_steps")
        out.update(lr_end=float(section.get("lr_end", 1e-7)), power=float(section.get("power", 1.0)),
                   decay_steps=max(1, int(decay)) if decay is not None else max(1, int(total) - out["warmup_steps"]))
    elif kind == "LinearWithWarmUpLR":
        out.update(lr_end=0.0, linear_steps=max(1, int(total) - out["warmup_steps"]))
    else:
        out["lr_end"] = float(section["learning_rate"])
    return out


def lr(s: dict, step: int, dtype=np.float64) -> float:
    """lr of global_step `step` for an `effective` section."""
    f = dtype
    g, base, init, warm = f(step), f(s["learning_rate"]), f(s["warmup_lr_init"]), f(s["warmup_steps"])
    kind = s["type"]
    if kind == "CosineWithWarmUpLR" and g >= f(s["decay_steps"]):
        return float(f(s["lr_end"]))
    if kind == "PolynomialWithWarmUpLR" and not (warm != 0 and warm > g) and g > f(s["total_steps"]):
        return float(f(s["lr_end"]))
    if warm != 0 and warm > g:
        return float(init + (base - init) * (g / warm))
    if kind == "ConstantWarmUpLR":
        return float(base * f(1.0))
    if kind == "LinearWithWarmUpLR":
        return float(base * max(f(0.0), (f(s["total_steps"]) - g) / f(s["linear_steps"])))
    if kind == "CosineWithWarmUpLR":
        progress = (g - warm) / f(s["cosine_steps"])
        cos = f(math.cos(float(f(math.pi) * f(s["num_cycles"]) * f(2.0) * progress)))
        percent = max(f(0.0), f(0.5) * (f(1.0) + cos))
        end = f(s["lr_end"])
        return float(end + (base - end) * percent)
    end = f(s["lr_end"])  # PolynomialWithWarmUpLR
    remaining = f(1.0) - (g - warm) / f(s["decay_steps"])
    return float(((base - end) * remaining ** f(s["power"]) + end) / base * base)


def table(section: dict, steps: int, steps_trained: int | None, dtype=np.float64) -> list[float]:
    """lr of optimizer steps 1..steps (global_step 0..steps-1)."""
    s = effective(section, steps_trained)
    return [lr(s, i, dtype) for i in range(steps)]
