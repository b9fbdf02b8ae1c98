"""Streaming safetensors writer: header first (known from the specs), then each
tensor's bytes as it arrives, so the whole model is never in memory.

Layout (https://github.com/huggingface/safetensors): u64 little-endian header
length, JSON header padded with spaces to a multiple of 8, then one byte buffer
that the tensors' `data_offsets` cover with no holes. Like `safetensors`' own
`save_file`, tensors are laid out by decreasing item size, so every tensor is
aligned for zero-copy loads; `write` seeks to each tensor's slot.
"""
from __future__ import annotations

import json
import math
import os
import struct

import numpy as np

from migrate.checkpoints.dtypes import NUMPY_TO_SAFETENSORS
from migrate.errors import MigrateError


class SafetensorsWriter:
    def __init__(self, path, specs, metadata: dict[str, str] | None = None):
        self.path = os.fspath(path)
        self._specs = [(name, np.dtype(dtype), tuple(int(d) for d in shape)) for name, dtype, shape in specs]
        header: dict = {}
        if metadata:
            if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
                raise MigrateError("safetensors metadata must map strings to strings")
            header["__metadata__"] = dict(metadata)
        self._offsets = {}
        offset = 0
        # sorted() is stable: equal item sizes keep the order of the specs.
        for name, dtype, shape in sorted(self._specs, key=lambda s: -s[1].itemsize):
            if name in self._offsets or name == "__metadata__":
                raise MigrateError(f"safetensors: tensor name {name!r} is duplicated or reserved")
            if dtype not in NUMPY_TO_SAFETENSORS:
                raise MigrateError(f"tensor {name}: dtype {dtype} cannot be stored in safetensors")
            size = math.prod(shape) * dtype.itemsize
            self._offsets[name] = offset
            header[name] = {"dtype": NUMPY_TO_SAFETENSORS[dtype], "shape": list(shape),
                            "data_offsets": [offset, offset + size]}
            offset += size
        blob = json.dumps(header, separators=(",", ":")).encode()
        blob += b" " * (-len(blob) % 8)
        self._base = 8 + len(blob)
        self._next = 0
        self._file = open(self.path, "wb")
        self._file.write(struct.pack("<Q", len(blob)) + blob)

    def write(self, name: str, array: np.ndarray) -> None:
        if self._file is None:
            raise MigrateError(f"{self.path}: write after close")
        if self._next >= len(self._specs):
            raise MigrateError(f"{self.path}: tensor {name} is not in the specs (all specs written)")
        want, dtype, shape = self._specs[self._next]
        if name != want:
            raise MigrateError(f"{self.path}: expected tensor {want} next, got {name}")
        array = np.asarray(array)
        if array.dtype != dtype or array.shape != shape:
            raise MigrateError(f"tensor {name}: got {array.dtype}{list(array.shape)}, "
                               f"specs say {dtype}{list(shape)}")
        if not array.flags.c_contiguous:
            array = np.array(array, order="C")
        self._file.seek(self._base + self._offsets[name])
        self._file.write(array.reshape(-1).view(np.uint8))  # raw bytes, bf16 included
        self._next += 1

    def close(self) -> None:
        if self._file is None:
            return
        missing = [name for name, _, _ in self._specs[self._next:]]
        if not missing:
            self._file.close()
            self._file = None
            return
        # Unwritten slots would read back as zeros (or a short file): never keep it.
        self._abort()
        raise MigrateError(f"{self.path}: {len(missing)} tensors never written, first {missing[0]}")

    def _abort(self) -> None:
        self._file.close()
        self._file = None
        os.remove(self.path)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        elif self._file is not None:
            self._abort()
