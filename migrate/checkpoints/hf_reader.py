"""Lazy readers for Hugging Face checkpoints.

Layouts: `model.safetensors`, sharded safetensors with `model.safetensors.index.json`,
`pytorch_model.bin`, sharded `.bin` with `pytorch_model.bin.index.json`; where a
folder holds several, the one `from_pretrained` loads (`weights_file`). Files may
be links inside the folder or inside the hub cache repository holding it
(`model_folder`), nowhere else. Only headers are read when the checkpoint is
opened; `read(name)` materialises one tensor and `read_into(name, start, buffer)`
copies any byte range of one, so a caller can stream a tensor through a small buffer.

Memory: safetensors files are read with explicit reads (no memory map, see
`safetensors_file`). `.bin` files load with `weights_only=True` and `mmap=True`;
the pages a read touches are handed back right after their bytes are copied
(`pages.drop_pages`), so neither layout accumulates resident memory. Old
non-zip `.bin` files cannot be mapped and load whole.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from migrate.checkpoints import pages  # a module, so a test can swap drop_pages for a no-op
from migrate.checkpoints.dtypes import SAFETENSORS_TO_NUMPY, torch_dtype_name, torch_to_numpy
from migrate.checkpoints.model_folder import ModelFolder
from migrate.checkpoints.safetensors_file import SafetensorsFile
from migrate.errors import MigrateError
from migrate.jsonsafe import load_json

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

    @property
    def numpy_dtype(self) -> np.dtype:
        dtype = SAFETENSORS_TO_NUMPY.get(self.dtype)
        if dtype is None:
            raise MigrateError(f"tensor {self.name}: dtype {self.dtype} is not supported")
        return dtype

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.numpy_dtype.itemsize


class HFCheckpoint:
    """One HF checkpoint folder: tensor specs up front, data on demand."""

    def __init__(self, root: Path, files: list[Path], specs: dict[str, TensorSpec], loaders: dict,
                 index: Path | None = None):
        self.root = root
        self.files = files        # the weights files read, as the folder names them (not resolved)
        self.index = index        # the index that placed them, if any
        self.specs = specs
        self._loaders = loaders  # file -> object with read_into(name, start, out)
        self._stored: dict[str, str] = {}  # name shown -> name in the file, where they differ

    def add_prefix_if_absent(self, prefix: str | None) -> HFCheckpoint:
        """Show a checkpoint saved from the base model alone (GPT-2's hub files: `h.0.attn...`,
        no `transformer.`) under the full model's names, as transformers loads it; unchanged
        without a prefix or when any name already carries it."""
        if prefix and self.specs and not any(name.startswith(prefix) for name in self.specs):
            self._stored = {prefix + name: name for name in self.specs}
            self.specs = {prefix + name: spec for name, spec in self.specs.items()}
        return self

    @property
    def layout(self) -> str:
        kind = "safetensors" if self.files[0].suffix == ".safetensors" else "bin"
        return f"{kind} ({len(self.files)} file{'s' if len(self.files) > 1 else ''})"

    def names(self) -> list[str]:
        return list(self.specs)

    def read(self, name: str) -> np.ndarray:
        """One whole tensor as a fresh array (bf16 as raw 16-bit data)."""
        spec = self.specs[name]
        array = np.empty(spec.shape, spec.numpy_dtype)
        if array.nbytes:
            self.read_into(name, 0, array.reshape(-1).view(np.uint8))
        return array

    def read_into(self, name: str, start: int, out) -> None:
        """Copy bytes [start, start + len(out)) of tensor `name` (C order) into `out`."""
        spec = self.specs[name]
        try:
            self._loaders[spec.file].read_into(self._stored.get(name, name), start, out)
        except MigrateError:
            raise
        except Exception as exc:
            raise MigrateError(f"cannot read tensor {name} from {spec.file.name}: {_first_line(exc)}") from None

    def source(self, name: str) -> tuple[int, int] | None:
        """(file descriptor, offset) where tensor `name`'s raw bytes lie contiguously
        in a file, for a kernel file-to-file copy; None when they do not (.bin)."""
        spec = self.specs[name]
        return self._loaders[spec.file].source(self._stored.get(name, name))

    def close(self) -> None:
        for loader in self._loaders.values():
            loader.close()
        self._loaders.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def open_hf_checkpoint(folder: str | Path) -> HFCheckpoint:
    """The weights of an HF folder, picked exactly as `from_pretrained` picks them
    (`weights_file`); every file must lie inside the folder (`ModelFolder`)."""
    root = Path(folder)
    if not root.is_dir():
        raise MigrateError(f"model folder not found: {root}")
    model = ModelFolder(root)
    name, named_by = weights_file(root)
    path = model.file(name, named_by)
    if not path.is_file():
        raise MigrateError(f"{named_by} names {name}, which is not in {root}")
    opener = _SafetensorsFile if name.endswith((".safetensors", ".safetensors.index.json")) else _BinFile
    if name.endswith(".index.json"):
        return _assemble(root, _read_index(model, path), opener, index=path)
    return _assemble(root, None, opener, single=path)


def weights_file(root: Path) -> tuple[str, str]:
    """(file, what names it): the file `transformers`' `from_pretrained(root)` loads
    (modeling_utils `_get_resolved_checkpoint_files`, local folder): config.json's
    `transformers_weights` when set, else the first present of model.safetensors,
    model.safetensors.index.json, pytorch_model.bin, pytorch_model.bin.index.json.
    A single file wins over an index beside it, as there: following that order,
    rather than refusing a folder holding both, keeps `convert` and `migrate diff`
    on the weights HF itself runs."""
    explicit = _explicit_weights(root)
    if explicit is not None:
        if not explicit.endswith((".safetensors", ".safetensors.index.json")):
            shown = repr(explicit if len(explicit) <= 200 else explicit[:200] + "...")
            raise MigrateError(f"config.json's transformers_weights names {shown}: a model's weights are read "
                               "from a .safetensors file or a .safetensors.index.json")
        return explicit, "config.json's transformers_weights"
    for name in (SAFETENSORS_SINGLE, SAFETENSORS_INDEX, BIN_SINGLE, BIN_INDEX):
        if (root / name).is_file():
            return name, name
    raise MigrateError(
        f"no weights in {root}: expected {SAFETENSORS_SINGLE}, {SAFETENSORS_INDEX}, {BIN_SINGLE} or {BIN_INDEX}"
    )


def _explicit_weights(root: Path) -> str | None:
    """config.json's `transformers_weights`. A config.json that cannot be read is
    the config reader's to refuse; here it names no file."""
    try:
        config = load_json(root / "config.json")
    except (OSError, ValueError):
        return None
    value = config.get("transformers_weights") if isinstance(config, dict) else None
    return None if value is None else str(value)


