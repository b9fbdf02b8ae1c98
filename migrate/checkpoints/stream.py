"""Move tensors from a reader to a writer in bounded chunks, reading and writing at once.

A reader thread copies each source tensor, chunk by chunk, into a small pool of
reusable buffers (casting a chunk, when the dtype changes, into the same
buffer's tail) and hands the chunks over a bounded queue to the calling thread,
which writes them. File reads, file writes, CRC32 and numpy/torch casts all
release the GIL, so on two cores reading and writing overlap. Memory in flight
is the `depth` buffers of the pool, allocated once: a function of the chunk
size, not of tensor or model size; nothing is allocated per chunk.
Chunks are small (512 KiB) so that a chunk is still in the CPU cache when it is
written: measured here, 8 MiB chunks cost twice the CPU time of 512 KiB ones.
A chunk that is cast holds the source and the cast result side by side.

A tensor whose bytes go out unchanged and whose source is a plain byte range
of a file (`Job.source`) is not read at all: the kernel copies it from file to
file (`copy_file_range`, what `cp` does), when the writer allows (no CRC).
"""
from __future__ import annotations

import errno
import math
import os
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

CHUNK_BYTES = 512 * 1024  # small enough to stay in cache between the read and the write
CAST_CHUNK_BYTES = 1024 * 1024  # source and cast result share one buffer
DEPTH = 4


@dataclass(frozen=True)
class Job:
    """One output tensor: where its bytes come from and what it becomes."""

    name: str                                       # output name
    shape: tuple[int, ...]
    src_dtype: np.dtype
    dtype: np.dtype                                 # output dtype
    read_into: Callable[[int, np.ndarray], None]    # (byte offset in the source tensor, uint8 buffer)
    cast: Callable[[np.ndarray, np.ndarray], None] | None = None  # (typed chunk, typed output) -> None
    source: tuple[int, int] | None = None           # (fd, offset) of the raw bytes, for a kernel copy

    @property
    def size(self) -> int:
        return math.prod(self.shape)


class _Stopped(Exception):
    pass


class _Pool:
    """At most `depth` buffers of `size` bytes, allocated on first need, then reused."""

    def __init__(self, size: int, depth: int, stop: threading.Event):
        self.size, self.depth, self.stop = size, depth, stop
        self.free: queue.SimpleQueue = queue.SimpleQueue()
        self.made = 0

    def get(self) -> np.ndarray:
        try:
            return self.free.get_nowait()
        except queue.Empty:
            pass
        if self.made < self.depth:
            self.made += 1
            return np.empty(self.size, np.uint8)
        while True:
            try:
                return self.free.get(timeout=0.1)
            except queue.Empty:
                if self.stop.is_set():
                    raise _Stopped from None

    def put(self, buffer: np.ndarray) -> None:
        self.free.put(buffer)


