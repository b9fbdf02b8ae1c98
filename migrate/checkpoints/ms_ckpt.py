"""MindSpore `.ckpt` files written and read straight from array buffers.

A `.ckpt` is the protobuf `Checkpoint { repeated Value value = 1; }` where
`Value { tag = 1; TensorProto tensor = 2; }` and
`TensorProto { repeated int64 dims = 1; tensor_type = 2; tensor_content = 3; }`.
Serialised, the file is just one `value` record after another, so each record
can be framed by hand: `mindspore.save_checkpoint` builds a protobuf object per
record (slow, one full copy of the data) and its loader parses the whole file
at once. Here each tensor goes from its buffer to disk, and back, one at a time.

Facts copied from mindspore/train/serialization.py (2.10):
- tensor bytes are cut into pieces of `1024 * SLICE_SIZE` bytes (512 MiB);
  every piece is its own record with the same tag and the full dims;
- an empty tensor yields no piece at all, so MindSpore silently drops it;
- `crc_check=True` appends b"crc_num" + crc32(all records) as 10 big-endian bytes.
"""
from __future__ import annotations

import binascii
import math
import os
from typing import Iterator

import numpy as np

from migrate.checkpoints.dtypes import MS_TYPE_TO_NUMPY
from migrate.errors import MigrateError

# MindSpore's piece size (SLICE_SIZE, in KiB, times 1024). Tests patch it down.
PIECE_BYTES = 512 * 1024 * 1024
CRC_MARK = b"crc_num"
CRC_TRAILER = len(CRC_MARK) + 10

