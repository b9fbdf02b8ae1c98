"""Read a MindSpore checkpoint (`.ckpt` or safetensors) one tensor at a time."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from migrate.checkpoints.dtypes import MS_TYPE_TO_NUMPY, SAFETENSORS_TO_NUMPY, torch_to_numpy
from migrate.errors import MigrateError

CHECKPOINT_NAMES = ("model.ckpt", "model.safetensors")


@dataclass
class MSCheckpoint:
    path: Path
    format: str                                   # "ckpt" | "safetensors"
    specs: dict[str, tuple[np.dtype, tuple[int, ...]]]

    def tensors(self) -> Iterator[tuple[str, np.ndarray]]:
        """Every tensor, in file order, one at a time."""
        if self.format == "ckpt":
            from migrate.checkpoints.ms_ckpt import iter_ckpt

            yield from iter_ckpt(self.path)
            return
        from safetensors import safe_open

        with safe_open(str(self.path), framework="pt") as handle:
            for name in self.specs:
                yield name, torch_to_numpy(handle.get_tensor(name))


def find_checkpoint(path: str | Path) -> Path:
    path = Path(path)
    if path.is_dir():
        for name in CHECKPOINT_NAMES:
            if (path / name).is_file():
                return path / name
        raise MigrateError(f"no {' or '.join(CHECKPOINT_NAMES)} in {path}")
    if not path.is_file():
        raise MigrateError(f"checkpoint not found: {path}")
    return path


def open_ms_checkpoint(path: str | Path) -> MSCheckpoint:
    path = find_checkpoint(path)
    if path.suffix == ".safetensors":
        from safetensors import safe_open

        try:
            with safe_open(str(path), framework="pt") as handle:
                specs = {}
                for name in handle.keys():
                    sl = handle.get_slice(name)
                    specs[name] = (SAFETENSORS_TO_NUMPY[sl.get_dtype()], tuple(sl.get_shape()))
        except Exception as exc:
            raise MigrateError(f"corrupt safetensors file {path.name}: {str(exc).splitlines()[0]}") from None
        return MSCheckpoint(path, "safetensors", specs)
    if path.suffix == ".ckpt":
        from migrate.checkpoints.ms_ckpt import read_ckpt_specs

        specs = {}
        for name, ms_type, shape in read_ckpt_specs(path):
            if ms_type not in MS_TYPE_TO_NUMPY:
                raise MigrateError(f"{path.name}: tensor {name} has unsupported type {ms_type}")
            specs[name] = (MS_TYPE_TO_NUMPY[ms_type], tuple(shape))
        return MSCheckpoint(path, "ckpt", specs)
    raise MigrateError(f"not a MindSpore checkpoint (expected .ckpt or .safetensors): {path}")
