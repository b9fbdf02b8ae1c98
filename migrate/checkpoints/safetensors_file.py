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
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from migrate.checkpoints.dtypes import SAFETENSORS_TO_NUMPY
from migrate.errors import MigrateError

MAX_HEADER = 100_000_000  # the limit safetensors itself enforces (MAX_HEADER_SIZE)


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
        """The header, checked as the reference reader (safetensors' Rust
        `SafeTensors::read_metadata` + `Metadata::validate`) checks it, so no file
        is read here that `safetensors` itself refuses: UTF-8 JSON (no NaN, no lone
        surrogate), known dtypes, sizes that fit shapes, and tensors covering the data
        buffer exactly, each starting where the previous one ends (no hole, no overlap,
        no trailing bytes). Stricter in one point, as the format's README asks: a
        tensor listed twice is refused even over the same bytes, where the library
        keeps the last entry (two readers could then see two different tensors)."""
        size = os.fstat(self._fd).st_size
        head = os.pread(self._fd, 8, 0)
        if len(head) < 8:
            raise self._corrupt("file is shorter than its 8-byte header length")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER or 8 + n > size:
            raise self._corrupt(f"header length {n} does not fit the file ({size} bytes)")
        raw = os.pread(self._fd, n, 8)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self._corrupt(f"header is not UTF-8 (byte {exc.start})") from None
        try:
            header = json.loads(text, object_pairs_hook=_Object, parse_constant=_no_constant)
            json.dumps(header, ensure_ascii=False).encode("utf-8")  # a lone surrogate escape (\ud800) fails here
        except (ValueError, UnicodeError, RecursionError) as exc:
            raise self._corrupt(f"header is not JSON ({_short(exc)})") from None
        if not isinstance(header, dict):
            raise self._corrupt("header is not a JSON object")
        if header.duplicates:
            raise self._corrupt(f"header lists {_name(min(header.duplicates))} twice")
        metadata = header.pop("__metadata__", None)
        if metadata is None:
            metadata = {}
        if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
            raise self._corrupt("__metadata__ must map strings to strings")
        metadata = dict(metadata)
        base, data_size = 8 + n, size - 8 - n
        entries, spans = {}, []
        for name, info in header.items():
            fields = _entry_fields(info)
            if fields is None:
                raise self._corrupt(f"bad header entry for {_name(name)}")
            dtype, shape, begin, end = fields
            if dtype not in _ITEMSIZE:
                raise self._corrupt(f"tensor {_name(name)}: unknown dtype {_short(dtype)}")
            if end < begin:
                raise self._corrupt(f"tensor {_name(name)}: data_offsets [{begin}, {end}] end before they begin")
            if end > data_size:
                raise self._corrupt(f"tensor {_name(name)} lies past the end of the file")
            if (end - begin) * 8 != math.prod(shape) * _ITEMSIZE[dtype]:
                raise self._corrupt(f"tensor {_name(name)}: {end - begin} bytes do not fit shape "
                                    f"{_short(shape)} of {dtype}")
            entries[name] = Entry(name, dtype, tuple(shape), base + begin, end - begin)
            spans.append((begin, end, name))
        spans.sort()
        covered = 0
        for begin, end, name in spans:
            if begin != covered:
                what = ("overlaps the tensor before it" if begin < covered
                        else f"starts at byte {begin}, leaving {begin - covered} unused bytes before it")
                raise self._corrupt(f"tensor {_name(name)} {what} in the data buffer")
            covered = end
        if covered != data_size:
            raise self._corrupt(f"the tensors cover {covered} of the {data_size} bytes after the header")
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


# Item sizes in bits, for every dtype safetensors 0.8 defines (sub-byte ones included),
# so sizes are checked even for dtypes this tool cannot convert; any other is refused.
_ITEMSIZE = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "F8_E4M3FNUZ": 8,
    "F8_E5M2FNUZ": 8, "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32,
    "F64": 64, "I64": 64, "U64": 64, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "C64": 64,
}


class _Object(dict):
    """A JSON object that remembers its duplicated keys (a dict keeps only the last),
    so the header can refuse them where the reference does: tensor names and
    `__metadata__` twice (and the format forbids it), a tensor's dtype, shape or
    data_offsets twice; not inside `__metadata__` or unknown fields, which the
    reference accepts (last wins)."""

    def __init__(self, pairs):
        super().__init__(pairs)
        self.duplicates = set() if len(self) == len(pairs) else {k for k, n in Counter(k for k, _ in pairs).items()
                                                                   if n > 1}


def _entry_fields(info) -> tuple | None:
    """(dtype, shape, begin, end) of one tensor's header entry; None when malformed."""
    if not isinstance(info, _Object) or info.duplicates & {"dtype", "shape", "data_offsets"}:
        return None
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if not (isinstance(dtype, str) and isinstance(shape, list) and all(_is_count(d) for d in shape)
            and isinstance(offsets, list) and len(offsets) == 2 and all(_is_count(o) for o in offsets)):
        return None
    return dtype, shape, offsets[0], offsets[1]


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def _is_count(value) -> bool:
    return type(value) is int and value >= 0  # not bool, not float: serde's usize


def _name(name: str) -> str:
    """A tensor name for a message: as is when short and printable, else quoted and cut."""
    return name if len(name) <= 200 and name.isprintable() else _short(name)


def _short(value, limit: int = 80) -> str:
    """A value from the file, quoted and cut, fit for a one-line message."""
    text = repr(value) if not isinstance(value, BaseException) else str(value)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."
