"""Known optimizer-side porting faults, injectable into the MindSpore trainer.

`train(cfg, faults=[...])` and `hparams_report(cfg, faults=[...])` accept
these names; each fault adjusts one of the run's `TrainingKnobs`
(`migrate.train.knobs`) the way a careless port would (sources:
../shared/PITFALLS.md), so the live object built from it misbehaves, `migrate
hparams` must name the knob and `migrate compare` must fail the run: on the
loss, lr or grad-norm curves, and for clip_no_eps -- which AdamW hides from the
loss -- on the post-clip gradient norm both sides log
(tests/test_compare_faults.py).

A fault may start at optimizer step k (`NAME@K`, 1-based): the run trains clean to step k - 1,
then the trainer rebuilds its live objects with the fault on and carries its state over
(`trainer.MindSporeRecipe`), so the two curves agree first and part from step k -- what
`migrate replay` is tested on (tests/test_replay.py).
"""
from __future__ import annotations

import re
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


def faulty_beta2(beta2: float) -> float:
    """torch's default beta2, or the common LLM one when the config already uses 0.999."""
    return 0.999 if beta2 != 0.999 else 0.95


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
    TrainFault("beta2", "AdamW beta2 0.999 (torch's default) where the config says otherwise (0.95 if it "
                        "says 0.999)", "betas",
               lambda k: replace(k, betas=(k.betas[0], faulty_beta2(k.betas[1])))),
    TrainFault("lr_late", "lr schedule one optimizer step late (step s uses the lr of step s - 1)", "lr",
               lambda k: replace(k, lr_lag=k.lr_lag + 1)),
    TrainFault("head_grad_scale", "one layer's gradient multiplied by 1.01 in the backward: the LM head's (the "
                                  "tied embedding's where the model ties them), a fault at the micro-step's "
                                  "gradient seam", "gradients",
               lambda k: replace(k, head_grad_factor=1.01)),
    TrainFault("bf16_accum", "gradients accumulated over the micro-batches in bf16 instead of fp32 (every add "
                             "rounded to bf16)", "grad_accum_dtype",
               lambda k: replace(k, accum_dtype="bfloat16")),
)}
_SPEC = re.compile(r"^(?P<name>[a-z_0-9]+)(?:@(?P<start>\d+))?$")


def parse_fault(spec: str) -> tuple[str, int]:
    """(name, first optimizer step it acts on) of NAME or NAME@STEP; one MigrateError line if bad."""
    match = _SPEC.match(str(spec).strip())
    if not match or match["name"] not in TRAIN_FAULTS:
        name = match["name"] if match else str(spec)
        raise MigrateError(f"unknown training fault {name!r}; known: {', '.join(TRAIN_FAULTS)} (NAME or NAME@STEP)")
    start = int(match["start"] or 1)
    if start < 1:
        raise MigrateError(f"bad training fault {spec!r}: steps are 1-based")
    return match["name"], start


def faults_at(faults, step: int) -> tuple[str, ...]:
    """The fault names acting on optimizer step `step` (1-based)."""
    return tuple(dict.fromkeys(name for name, start in map(parse_fault, faults or ()) if start <= step))


def check_faults(faults) -> tuple[str, ...]:
    """The fault specs (NAME or NAME@STEP), validated, each once."""
    specs = tuple(dict.fromkeys(str(f).strip() for f in faults or ()))
    for spec in specs:
        parse_fault(spec)
    return specs


def apply_faults(knobs: TrainingKnobs, faults) -> TrainingKnobs:
    """`knobs` as the named faults leave them, each applied in turn (a start step is not read here:
    the caller passes the faults acting now, `faults_at`)."""
    for name, _ in map(parse_fault, check_faults(faults)):
        knobs = TRAIN_FAULTS[name].adjust(knobs)
    return knobs
