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
from collections.abc import Callable, Iterator

import numpy as np

from migrate.checkpoints.dtypes import MS_TYPE_TO_NUMPY, DtypeTable
from migrate.checkpoints.stream import copy_file_range
from migrate.errors import MigrateError

# MindSpore's piece size (SLICE_SIZE, in KiB, times 1024). Tests patch it down.
PIECE_BYTES = 512 * 1024 * 1024
CRC_MARK = b"crc_num"
CRC_TRAILER = len(CRC_MARK) + 10

NUMPY_TO_MS_TYPE = DtypeTable({v: k for k, v in MS_TYPE_TO_NUMPY.items()})


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


def _piece_sizes(nbytes: int) -> list[int]:
    # Unlike MindSpore, keep empty tensors: one record with empty content.
    if nbytes == 0:
        return [0]
    return [min(PIECE_BYTES, nbytes - start) for start in range(0, nbytes, PIECE_BYTES)]


def _record_heads(name: str, ms_type: str, shape) -> Callable[[int], bytes]:
    dims = b"".join(b"\x08" + _varint(int(d)) for d in shape)
    type_field = _field(2, ms_type.encode())
    tag_field = _field(1, name.encode())

    def head(piece: int) -> bytes:
        tensor_head = dims + type_field + b"\x1a" + _varint(piece)
        value_head = tag_field + b"\x12" + _varint(len(tensor_head) + piece)
        return b"\x0a" + _varint(len(value_head) + len(tensor_head) + piece) + value_head + tensor_head

    return head


def _ms_type(name: str, dtype) -> str:
    ms_type = NUMPY_TO_MS_TYPE.get(np.dtype(dtype))
    if ms_type is None:
        raise MigrateError(f"tensor {name}: dtype {np.dtype(dtype)} cannot be stored in a .ckpt")
    return ms_type


def record_bytes(name: str, dtype, shape) -> int:
    """Exact number of bytes `CkptWriter` writes for this tensor (all its pieces)."""
    head = _record_heads(name, _ms_type(name, dtype), shape)
    nbytes = math.prod(int(d) for d in shape) * np.dtype(dtype).itemsize
    return sum(len(head(piece)) + piece for piece in _piece_sizes(nbytes))


class CkptWriter:
    """Append tensors to a `.ckpt`, byte for byte what `save_checkpoint` writes.

    `write(name, array)` takes a whole array; `open_tensor(name, dtype, shape)`
    takes the same tensor as a stream of byte chunks of any size, so a tensor
    never has to be in memory at once. With `crc=True` the CRC32 of every record
    byte is updated as the bytes go out, and appended as MindSpore's trailer.
    """

    def __init__(self, path, crc: bool = False):
        self.path = os.fspath(path)
        self._file = open(self.path, "wb")
        self._crc = 0 if crc else None
        self._names: set[str] = set()
        self._open: _TensorStream | None = None
        self.bytes_written = 0

    def open_tensor(self, name: str, dtype, shape) -> _TensorStream:
        if self._file is None:
            raise MigrateError(f"{self.path}: write after close")
        if self._open is not None:
            raise MigrateError(f"{self.path}: tensor {self._open.name} is still being written")
        if name in self._names:
            # Consecutive records with one tag are pieces of one tensor to MindSpore.
            raise MigrateError(f"{self.path}: tensor {name} written twice")
        head = _record_heads(name, _ms_type(name, dtype), shape)
        self._names.add(name)
        nbytes = math.prod(int(d) for d in shape) * np.dtype(dtype).itemsize
        self._open = _TensorStream(self, name, head, nbytes)
        return self._open

    def write(self, name: str, array: np.ndarray) -> None:
        array = np.asarray(array)
        stream = self.open_tensor(name, array.dtype, array.shape)
        if not array.flags.c_contiguous:
            array = np.array(array, order="C")
        stream.write(array.reshape(-1).view(np.uint8))  # raw bytes, bf16 included; no copy
        stream.close()

    def _emit(self, chunk) -> None:
        self._file.write(chunk)
        self.bytes_written += len(chunk) if isinstance(chunk, bytes) else memoryview(chunk).nbytes
        if self._crc is not None:
            self._crc = binascii.crc32(chunk, self._crc)  # releases the GIL on large chunks

    def close(self) -> None:
        if self._file is None:
            return
        if self._open is not None:
            name = self._open.name
            self._abort()
            raise MigrateError(f"{self.path}: tensor {name} was left incomplete")
        if self._crc is not None:
            self._file.write(CRC_MARK + self._crc.to_bytes(10, "big"))
            self.bytes_written += CRC_TRAILER
        self._file.close()
        self._file = None

    def _abort(self) -> None:
        # A half-written checkpoint can parse as a valid shorter one: remove it.
        self._file.close()
        self._file = None
        self._open = None
        os.remove(self.path)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        elif self._file is not None:
            self._abort()


