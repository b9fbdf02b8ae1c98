"""When a run evaluates and checkpoints (optimizer steps, 1-based), the same on both trainers."""
from __future__ import annotations


def eval_due(cfg, step: int) -> bool:
    """Evaluate after step `step`: every eval_interval steps (none when unset)."""
    return bool(cfg.eval_interval) and step % cfg.eval_interval == 0


def checkpoint_due(cfg, step: int) -> bool:
    """Checkpoint after step `step`: every checkpoint_interval steps, and after the last one."""
    return bool(cfg.checkpoint_interval) and (step % cfg.checkpoint_interval == 0 or step == cfg.total_steps)