NUMPY_TO_MS_TYPE = {v: k for k, v in MS_TYPE_TO_NUMPY.items()}


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """Header of a length-delimited field (wire type 2) followed by `payload`."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


class CkptWriter:
    """Append tensors to a `.ckpt`, byte for byte what `save_checkpoint` writes."""

    def __init__(self, path, crc: bool = False):
        self.path = os.fspath(path)
        self._file = open(self.path, "wb")
        self._crc = 0 if crc else None
        self._names: set[str] = set()

    def write(self, name: str, array: np.ndarray) -> None:
        if self._file is None:
            raise MigrateError(f"{self.path}: write after close")
        if name in self._names:
            # Consecutive records with one tag are pieces of one tensor to MindSpore.
            raise MigrateError(f"{self.path}: tensor {name} written twice")
        array = np.asarray(array)
        ms_type = NUMPY_TO_MS_TYPE.get(array.dtype)
        if ms_type is None:
            raise MigrateError(f"tensor {name}: dtype {array.dtype} cannot be stored in a .ckpt")
        if not array.flags.c_contiguous:
            array = np.array(array, order="C")
        self._names.add(name)
        data = array.reshape(-1).view(np.uint8)  # raw bytes, bf16 included; no copy
        dims = b"".join(b"\x08" + _varint(d) for d in array.shape)
        type_field = _field(2, ms_type.encode())
        tag_field = _field(1, name.encode())
        # Unlike MindSpore, keep empty tensors: one record with empty content.
        for start in range(0, data.nbytes, PIECE_BYTES) if data.nbytes else [0]:
            piece = data[start:start + PIECE_BYTES]
            tensor_head = dims + type_field + b"\x1a" + _varint(piece.nbytes)
            value_head = tag_field + b"\x12" + _varint(len(tensor_head) + piece.nbytes)
            head = b"\x0a" + _varint(len(value_head) + len(tensor_head) + piece.nbytes)
            self._emit(head + value_head + tensor_head)
            self._emit(piece)

    def _emit(self, chunk) -> None:
        self._file.write(chunk)
        if self._crc is not None:
            self._crc = binascii.crc32(chunk, self._crc)

    def close(self) -> None:
        if self._file is None:
            return
        if self._crc is not None:
            self._file.write(CRC_MARK + self._crc.to_bytes(10, "big"))
        self._file.close()
        self._file = None

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        elif self._file is not None:
            # A half-written checkpoint can parse as a valid shorter one: remove it.
            self._file.close()
            self._file = None
            os.remove(self.path)


class _Records:
    """Sequential reader of `value` records; CRCs whatever it reads."""

    def __init__(self, path, check_crc: bool):
        self.path = os.fspath(path)
        try:
            self.file = open(self.path, "rb")
        except OSError as exc:
            raise MigrateError(f"cannot read MindSpore checkpoint {self.path}: {exc.strerror}") from None
        self.end = os.fstat(self.file.fileno()).st_size
        self.expected_crc = None
        if self.end >= CRC_TRAILER:
            # Same test as MindSpore's loader: the mark sits 17 bytes from the end.
            self.file.seek(self.end - CRC_TRAILER)
            trailer = self.file.read(CRC_TRAILER)
            if trailer.startswith(CRC_MARK):
                self.end -= CRC_TRAILER
                self.expected_crc = int.from_bytes(trailer[len(CRC_MARK):], "big")
            self.file.seek(0)
        self.pos = 0
        self.crc = 0 if check_crc and self.expected_crc is not None else None

    def fail(self, what: str) -> MigrateError:
        return MigrateError(f"corrupt or truncated MindSpore checkpoint {self.path}: {what} at byte {self.pos}")

    def read(self, n: int) -> bytes:
        if self.pos + n > self.end:
            raise self.fail("record runs past end of file")
        data = self.file.read(n)
        self.pos += n
        if self.crc is not None:
            self.crc = binascii.crc32(data, self.crc)
        return data

    def readinto(self, view: memoryview) -> None:
        if self.pos + len(view) > self.end:
            raise self.fail("record runs past end of file")
        got = 0
        while got < len(view):
            n = self.file.readinto(view[got:])
            if not n:
                raise self.fail("file shrank while reading")
            got += n
        self.pos += got
        if self.crc is not None:
            self.crc = binascii.crc32(view, self.crc)

    def skip(self, n: int) -> None:
        if self.pos + n > self.end:
            raise self.fail("record runs past end of file")
        self.file.seek(n, os.SEEK_CUR)
        self.pos += n

    def varint(self) -> int:
        value = shift = 0
        while True:
            byte = self.read(1)[0]
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                return value
            shift += 7
            if shift > 63:
                raise self.fail("bad varint")

    def expect(self, key: int, what: str) -> int:
        """Read a length-delimited field header with the given key; return its length."""
        if self.varint() != key:
            raise self.fail(f"expected {what}")
        return self.varint()

    def header(self):
        """(tag, tensor_type, dims, content_length) of the next record, positioned
        at its content; None at the end. Fields must come in field-number order,
        as every protobuf serialiser writes them, with the content last."""
        if self.pos == self.end:
            return None
        value_end = self.expect(0x0A, "a value record")
        value_end += self.pos
        tag = self.read(self.expect(0x0A, "a tag")).decode("utf-8", "replace")
        key = self.varint()
        if key == 0x1A:
            raise MigrateError(f"{self.path}: tensor {tag} is a map tensor, which is not supported")
        if key != 0x12:
            raise self.fail(f"expected a tensor in record {tag}")
        tensor_end = self.varint() + self.pos
        dims, key = [], self.varint()
        while key in (0x08, 0x0A):
            if key == 0x08:
                dims.append(self.varint())
            else:  # packed dims
                stop = self.varint() + self.pos
                while self.pos < stop:
                    dims.append(self.varint())
            key = self.varint()
        if key != 0x12:
            raise self.fail(f"expected tensor_type in record {tag}")
        ms_type = self.read(self.varint()).decode("ascii", "replace")
        length = self.expect(0x1A, f"tensor_content in record {tag}")
        if not self.pos + length == tensor_end == value_end:
            raise self.fail(f"bad lengths in record {tag}")
        return tag, ms_type, dims, length

    def close(self) -> None:
        self.file.close()


def _shape(dims: list[int], first_piece: int) -> tuple[int, ...]:
    # MindSpore's loader reads dims [0] as a scalar (older writers stored scalars so).
    return () if dims == [0] and first_piece else tuple(dims)


def iter_ckpt(path) -> Iterator[tuple[str, np.ndarray]]:
    """Yield (name, array) in file order, pieces joined, one tensor in memory.

    A tensor is yielded as soon as its last byte is read (its size is known from
    its dims). A CRC mismatch can only be known at the end: it raises after the
    last tensor.
    """
    records = _Records(path, check_crc=True)
    try:
        seen = set()
        name = array = None  # the tensor being filled, piece by piece
        while (head := records.header()) is not None:
            tag, ms_type, dims, length = head
            if array is None:
                if tag in seen:
                    raise records.fail(f"tensor {tag} appears twice")
                seen.add(tag)
                if ms_type == "str":  # a string from save_checkpoint's append_dict
                    text = np.frombuffer(records.read(length), f"U{length // 4}")
                    yield tag, np.array(text[0] if text.size else "")
                    continue
                dtype = MS_TYPE_TO_NUMPY.get(ms_type)
                if dtype is None:
                    raise MigrateError(f"{records.path}: tensor {tag} has unsupported type {ms_type}")
                shape = _shape(dims, length)
                if math.prod(shape) * dtype.itemsize > records.end - records.pos:
                    raise records.fail(f"tensor {tag} is larger than the rest of the file")
                name, array, filled = tag, np.empty(shape, dtype), 0
                flat = array.reshape(-1).view(np.uint8)
            elif tag != name or array.dtype != MS_TYPE_TO_NUMPY.get(ms_type):
                raise records.fail(f"tensor {name} ends after {filled} of {flat.nbytes} bytes")
            if filled + length > flat.nbytes:
                raise records.fail(f"tensor {tag} has more data than its shape")
            records.readinto(memoryview(flat[filled:filled + length]))
            filled += length
            if filled == flat.nbytes:
                yield name, array
                name = array = None
        if array is not None:
            raise records.fail(f"tensor {name} ends after {filled} of {flat.nbytes} bytes")
        if records.crc is not None and records.crc != records.expected_crc:
            raise MigrateError(f"CRC mismatch in MindSpore checkpoint {records.path}: the file is damaged")
    finally:
        records.close()


def read_ckpt_specs(path) -> list[tuple[str, str, tuple[int, ...]]]:
    """(name, MindSpore tensor_type, shape) per tensor, reading record headers only.

    Data is skipped, so the CRC is not checked; sizes are.
    """
    records = _Records(path, check_crc=False)
    specs, sizes, seen = [], [], set()
    try:
        while (head := records.header()) is not None:
            tag, ms_type, dims, length = head
            records.skip(length)
            if specs and specs[-1][0] == tag and sizes[-1][0] < sizes[-1][1]:
                sizes[-1][0] += length
                continue
            if tag in seen:
                raise records.fail(f"tensor {tag} appears twice")
            seen.add(tag)
            shape = _shape(dims, length)
            dtype = MS_TYPE_TO_NUMPY.get(ms_type)
            expected = math.prod(shape) * dtype.itemsize if dtype is not None else length
            specs.append((tag, ms_type, shape))
            sizes.append([length, expected])
        for (name, _, _), (got, expected) in zip(specs, sizes):
            if got != expected:
                raise records.fail(f"tensor {name} has {got} of {expected} bytes")
    finally:
        records.close()
    return specs
