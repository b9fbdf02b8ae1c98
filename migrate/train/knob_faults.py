"""Known optimizer-side porting faults, injectable into the MindSpore trainer.

`train(cfg, faults=[...])` and `hparams_report(cfg, faults=[...])` accept
these names; each fault adjusts one of the run's `TrainingKnobs`
(`migrate.train.knobs`) the way a careless port would (sources:
../shared/PITFALLS.md), so the live object built from it misbehaves, `migrate
hparams` must name the knob and `migrate compare` must fail the run: on the
loss, lr or grad-norm curves, and for clip_no_eps -- which AdamW hides from the
loss -- on the post-clip gradient norm both sides log
(tests/test_compare_faults.py).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from migrate.errors import MigrateError
from migrate.train.knobs import TrainingKnobs


@dataclass(frozen=True)
class TrainFault:
    name: str
    description: str
    knob: str  # the `migrate hparams` row that must catch it
    adjust: Callable[[TrainingKnobs], TrainingKnobs]


def faulty_eps(eps: float) -> float:
    """MindSpore's default eps, or the torch default when the config already uses 1e-6."""
    return 1e-6 if eps != 1e-6 else 1e-8


TRAIN_FAULTS: dict[str, TrainFault] = {f.name: f for f in (
    TrainFault("adam_eps", "AdamW eps 1e-6 (nn.AdamWeightDecay's default) instead of the config's eps", "eps",
               lambda k: replace(k, eps=faulty_eps(k.eps))),
    TrainFault("no_bias_correction", "AdamW without bias correction (nn.AdamWeightDecay)", "bias_correction",
               lambda k: replace(k, bias_correction=False)),
    TrainFault("decay_biases", "MindSpore's default decay filter (every name without beta/gamma): biases and "
                               "norm weights decayed", "decayed_parameters",
               lambda k: replace(k, decay_rule="mindspore")),
    TrainFault("warmup_off_by_one", "warmup one optimizer step longer than configured", "num_warmup_steps",
               lambda k: replace(k, warmup_shift=k.warmup_shift + 1)),
    TrainFault("no_accum_scaling", "micro-batch losses not divided by grad_accum_steps before backward",
               "loss_divisor", lambda k: replace(k, loss_divisor=1)),
    TrainFault("clip_no_eps", "clip coefficient max_norm / norm without torch's +1e-6 "
                              "(ops.clip_by_global_norm)", "clip_eps",
               lambda k: replace(k, clip_eps=0.0)),
)}


def check_faults(faults) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(faults or ()))
    unknown = [f for f in names if f not in TRAIN_FAULTS]
    if unknown:
        raise MigrateError(f"unknown training fault {unknown[0]!r}; known: {', '.join(TRAIN_FAULTS)}")
    return names


def apply_faults(knobs: TrainingKnobs, faults) -> TrainingKnobs:
    """`knobs` as the named faults leave them, each applied in turn."""
    for name in check_faults(faults):
        knobs = TRAIN_FAULTS[name].adjust(knobs)
    return knobs
