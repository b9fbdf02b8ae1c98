"""Read a MindSpore checkpoint (`.ckpt` or safetensors, one file or sharded with
an index) one tensor at a time.

A checkpoint is named by a folder (holding `model.ckpt`, `model.safetensors`,
`model.ckpt.index.json` or `model.safetensors.index.json`), by one of those
files, or by any single `.ckpt` / `.safetensors` file. See `sharding` for the
index format.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np

from migrate.checkpoints.dtypes import MS_TYPE_TO_NUMPY
from migrate.checkpoints.input_folder import InputFolder
from migrate.checkpoints.integrity import verify_checkpoint
from migrate.checkpoints.ms_ckpt import iter_ckpt, read_ckpt_ranges, read_ckpt_specs
from migrate.checkpoints.safetensors_file import SafetensorsFile
from migrate.checkpoints.sharding import index_name, read_index, single_name
from migrate.errors import MigrateError

# What a converted folder holds, in the order they are looked for.
CHECKPOINT_NAMES = (index_name("ckpt"), single_name("ckpt"), index_name("safetensors"), single_name("safetensors"))


@dataclass
class MSCheckpoint:
    path: Path                                    # the file, or the index of a sharded checkpoint
    format: str                                   # "ckpt" | "safetensors"
    specs: dict[str, tuple[np.dtype, tuple[int, ...]]]   # in reading order
    files: list[Path] = field(default_factory=list)      # every data file, in reading order
    locations: dict[str, Path] = field(default_factory=dict)  # tensor -> file

    @property
    def sharded(self) -> bool:
        return len(self.files) > 1 or self.path.suffix == ".json"

    def entries(self) -> Iterator[tuple[str, tuple[int, int] | None, Callable[[], np.ndarray]]]:
        """Every tensor, in `specs` order: its name; (fd, offset) of its bytes where they lie in a file
        as one plain range that needs no check (a kernel copy can take them), else None; and a function
        that reads it as an array (valid until the next entry)."""
        for file in self.files:
            if self.format == "safetensors":
                with SafetensorsFile(file) as handle:
                    for name in handle.entries:
                        yield name, handle.source(name), partial(handle.read, name)
                continue
            ranges = read_ckpt_ranges(file)
            if ranges is None:  # a CRC to check, or strings: every record read in order
                for name, array in self._ckpt_arrays(file):
                    yield name, None, partial(_same, array)
                continue
            with open(file, "rb") as handle:
                for name, pieces in ranges.items():
                    self._placed(name, file)
                    raw = (handle.fileno(), pieces[0][0]) if len(pieces) == 1 else None
                    yield name, raw, partial(_read_pieces, handle.fileno(), pieces, *self.specs[name])

    def _placed(self, name: str, file: Path) -> None:
        if self.locations.get(name) != file:
            raise MigrateError(f"{file.name} holds {name}, which the index does not place there")

    def _ckpt_arrays(self, file: Path) -> Iterator[tuple[str, np.ndarray]]:
        for name, array in iter_ckpt(file):
            self._placed(name, file)
            yield name, array

    def tensors(self) -> Iterator[tuple[str, np.ndarray]]:
        """Every tensor, in `specs` order, one at a time in memory."""
        for file in self.files:
            if self.format == "ckpt":
                yield from self._ckpt_arrays(file)
            else:
                with SafetensorsFile(file) as handle:
                    for name in handle.entries:
                        yield name, handle.read(name)


def _same(array: np.ndarray) -> np.ndarray:
    return array


def _read_pieces(fd: int, pieces: list[tuple[int, int]], dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """A tensor from its data pieces (read_ckpt_ranges), joined in order."""
    array = np.empty(shape, dtype)
    flat, filled = array.reshape(-1).view(np.uint8), 0
    for offset, length in pieces:
        view, got = memoryview(flat[filled:filled + length]), 0
        while got < length:
            n = os.preadv(fd, [view[got:]], offset + got)
            if n <= 0:
                raise MigrateError(f"a MindSpore checkpoint shrank while reading tensor bytes at {offset + got}")
            got += n
        filled += length
    return array


def find_checkpoint(path: str | Path) -> Path:
    """The checkpoint file, or index, that `path` names."""
    path = Path(path)
    if path.is_dir():
        for name in CHECKPOINT_NAMES:
            if (path / name).is_file():
                return InputFolder(path, "model folder").member(name, name)  # never a link out of it
        raise MigrateError(f"no {', '.join(CHECKPOINT_NAMES)} in {path}")
    if not path.is_file():
        raise MigrateError(f"checkpoint not found: {path}")
    return path


def is_ms_checkpoint_dir(path: str | Path) -> bool:
    """True for a folder holding a MindSpore checkpoint this package wrote."""
    path = Path(path)
    return path.is_dir() and any((path / name).is_file() for name in CHECKPOINT_NAMES)


def checkpoint_files(path: str | Path) -> tuple[str, list[Path]]:
    """(format, data files in reading order) of a checkpoint file, index or folder."""
    path = find_checkpoint(path)
    if path.name.endswith(".index.json"):
        fmt, locations = read_index(path)
        return fmt, list(dict.fromkeys(sorted(locations.values())))
    if path.suffix in (".ckpt", ".safetensors"):
        return path.suffix[1:], [path]
    raise MigrateError(f"not a MindSpore checkpoint (expected .ckpt, .safetensors or an index): {path}")


def open_ms_checkpoint(path: str | Path) -> MSCheckpoint:
    """Names, dtypes and shapes of every tensor, reading headers only -- except that a
    training checkpoint folder (`migrate.checkpoints.integrity`) is checked against its manifest first."""
    if Path(path).is_dir():
        verify_checkpoint(path)
    path = find_checkpoint(path)
    fmt, files = checkpoint_files(path)
    locations: dict[str, Path] = {}
    specs: dict[str, tuple[np.dtype, tuple[int, ...]]] = {}
    placed = read_index(path)[1] if path.name.endswith(".index.json") else None
    for file in files:
        if file.is_file() and file.stat().st_size == 0:  # read as "no tensors": "21 parameters not loaded"
            raise MigrateError(f"{file} is empty (0 bytes): a checkpoint cut short or never written")
        for name, dtype, shape in _file_specs(file, fmt):
            if placed is not None and placed.get(name) != file:
                raise MigrateError(f"{file.name} holds {name}, which the index does not place there")
            if name in specs:
                raise MigrateError(f"tensor {name} appears in both {locations[name].name} and {file.name}")
            specs[name] = (dtype, shape)
            locations[name] = file
    if placed is not None:
        absent = [n for n in placed if n not in specs]
        if absent:
            raise MigrateError(f"index names tensors absent from their shards: {', '.join(absent[:5])}")
    return MSCheckpoint(path, fmt, specs, files, locations)


def _file_specs(file: Path, fmt: str):
    if fmt == "safetensors":
        with SafetensorsFile(file) as handle:
            return [(e.name, e.numpy_dtype, e.shape) for e in handle.entries.values()]

    out = []
    for name, ms_type, shape in read_ckpt_specs(file):
        if ms_type not in MS_TYPE_TO_NUMPY:
            raise MigrateError(f"{file.name}: tensor {name} has unsupported type {ms_type}")
        out.append((name, MS_TYPE_TO_NUMPY[ms_type], tuple(shape)))
    return out
