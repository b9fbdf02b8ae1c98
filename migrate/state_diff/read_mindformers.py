"""A MindSpore Transformers training checkpoint: one .ckpt or .safetensors file holding the weights (legacy
or mcore names) beside AdamW's moments (adam_m.<param>, adam_v.<param>) and the scalars its trainer appends
(global_step: the optimizer's step, scale_sense: the loss scale, learning_rate, step_num, ...; the names
`migrate.checkpoints.training_state` lists from MindFormers 2.0.0's source). The file names no model
config: `compare` takes it from the other side, or from ``--model DIR``."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from migrate.checkpoints.ms_reader import open_ms_checkpoint
from migrate.checkpoints.training_state import SCALARS, is_training_state
from migrate.errors import MigrateError
from migrate.state_diff.state import LOSS_SCALE, OPTIMIZER_STEP, STEP, TrainingState

MOMENT_PREFIXES = {"adam_m.": "exp_avg", "adam_v.": "exp_avg_sq"}
SUFFIXES = (".ckpt", ".safetensors")
# MindFormers' scalar -> what it counts here
COUNTER_NAMES = {"step_num": STEP, "global_step": OPTIMIZER_STEP, "scale_sense": LOSS_SCALE, "loss_scale": LOSS_SCALE}


def is_mindformers(path: Path) -> bool:
    """A single .ckpt / .safetensors file holding AdamW moments."""
    if not (path.is_file() and path.suffix in SUFFIXES):
        return False
    try:
        names = open_ms_checkpoint(path).specs
    except MigrateError:
        return True   # claimed by its suffix: `read` says what is wrong with it
    return any(n.startswith(tuple(MOMENT_PREFIXES)) for n in names)


def read(path: Path) -> TrainingState:
    ckpt = open_ms_checkpoint(path)
    params, moments, counters, lr = {}, {"exp_avg": {}, "exp_avg_sq": {}}, {}, None
    for name, array in ckpt.tensors():
        prefix = next((p for p in MOMENT_PREFIXES if name.startswith(p)), None)
        if prefix is not None:
            moments[MOMENT_PREFIXES[prefix]][name[len(prefix):]] = np.asarray(array, np.float32)
        elif name in SCALARS:
            value = _scalar(array)
            if name in COUNTER_NAMES and value is not None:
                counters.setdefault(COUNTER_NAMES[name], value)
            elif name == "learning_rate":
                lr = value
        elif not is_training_state(name):   # exp_avg.*, accu_grads.*: another optimizer's state, not compared
            params[name] = np.asarray(array, np.float32)
    if not moments["exp_avg"] and not moments["exp_avg_sq"]:
        raise MigrateError(f"{path}: no adam_m.* / adam_v.* moments (a model checkpoint, not a training state)")
    return TrainingState(path, "MindFormers", "ms", params, moments["exp_avg"], moments["exp_avg_sq"],
                         counters=counters, lr=lr)


def _scalar(array) -> float | None:
    a = np.asarray(array)
    return float(a.reshape(-1)[0]) if a.size == 1 else None
