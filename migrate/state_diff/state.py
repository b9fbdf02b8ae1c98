"""One training state, whatever wrote it: what `compare` judges."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from migrate.errors import MigrateError

# The counters and scalars a state may record, in the order they are compared (the first things a
# resumed or replayed step reads).
STEP, OPTIMIZER_STEP, SCHEDULER_STEP, LOSS_SCALE, LR = (
    "step", "optimizer step", "scheduler position", "loss scale", "learning rate")
COUNTERS = (STEP, OPTIMIZER_STEP, SCHEDULER_STEP, LOSS_SCALE)
MOMENTS = ("exp_avg", "exp_avg_sq")   # AdamW's first and second moments, torch's names


@dataclass
class TrainingState:
    path: Path
    format: str                       # "migrate train", "golden", "HF Trainer", "MindFormers"
    names: str                        # "hf" or "ms": whose parameter names the tensors carry
    params: dict[str, np.ndarray]
    exp_avg: dict[str, np.ndarray]
    exp_avg_sq: dict[str, np.ndarray]
    counters: dict[str, float] = field(default_factory=dict)   # COUNTERS where recorded
    lr: float | None = None           # the learning rate the next step uses
    rng: dict[str, np.ndarray] = field(default_factory=dict)   # generator -> its state as integers
    config: dict | None = None        # config.json (names "hf") or model.yaml's fields (names "ms")
    keymap: str | None = None         # the keymap the state records (a MindSpore side)
    dtype: str | None = None          # the run's precision, where recorded

    @property
    def label(self) -> str:
        return self.format

    def moments(self, which: str) -> dict[str, np.ndarray]:
        return self.exp_avg if which == "exp_avg" else self.exp_avg_sq

    def check_complete(self) -> TrainingState:
        """Every parameter has both moments, of its shape, and no moment lacks its parameter."""
        for which in MOMENTS:
            moments = self.moments(which)
            missing = [n for n in self.params if n not in moments]
            if missing:
                raise MigrateError(f"{self.path}: no {which} for {len(missing)} parameters, first "
                                   f"{missing[0]} ({self.format} checkpoint without its moments)")
            stray = [n for n in moments if n not in self.params]
            if stray:
                raise MigrateError(f"{self.path}: {which} of {stray[0]}, which is no parameter of the checkpoint")
            wrong = [n for n, a in moments.items() if tuple(a.shape) != tuple(self.params[n].shape)]
            if wrong:
                raise MigrateError(f"{self.path}: {which} of {wrong[0]} has shape {list(moments[wrong[0]].shape)}, "
                                   f"its parameter {list(self.params[wrong[0]].shape)}")
        return self


def rng_arrays(rng) -> dict[str, np.ndarray]:
    """Python's and numpy's Mersenne Twister states as integer arrays (key words, then the position), from
    rng_state.json's lists; the generators both kinds of checkpoint record."""
    out = {}
    if not isinstance(rng, dict):
        return out
    try:
        if rng.get("python"):
            _, internal, _ = rng["python"]
            out["python"] = np.asarray(internal, np.int64)
        if rng.get("numpy"):
            _, keys, pos, *_ = rng["numpy"]
            out["numpy"] = np.append(np.asarray(keys, np.int64), int(pos))
    except (TypeError, ValueError) as exc:
        raise MigrateError(f"unreadable generator state: {exc}") from None
    return out