def _read_index(model: ModelFolder, index_path: Path) -> dict[str, Path]:
    index_name = index_path.name
    try:
        index = load_json(index_path)
        weight_map = index["weight_map"]
        if not isinstance(weight_map, dict):
            raise TypeError("weight_map is not a mapping")
    except (ValueError, KeyError, TypeError) as exc:
        raise MigrateError(f"corrupt index {index_path}: {_first_line(exc)}") from None
    except OSError as exc:
        raise MigrateError(f"cannot read {index_path}: {exc.strerror}") from None
    if not weight_map:
        raise MigrateError(f"index {index_name} names no tensors")
    shards: dict[str, Path] = {}
    for shard in dict.fromkeys(map(str, weight_map.values())):  # each file once, not once per tensor
        # An index is untrusted input: shard names (relative to the model folder, as
        # transformers reads them) must stay inside it.
        shards[shard] = model.file(shard, f"index {index_name}")
        if not shards[shard].is_file():
            raise MigrateError(f"missing shard {shard} (named by {index_name})")
    return {name: shards[str(shard)] for name, shard in weight_map.items()}


def _assemble(root: Path, weight_map: dict[str, Path] | None, opener, single: Path | None = None,
              index: Path | None = None) -> HFCheckpoint:
    files = sorted(set(weight_map.values())) if weight_map is not None else [single]
    loaders, specs = {}, {}
    try:
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
    except BaseException:
        for loader in loaders.values():  # no file left open behind a refusal
            loader.close()
        raise
    return HFCheckpoint(root, files, specs, loaders, index)


class _SafetensorsFile:
    def __init__(self, path: Path):
        self.path = path
        self._file = SafetensorsFile(path)

    def specs(self):
        for entry in self._file.entries.values():
            yield entry.name, entry.dtype, entry.shape

    def read_into(self, name, start, out):
        self._file.read_into(name, start, out)

    def source(self, name):
        return self._file.source(name)

    def close(self):
        self._file.close()


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

        self._mappings = pages.file_mappings(path)  # empty when the file could not be mapped
        self._current = (None, None)          # (name, raw bytes) of the tensor being read

    def specs(self):
        for name, tensor in self._state.items():
            yield name, torch_dtype_name(tensor.dtype), tuple(tensor.shape)

    def source(self, name):
        return None

    def _raw(self, name) -> np.ndarray:
        if self._current[0] != name:
            # A view into the mapping for contiguous tensors (the usual case); a copy otherwise.
            self._current = (name, torch_to_numpy(self._state[name]).reshape(-1).view(np.uint8))
        return self._current[1]

    def read_into(self, name, start, out):
        raw = self._raw(name)
        view = np.frombuffer(memoryview(out).cast("B"), np.uint8)
        stop = start + view.size
        if start < 0 or stop > raw.size:
            raise MigrateError(f"read past the end of tensor {name}")
        np.copyto(view, raw[start:stop])
        if self._mappings:
            # Include the page before `start`: its tail was copied by the previous read.
            first = max(0, start - pages.PAGE)
            pages.drop_pages(raw.ctypes.data + first, stop - first, self._mappings)
        if stop == raw.size:
            self._current = (None, None)

    def close(self):
        self._state = {}
        self._current = (None, None)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
