"""`migrate inspect`: list a checkpoint's tensors without loading their data."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from migrate.checkpoints.dtypes import SAFETENSORS_TO_NUMPY, short_name
from migrate.checkpoints.hf_reader import open_hf_checkpoint
from migrate.checkpoints.ms_reader import is_ms_checkpoint_dir, open_ms_checkpoint
from migrate.errors import MigrateError


def inspect_checkpoint(path: str | Path) -> list[tuple[str, str, tuple[int, ...]]]:
    """(name, dtype, shape) for every tensor of a MindSpore checkpoint or an HF folder."""
    path = Path(path)
    # An HF folder (config.json, no model.yaml) is read as HF reads it, hub-cache links included.
    hf_folder = (path / "config.json").is_file() and not (path / "model.yaml").is_file()
    if path.is_dir() and (hf_folder or not is_ms_checkpoint_dir(path)):
        ckpt = open_hf_checkpoint(path)
        # A dtype convert cannot read (F8_E4M3, ...) is listed under its safetensors name, not hidden.
        return [(n, short_name(SAFETENSORS_TO_NUMPY[s.dtype]) if s.dtype in SAFETENSORS_TO_NUMPY else s.dtype,
                 s.shape) for n, s in ckpt.specs.items()]
    if not path.exists():
        raise MigrateError(f"checkpoint not found: {path}")
    ckpt = open_ms_checkpoint(path)
    return [(n, short_name(d), shape) for n, (d, shape) in ckpt.specs.items()]


def total_parameters(rows) -> int:
    return int(sum(int(np.prod(shape, dtype=np.int64)) for _, _, shape in rows))
