"""The files of a training checkpoint folder, and reading and writing one .ckpt file of it.

The names every checkpoint module shares (`ckpt` writes and opens folders, `dist_ckpt`
handles the per-rank optimizer shards of multi-process runs); MindSpore does the bytes.
"""
from __future__ import annotations

import os
from pathlib import Path

import mindspore as ms
import numpy as np

from migrate.errors import MigrateError
from migrate.lora.record import ADAPTER_FILE, LORA_FILE  # noqa: F401  a LoRA run's files, in place of model.ckpt
from migrate.run_protocol.record import METRICS_FILE  # noqa: F401  the run's metrics, carried in a checkpoint
from migrate.run_protocol.state import RNG_FILE  # noqa: F401  the generator states

MODEL_FILE = "model.ckpt"
MODEL_CONFIG = "model.yaml"
OPTIMIZER_FILE = "optimizer.ckpt"


def load_ckpt_file(path: Path) -> dict:
    """name -> Parameter of a MindSpore .ckpt file; a damaged file is one MigrateError line."""
    try:
        return ms.load_checkpoint(str(path))
    except Exception as exc:  # MindSpore raises ValueError/RuntimeError for damaged files
        raise MigrateError(f"mindspore cannot load {path}: {str(exc).strip().splitlines()[0]}") from None


def save_tensors_atomically(tensors: dict[str, np.ndarray], path: Path) -> None:
    """`mindspore.save_checkpoint` under a temporary name in the same folder, then rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.partial.ckpt")  # save_checkpoint wants the suffix
    try:
        ms.save_checkpoint([{"name": n, "data": ms.Tensor(np.ascontiguousarray(v))} for n, v in tensors.items()],
                           str(tmp))
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
