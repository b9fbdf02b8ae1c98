"""Read safetensors files with explicit reads, never a memory map.

`safetensors.safe_open` maps the file; every page a read touches then counts
toward the process's resident memory until the map is closed, so reading a
whole 5 GB shard tensor by tensor leaves 5 GB resident. Here the header is
parsed and validated once, and tensor bytes are copied with `os.preadv` into
buffers the caller owns (the GIL is released during the copy): resident memory
stays what the caller allocates.

Layout (https://github.com/huggingface/safetensors): u64 little-endian header
length N, N bytes of JSON header, then one byte buffer that the tensors'
`data_offsets` (relative to the buffer) cover.
"""
from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from migrate.checkpoints.dtypes import SAFETENSORS_TO_NUMPY
from migrate.errors import MigrateError

MAX_HEADER = 100 * 1024 * 1024  # the limit safetensors itself enforces


@dataclass(frozen=True)
class Entry:
    name: str
    dtype: str                  # safetensors dtype string (F32, BF16, ...)
    shape: tuple[int, ...]
    offset: int                 # absolute file offset of the first byte
    nbytes: int

    @property
    def numpy_dtype(self) -> np.dtype:
        dtype = SAFETENSORS_TO_NUMPY.get(self.dtype)
        if dtype is None:
            raise MigrateError(f"tensor {self.name}: safetensors dtype {self.dtype} is not supported")
        return dtype


class SafetensorsFile:
    """One safetensors file: validated header up front, bytes on demand."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        try:
            self._fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError as exc:
            raise MigrateError(f"cannot read {self.path}: {exc.strerror}") from None
        try:
            self.entries, self.metadata = self._parse()
        except BaseException:
            os.close(self._fd)
            self._fd = None
            raise

    def _corrupt(self, what: str) -> MigrateError:
        return MigrateError(f"corrupt safetensors file {self.path.name}: {what}")

    def _parse(self):
        size = os.fstat(self._fd).st_size
        head = os.pread(self._fd, 8, 0)
        if len(head) < 8:
            raise self._corrupt("file is shorter than its 8-byte header length")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER or 8 + n > size:
            raise self._corrupt(f"header length {n} does not fit the file ({size} bytes)")
        try:
            header = json.loads(os.pread(self._fd, n, 8))
        except (ValueError, UnicodeDecodeError) as exc:
            raise self._corrupt(f"header is not JSON ({exc})") from None
        if not isinstance(header, dict):
            raise self._corrupt("header is not a JSON object")
        metadata = header.pop("__metadata__", None) or {}
        if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
            raise self._corrupt("__metadata__ must map strings to strings")
        base, data_size = 8 + n, size - 8 - n
        entries, spans = {}, []
        for name, info in header.items():
            try:
                dtype, shape, (begin, end) = info["dtype"], info["shape"], info["data_offsets"]
                if not (isinstance(dtype, str) and isinstance(shape, list)
                        and all(isinstance(d, int) and d >= 0 for d in shape)
                        and isinstance(begin, int) and isinstance(end, int)):
                    raise TypeError
            except (TypeError, KeyError, ValueError):
                raise self._corrupt(f"bad header entry for {name}") from None
            if not 0 <= begin <= end <= data_size:
                raise self._corrupt(f"tensor {name} lies past the end of the file")
            itemsize = _ITEMSIZE.get(dtype)
            if itemsize is not None and (end - begin) * 8 != math.prod(shape) * itemsize:
                raise self._corrupt(f"tensor {name}: {end - begin} bytes do not fit shape {shape} of {dtype}")
            entries[name] = Entry(name, dtype, tuple(shape), base + begin, end - begin)
            spans.append((begin, end, name))
        spans.sort()
        for (_, end, a), (begin, _, b) in zip(spans, spans[1:]):
            if begin < end:
                raise self._corrupt(f"tensors {a} and {b} overlap")
        # File order: reading in this order is sequential.
        ordered = {name: entries[name] for _, _, name in spans}
        return ordered, metadata

    # ---------- reading ----------
    def read_into(self, name: str, start: int, out) -> None:
        """Copy bytes [start, start + len(out)) of tensor `name` into the writable buffer `out`."""
        entry = self.entries[name]
        view = memoryview(out).cast("B")
        if start < 0 or start + len(view) > entry.nbytes:
            raise MigrateError(f"read past the end of tensor {name}")
        offset, got = entry.offset + start, 0
        while got < len(view):
            n = os.preadv(self._fd, [view[got:]], offset + got)
            if n <= 0:
                raise self._corrupt(f"file shrank while reading {name}")
            got += n

    def source(self, name: str) -> tuple[int, int]:
        """(file descriptor, absolute offset) of the tensor's bytes, valid until `close`."""
        return self._fd, self.entries[name].offset

    def read(self, name: str) -> np.ndarray:
        """The whole tensor as a fresh numpy array."""
        entry = self.entries[name]
        array = np.empty(entry.shape, entry.numpy_dtype)
        if entry.nbytes:
            self.read_into(name, 0, array.reshape(-1).view(np.uint8))
        return array

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


# Item sizes in bits, for every dtype safetensors defines (sub-byte ones included),
# so sizes are checked even for dtypes this tool cannot convert.
_ITEMSIZE = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "I16": 16, "U16": 16,
    "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "F64": 64, "I64": 64, "U64": 64,
    "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "C64": 64,
}