def run(jobs: list[Job], sink, on_done: Callable[[Job], None] | None = None,
        chunk_bytes: int | None = None, depth: int | None = None, cast_chunk_bytes: int | None = None) -> None:
    """Write every job through `sink.open_tensor(name, dtype, shape)` (a stream with
    `write(bytes)` and `close()`), in order. Exceptions from either side propagate
    here, after the reader thread has stopped. Sizes default to the module's constants."""
    chunk_bytes = chunk_bytes or CHUNK_BYTES
    depth = depth or DEPTH
    cast_chunk_bytes = cast_chunk_bytes or CAST_CHUNK_BYTES

    def chunk_of(job: Job) -> int:
        return cast_chunk_bytes if job.cast is not None else chunk_bytes

    def item_of(job: Job) -> int:  # buffer bytes per element: the source, and the cast result after it
        return job.src_dtype.itemsize + (job.dtype.itemsize if job.cast is not None else 0)

    largest = max((min(chunk_of(job), job.size * item_of(job)) + 8 for job in jobs), default=0)
    stop = threading.Event()
    pool = _Pool(max(16, largest), depth, stop)
    handoff: queue.Queue = queue.Queue(maxsize=2 * depth + 2)  # chunks (bounded by the pool) and marks

    def put(item) -> None:
        while True:
            try:
                handoff.put(item, timeout=0.1)
                return
            except queue.Full:
                if stop.is_set():
                    raise _Stopped from None

    def read() -> None:
        try:
            for job in jobs:
                put(("begin", job, None))
                if job.source is not None and job.cast is None:
                    put(("copy", job, None))  # the writing side copies file to file
                    put(("end", job, None))
                    continue
                room = min(pool.size, chunk_of(job)) - (8 if job.cast is not None else 0)  # 8: alignment
                step = max(1, room // item_of(job))
                src_item, out_item = job.src_dtype.itemsize, job.dtype.itemsize
                for first in range(0, job.size, step):
                    count = min(step, job.size - first)
                    buffer = pool.get()
                    chunk = buffer[:count * src_item]
                    job.read_into(first * src_item, chunk)
                    if job.cast is not None:
                        # The result goes after the source in the same buffer, aligned for its dtype.
                        at = -(-count * src_item // 8) * 8
                        out = buffer[at:at + count * out_item]
                        job.cast(chunk.view(job.src_dtype), out.view(job.dtype))
                        chunk = out
                    put(("data", chunk, buffer))
                put(("end", job, None))
            put(("stop", None, None))
        except _Stopped:
            pass
        except BaseException as exc:  # handed to the writing side, which raises it
            try:
                put(("error", exc, None))
            except _Stopped:
                pass

    reader = threading.Thread(target=read, name="migrate-reader", daemon=True)
    reader.start()
    stream = None
    try:
        while True:
            kind, payload, buffer = handoff.get()
            if kind == "data":
                stream.write(payload)
                if buffer is not None:
                    pool.put(buffer)
            elif kind == "begin":
                stream = sink.open_tensor(payload.name, payload.dtype, payload.shape)
            elif kind == "copy":
                fd, offset = payload.source
                if not stream.copy_from(fd, offset):
                    _copy_through(payload, stream, chunk_bytes)
            elif kind == "end":
                stream.close()
                stream = None
                if on_done is not None:
                    on_done(payload)
            elif kind == "error":
                raise payload
            else:
                break
    finally:
        stop.set()
        while reader.is_alive():  # unblock a reader waiting on a full queue
            try:
                handoff.get(timeout=0.05)
            except queue.Empty:
                pass
        reader.join()


def _copy_through(job: Job, stream, chunk_bytes: int) -> None:
    """A job meant for a kernel copy, read and written through a buffer instead (on
    the writing side, with a buffer of its own: the pool's may all be in the queue)."""
    nbytes = job.size * job.dtype.itemsize
    buffer = np.empty(max(1, min(chunk_bytes, nbytes)), np.uint8)
    for start in range(0, nbytes, buffer.size):
        chunk = buffer[:min(buffer.size, nbytes - start)]
        job.read_into(start, chunk)
        stream.write(chunk)


_KERNEL_COPY = [hasattr(os, "copy_file_range")]
# Measured here (ext4, page cache): with offsets that agree modulo the page size the kernel
# copies 1 GiB in about 0.3 s, and in about 0.45 s when they do not (its slow path shifts every
# byte). pread + pwrite through one 1 MiB buffer took 0.3 s when it wrote into pages a deleted
# file had just freed, but this machine hands freed memory back to its host within a second, and
# into memory that must be backed again the buffered copy was the slow one: a 2 GiB export,
# each run starting 3 s after the last output's deletion, 2.4-3.9 s buffered against 1.0-1.7 s
# through the kernel (8 runs each, alternating). In a .ckpt the protobuf headers put tensors at
# offsets unrelated to the other file's, so the kernel copies at any offsets.


def copy_file_range(src_fd: int, src_offset: int, dst_file, nbytes: int) -> bool:
    """Copy `nbytes` from `src_fd` at `src_offset` to the current position of the
    (buffered) file `dst_file`, in the kernel. False, having copied nothing, where the
    kernel cannot copy at all (then the caller copies through memory)."""
    if not _KERNEL_COPY[0]:
        return False
    dst_file.flush()
    position = dst_file.tell()
    done = 0
    while done < nbytes:
        try:
            n = os.copy_file_range(src_fd, dst_file.fileno(), nbytes - done, src_offset + done, position + done)
        except OSError as exc:
            if done == 0 and exc.errno == errno.ENOSYS:  # no such call in this kernel: not asked again
                _KERNEL_COPY[0] = False
            if done == 0 and exc.errno in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP,
                                           errno.EBADF, errno.EPERM):
                # These two files cannot (another filesystem, say); others of the same process may.
                return False
            raise
        if n == 0:
            raise OSError(errno.EIO, "source file ended during copy")
        done += n
    dst_file.seek(position + nbytes)
    return True
