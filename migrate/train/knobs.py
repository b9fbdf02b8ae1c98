"""The settings of a MindSpore run that a careless port gets wrong, as one value.

    knobs = TrainingKnobs.from_config(cfg)       # torch's semantics, from the run config
    knobs = apply_faults(knobs, ["adam_eps"])    # migrate.train.knob_faults: each adjusts its knob

`building.build_training` builds the optimizer, micro-step, clipper and schedule
from these knobs and nothing else, so an injected fault changes a live object
exactly as a port would, and no production code asks which faults are on.
"""
from __future__ import annotations

from dataclasses import dataclass

from migrate.train.config import RunConfig
from migrate.train.optim import TORCH_CLIP_EPS


@dataclass(frozen=True)
class TrainingKnobs:
    eps: float               # AdamW eps
    bias_correction: bool    # AdamW bias correction (torch: on)
    decay_rule: str          # which parameters decay: "hf" (HF Trainer's groups) | "mindspore" (its default filter)
    loss_divisor: int        # micro-batch losses are divided by it before backward
    clip_eps: float          # added to the total norm in the clip coefficient
    warmup_shift: int        # optimizer steps added to the configured warmup
    betas: tuple[float, float] = (0.9, 0.999)  # AdamW betas
    lr_lag: int = 0          # optimizer steps the schedule runs late (step s uses the lr of step s - lr_lag)
    head_grad_factor: float = 1.0  # the LM head's gradient times this in the backward (fault only)
    accum_dtype: str = "float32"   # the dtype each micro-batch's gradient is added in (torch: the fp32 p.grad)

    @classmethod
    def from_config(cls, cfg: RunConfig) -> TrainingKnobs:
        return cls(eps=cfg.optimizer.eps, bias_correction=True, decay_rule="hf",
                   loss_divisor=cfg.grad_accum_steps, clip_eps=TORCH_CLIP_EPS, warmup_shift=0,
                   betas=tuple(cfg.optimizer.betas))
