"""Streaming safetensors writer: header first (known from the specs), then each
tensor's bytes as it arrives, so the whole model is never in memory.

Layout (https://github.com/huggingface/safetensors): u64 little-endian header
length, JSON header padded with spaces to a multiple of 8, then one byte buffer
that the tensors' `data_offsets` cover with no holes. Like `safetensors`' own
`save_file`, tensors are laid out by decreasing item size, so every tensor is
aligned for zero-copy loads; `write` seeks to each tensor's slot, and
`open_tensor` fills one slot from byte chunks, so no tensor has to be whole in memory.
"""
from __future__ import annotations

import json
import math
import os
import struct

import numpy as np

from migrate.checkpoints.dtypes import NUMPY_TO_SAFETENSORS
from migrate.checkpoints.stream import copy_file_range
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
        self.bytes_written = self._base + offset  # the file's final size
        self._next = 0
        self._stream: _SlotStream | None = None
        self._file = open(self.path, "wb")
        self._file.write(struct.pack("<Q", len(blob)) + blob)

    def open_tensor(self, name: str, dtype, shape) -> _SlotStream:
        """Stream the next tensor's bytes in chunks of any size (see `write`)."""
        if self._file is None:
            raise MigrateError(f"{self.path}: write after close")
        if self._stream is not None:
            raise MigrateError(f"{self.path}: tensor {self._stream.name} is still being written")
        if self._next >= len(self._specs):
            raise MigrateError(f"{self.path}: tensor {name} is not in the specs (all specs written)")
        want, want_dtype, want_shape = self._specs[self._next]
        if name != want:
            raise MigrateError(f"{self.path}: expected tensor {want} next, got {name}")
        dtype, shape = np.dtype(dtype), tuple(int(d) for d in shape)
        if dtype != want_dtype or shape != want_shape:
            raise MigrateError(f"tensor {name}: got {dtype}{list(shape)}, "
                               f"specs say {want_dtype}{list(want_shape)}")
        self._file.seek(self._base + self._offsets[name])
        self._stream = _SlotStream(self, name, math.prod(shape) * dtype.itemsize)
        return self._stream

    def write(self, name: str, array: np.ndarray) -> None:
        array = np.asarray(array)
        stream = self.open_tensor(name, array.dtype, array.shape)
        if not array.flags.c_contiguous:
            array = np.array(array, order="C")
        stream.write(array.reshape(-1).view(np.uint8))  # raw bytes, bf16 included
        stream.close()

    def close(self) -> None:
        if self._file is None:
            return
        missing = [name for name, _, _ in self._specs[self._next:]]
        if self._stream is not None:
            missing = [self._stream.name] + missing
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
        self._stream = None
        os.remove(self.path)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        elif self._file is not None:
            self._abort()


class _SlotStream:
    """One tensor's slot, filled front to back with byte chunks."""

    def __init__(self, writer: SafetensorsWriter, name: str, nbytes: int):
        self.writer, self.name, self.nbytes, self.written = writer, name, nbytes, 0

    def write(self, chunk) -> None:
        view = memoryview(chunk).cast("B")
        if self.written + len(view) > self.nbytes:
            raise MigrateError(f"{self.writer.path}: tensor {self.name} got more than its {self.nbytes} bytes")
        self.writer._file.write(view)
        self.written += len(view)

    def copy_from(self, fd: int, offset: int) -> bool:
        """All the slot's bytes from file `fd` at `offset`, copied by the kernel;
        False (nothing written) where the kernel refuses."""

        if self.written or not copy_file_range(fd, offset, self.writer._file, self.nbytes):
            return False
        self.written = self.nbytes
        return True

    def close(self) -> None:
        if self.written != self.nbytes:
            raise MigrateError(f"{self.writer.path}: tensor {self.name} got {self.written} "
                               f"of its {self.nbytes} bytes")
        self.writer._stream = None
        self.writer._next += 1

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