class _TensorStream:
    """The records of one tensor, fed with byte chunks cut anywhere."""

    def __init__(self, writer: CkptWriter, name: str, head, nbytes: int):
        self.writer, self.name, self._head = writer, name, head
        self.nbytes, self.written = nbytes, 0
        self._left_in_piece = 0
        if nbytes == 0:
            writer._emit(head(0))

    def write(self, chunk) -> None:
        view = memoryview(chunk).cast("B")
        if self.written + len(view) > self.nbytes:
            raise MigrateError(f"{self.writer.path}: tensor {self.name} got more than its {self.nbytes} bytes")
        while len(view):
            if self._left_in_piece == 0:
                self._left_in_piece = min(PIECE_BYTES, self.nbytes - self.written)
                self.writer._emit(self._head(self._left_in_piece))
            n = min(self._left_in_piece, len(view))
            self.writer._emit(view[:n])
            view = view[n:]
            self._left_in_piece -= n
            self.written += n

    def copy_from(self, fd: int, offset: int) -> bool:
        """All the tensor's bytes from file `fd` at `offset`, copied by the kernel;
        False (nothing written) where that cannot be: with a CRC to compute, or
        when the kernel refuses; the caller then writes the bytes itself."""

        if self.writer._crc is not None or self.written:
            return False
        for start in range(0, self.nbytes, PIECE_BYTES):
            piece = min(PIECE_BYTES, self.nbytes - start)
            head = self._head(piece)
            self.writer._file.write(head)
            if not copy_file_range(fd, offset + start, self.writer._file, piece):
                if start:  # a header already out with its bytes: the file cannot be taken back to a record edge
                    raise MigrateError(f"{self.writer.path}: the kernel refused to copy piece {start // PIECE_BYTES}"
                                       f" of tensor {self.name} after copying the ones before it")
                # The first piece: its header goes back, and the caller writes the bytes itself.
                self.writer._file.seek(-len(head), os.SEEK_CUR)
                self.writer._file.truncate()
                return False
            self.writer.bytes_written += len(head) + piece
            self.written += piece
        return True

    def close(self) -> None:
        if self.written != self.nbytes:
            raise MigrateError(f"{self.writer.path}: tensor {self.name} got {self.written} "
                               f"of its {self.nbytes} bytes")
        self.writer._open = None

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()


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


def read_ckpt_ranges(path) -> dict[str, list[tuple[int, int]]] | None:
    """Per tensor, the (offset, length) of each of its data pieces in the file, reading record
    headers only; None where the bytes cannot be taken as they lie: the file carries a CRC (only a
    read of every record checks it) or a record that is no numeric tensor (append_dict's strings)."""
    records = _Records(path, check_crc=False)
    ranges: dict[str, list[tuple[int, int]]] = {}
    try:
        if records.expected_crc is not None:
            return None
        while (head := records.header()) is not None:
            tag, ms_type, _, length = head
            if MS_TYPE_TO_NUMPY.get(ms_type) is None:
                return None
            ranges.setdefault(tag, []).append((records.pos, length))
            records.skip(length)
    finally:
        records.close()
    return ranges


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
        for (name, _, _), (got, expected) in zip(specs, sizes, strict=True):
            if got != expected:
                raise records.fail(f"tensor {name} has {got} of {expected} bytes")
    finally:
        records.close()
    return specs
