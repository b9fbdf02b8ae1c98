"""An HF checkpoint folder's weights and config.json (golden's and HF Trainer's checkpoints alike)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from migrate.checkpoints.hf_reader import open_hf_checkpoint
from migrate.checkpoints.input_folder import InputFolder
from migrate.errors import MigrateError


def read_weights(path: Path) -> dict[str, np.ndarray]:
    """Every weight as float32 numpy (what AdamW's state is kept in), under its HF name."""
    with open_hf_checkpoint(path) as ckpt:
        return {name: np.asarray(ckpt.read(name), np.float32) for name in ckpt.names()}


def read_config(path: Path) -> dict:
    config = InputFolder(path, "checkpoint").json("config.json", expect=dict)
    if not config.get("model_type") and not config.get("architectures"):
        raise MigrateError(f"{path / 'config.json'} names no model_type or architectures")
    return config
