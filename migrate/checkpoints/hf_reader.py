"""Lazy readers for Hugging Face checkpoints.

Layouts: `model.safetensors`, sharded safetensors with `model.safetensors.index.json`,
`pytorch_model.bin`, sharded `.bin` with `pytorch_model.bin.index.json`. Only
headers are read when the checkpoint is opened; `read(name)` materialises one
tensor. `.bin` files load with `weights_only=True` and `mmap=True`, so even they
are paged in one tensor at a time.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from migrate.checkpoints.dtypes import torch_to_numpy
from migrate.errors import MigrateError

SAFETENSORS_INDEX = "model.safetensors.index.json"
SAFETENSORS_SINGLE = "model.safetensors"
BIN_INDEX = "pytorch_model.bin.index.json"
BIN_SINGLE = "pytorch_model.bin"


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str            # safetensors dtype string: F32, F16, BF16, I64, ...
    shape: tuple[int, ...]
    file: Path


class HFCheckpoint:
    """One HF checkpoint folder: tensor specs up front, data on demand."""

    def __init__(self, root: Path, files: list[Path], specs: dict[str, TensorSpec], loaders: dict):
        self.root = root
        self.files = files
        self.specs = specs
        self._loaders = loaders  # file -> object with get_tensor(name)

    @property
    def layout(self) -> str:
        kind = "safetensors" if self.files[0].suffix == ".safetensors" else "bin"
        return f"{kind} ({len(self.files)} file{'s' if len(self.files) > 1 else ''})"

    def names(self) -> list[str]:
        return list(self.specs)

    def read(self, name: str) -> np.ndarray:
        spec = self.specs[name]
        try:
            tensor = self._loaders[spec.file].get_tensor(name)
        except MigrateError:
            raise
        except Exception as exc:
            raise MigrateError(f"cannot read tensor {name} from {spec.file.name}: {_first_line(exc)}") from None
        return torch_to_numpy(tensor)

    def close(self) -> None:
        self._loaders.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def open_hf_checkpoint(folder: str | Path) -> HFCheckpoint:
    root = Path(folder)
    if not root.is_dir():
        raise MigrateError(f"model folder not found: {root}")
    for index_name, single_name, opener in (
        (SAFETENSORS_INDEX, SAFETENSORS_SINGLE, _SafetensorsFile),
        (BIN_INDEX, BIN_SINGLE, _BinFile),
    ):
        if (root / index_name).is_file():
            weight_map = _read_index(root, index_name)
            return _assemble(root, weight_map, opener)
        if (root / single_name).is_file():
            return _assemble(root, None, opener, single=root / single_name)
    raise MigrateError(
        f"no weights in {root}: expected {SAFETENSORS_SINGLE}, {SAFETENSORS_INDEX}, {BIN_SINGLE} or {BIN_INDEX}"
    )


def _read_index(root: Path, index_name: str) -> dict[str, Path]:
    index_path = root / index_name
    try:
        index = json.loads(index_path.read_text())
        weight_map = index["weight_map"]
        if not isinstance(weight_map, dict):
            raise TypeError("weight_map is not a mapping")
    except (ValueError, KeyError, TypeError) as exc:
        raise MigrateError(f"corrupt index {index_path}: {_first_line(exc)}") from None
    resolved_root = root.resolve()
    out = {}
    for name, shard in weight_map.items():
        shard_path = (root / str(shard)).resolve()
        # An index is untrusted input: a shard name must stay inside the model folder.
        if Path(str(shard)).is_absolute() or resolved_root not in shard_path.parents:
            raise MigrateError(f"index {index_name} names a file outside the model folder: {shard}")
        if not shard_path.is_file():
            raise MigrateError(f"missing shard {shard} (named by {index_name})")
        out[name] = shard_path
    return out


def _assemble(root: Path, weight_map: dict[str, Path] | None, opener, single: Path | None = None) -> HFCheckpoint:
    files = sorted(set(weight_map.values())) if weight_map else [single]
    loaders, specs = {}, {}
    for file in files:
        loader = opener(file)
        loaders[file] = loader
        for name, dtype, shape in loader.specs():
            if weight_map is not None and weight_map.get(name) != file:
                raise MigrateError(f"{file.name} holds {name}, which the index does not place there")
            if name in specs:
                raise MigrateError(f"tensor {name} appears in both {specs[name].file.name} and {file.name}")
            specs[name] = TensorSpec(name, dtype, tuple(shape), file)
    if weight_map is not None:
        absent = [n for n in weight_map if n not in specs]
        if absent:
            raise MigrateError(f"index names tensors absent from their shards: {', '.join(absent)}")
    return HFCheckpoint(root, files, specs, loaders)


class _SafetensorsFile:
    def __init__(self, path: Path):
        from safetensors import safe_open

        self.path = path
        try:
            self._handle = safe_open(str(path), framework="pt")
        except Exception as exc:
            raise MigrateError(f"corrupt safetensors file {path.name}: {_first_line(exc)}") from None

    def specs(self):
        for name in self._handle.keys():
            sl = self._handle.get_slice(name)
            yield name, sl.get_dtype(), tuple(sl.get_shape())

    def get_tensor(self, name):
        return self._handle.get_tensor(name)


class _BinFile:
    def __init__(self, path: Path):
        import pickle
        import zipfile

        import torch

        self.path = path
        try:
            try:
                state = torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError as exc:
                if "mmap" not in str(exc):  # legacy (non-zip) files cannot be mapped
                    raise
                state = torch.load(str(path), map_location="cpu", weights_only=True)
        except pickle.UnpicklingError:
            raise MigrateError(
                f"{path.name} holds pickled objects other than tensors; refusing to load it (weights_only)"
            ) from None
        except (RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError) as exc:
            raise MigrateError(f"corrupt checkpoint file {path.name}: {_first_line(exc)}") from None
        if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
            state = state["state_dict"]
        if not isinstance(state, dict):
            raise MigrateError(f"{path.name} holds a {type(state).__name__}, not a mapping of tensors")
        bad = [str(k) for k, v in state.items() if not isinstance(k, str) or not isinstance(v, torch.Tensor)]
        if bad:
            raise MigrateError(f"{path.name} holds non-tensor entries: {', '.join(bad[:5])}")
        self._state = state

    def specs(self):
        from migrate.checkpoints.dtypes import torch_dtype_name

        for name, tensor in self._state.items():
            yield name, torch_dtype_name(tensor.dtype), tuple(tensor.shape)

    def get_tensor(self, name):
        return self._state[name]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
