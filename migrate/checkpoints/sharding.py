"""Checkpoints split across several files, with an index.

MindSpore's `.ckpt` loader reads a whole file into memory and parses it as one
protobuf message: slow and memory-hungry above a couple of GiB, and refused
outright by protobuf runtimes that keep the 2 GiB message limit. So a large
conversion is cut into shards, each a complete checkpoint that
`mindspore.load_checkpoint` reads on its own, plus an index that mirrors
Hugging Face's `model.safetensors.index.json`:

    model.ckpt.index.json
    {"metadata": {"total_size": <tensor bytes>, "format": "ckpt", "producer": "migrate x.y"},
     "weight_map": {"model.tok_embeddings.embedding_weight": "model-00001-of-00003.ckpt", ...}}
    model-00001-of-00003.ckpt, model-00002-of-00003.ckpt, model-00003-of-00003.ckpt

Sharded safetensors use HF's own names (`model.safetensors.index.json`,
`model-0000k-of-0000n.safetensors`). A checkpoint that fits in one shard is
written as a single `model.ckpt` / `model.safetensors` with no index.
"""
from __future__ import annotations

import json
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from migrate.byte_sizes import parse_size  # noqa: F401 -- the shard-size parser, imported from here too
from migrate.checkpoints.input_folder import InputFolder
from migrate.errors import MigrateError
from migrate.jsonsafe import load_json

FORMAT_SUFFIX = {"ckpt": ".ckpt", "safetensors": ".safetensors"}
DEFAULT_MAX_SHARD = {"ckpt": "1.9GB", "safetensors": None}  # None: one file, however large
PROTOBUF_LIMIT = 2**31 - 1


def single_name(fmt: str) -> str:
    return f"model{FORMAT_SUFFIX[fmt]}"


def index_name(fmt: str) -> str:
    return f"model{FORMAT_SUFFIX[fmt]}.index.json"


def shard_name(fmt: str, k: int, n: int) -> str:
    return f"model-{k:05d}-of-{n:05d}{FORMAT_SUFFIX[fmt]}"


def plan_shards(sizes: list[tuple[str, int]], max_bytes: int | None, fixed: int = 0) -> list[list[str]]:
    """Cut (name, bytes) items, in order, into shards of at most `max_bytes` each
    (`fixed` bytes per file on top, e.g. a trailer). A single item larger than
    `max_bytes` gets a shard of its own, as HF does."""
    if max_bytes is None:
        return [[name for name, _ in sizes]]
    shards: list[list[str]] = [[]]
    used = fixed
    for name, size in sizes:
        if shards[-1] and used + size > max_bytes:
            shards.append([])
            used = fixed
        shards[-1].append(name)
        used += size
    return shards


def plan_balanced_shards(sizes: list[tuple[str, int]], max_bytes: int | None, fixed: int = 0) -> list[list[str]]:
    """As many shards as `plan_shards` cuts, of about equal size instead of all full but the last:
    the shards of a conversion are written side by side (`ShardedWriter.write_each`), and a 2.1 GB
    model cut at 1.9 GB left one writer with 90 % of the bytes. Each shard is cut where the next
    item's middle would pass an equal share of the bytes; where that puts a shard over `max_bytes`
    (items of very unequal size), the greedy plan stands."""
    greedy = plan_shards(sizes, max_bytes, fixed)
    n = len(greedy)
    if n < 2:
        return greedy
    share = sum(size for _, size in sizes) / n
    shards: list[list[str]] = [[]]
    used = 0
    for name, size in sizes:
        if shards[-1] and len(shards) < n and used + size / 2 > share * len(shards):
            shards.append([])
        shards[-1].append(name)
        used += size
    bytes_of = dict(sizes)
    if len(shards) != n or any(fixed + sum(bytes_of[name] for name in shard) > max_bytes for shard in shards):
        return greedy
    return shards


@dataclass
class ShardedWriter:
    """Writes tensors, in plan order, into the files of a shard plan; then the index.

    `open_writer(path, names)` builds the writer of one file (a `CkptWriter` or
    `SafetensorsWriter`); writers must offer `open_tensor`, `close` and the
    context-manager protocol that deletes a half-written file.
    """

    folder: Path
    fmt: str
    shards: list[list[str]]
    open_writer: object
    metadata: dict

    def __post_init__(self):
        n = len(self.shards)
        self.files = [single_name(self.fmt)] if n == 1 else [shard_name(self.fmt, k + 1, n) for k in range(n)]
        self._shard_of = {name: k for k, names in enumerate(self.shards) for name in names}
        self._current = -1
        self._writer = None
        self.total_size = 0          # tensor bytes, as HF's index counts them
        self.bytes_written = 0       # file bytes

    def open_tensor(self, name: str, dtype, shape):
        k = self._shard_of[name]
        if k != self._current:
            if k < self._current:
                raise MigrateError(f"tensor {name} arrives after its shard was closed")
            self._close_current()
            self._current = k
            self._writer = self.open_writer(self.folder / self.files[k], self.shards[k])
            self._writer.__enter__()
        self.total_size += int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        return self._writer.open_tensor(name, dtype, shape)

    def _close_current(self) -> None:
        if self._writer is not None:
            writer, self._writer = self._writer, None
            writer.__exit__(None, None, None)
            self.bytes_written += writer.bytes_written

    def write_each(self, write_shard: Callable[[int, object], None], workers: int) -> None:
        """Every shard written by `write_shard(k, sink)` (the sink: that file's writer, whose
        `open_tensor` it calls for each of shard k's tensors), up to `workers` shards at once, in
        threads, in place of `open_tensor` calls on this writer; `close` then writes the index.
        Measured here, two threads copying into one file are no faster than one (the filesystem
        takes one write to a file at a time) and into two files twice as fast. A shard's error is
        raised once every shard begun has ended; a failed shard's writer removes its file."""
        lock = threading.Lock()

        def one(k: int) -> None:
            with self.open_writer(self.folder / self.files[k], self.shards[k]) as writer:
                write_shard(k, _Counted(writer, self, lock))
            with lock:
                self.bytes_written += writer.bytes_written

        pool = ThreadPoolExecutor(max(1, workers), thread_name_prefix="migrate-shard")
        futures = [pool.submit(one, k) for k in range(len(self.shards))]
        try:
            for future in futures:
                future.result()
        finally:
            pool.shutdown(wait=True, cancel_futures=True)   # after an error: the shards not begun never are
        self._current = len(self.shards) - 1

    def close(self) -> None:
        self._close_current()
        if self._current != len(self.shards) - 1:
            raise MigrateError(f"only {self._current + 1} of {len(self.shards)} shards were written")
        if len(self.files) > 1:
            index = {
                "metadata": {"total_size": self.total_size, "format": self.fmt, **self.metadata},
                "weight_map": {name: self.files[k] for name, k in self._shard_of.items()},
            }
            text = json.dumps(index, indent=2) + "\n"
            (self.folder / index_name(self.fmt)).write_text(text)
            self.bytes_written += len(text.encode())

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        elif self._writer is not None:
            writer, self._writer = self._writer, None
            writer.__exit__(exc_type, exc, tb)  # removes the half-written file


class _Counted:
    """A shard's file writer that adds each tensor's bytes to the index's total as it opens."""

    def __init__(self, writer, owner: ShardedWriter, lock: threading.Lock):
        self.writer, self.owner, self.lock = writer, owner, lock

    def open_tensor(self, name: str, dtype, shape):
        with self.lock:
            self.owner.total_size += int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        return self.writer.open_tensor(name, dtype, shape)


def read_index(index_path: str | Path) -> tuple[str, dict[str, Path]]:
    """(format, {tensor name: shard path}) from an index, shards checked to exist
    inside the index's folder (an index is input: it must not point elsewhere)."""
    index_path = Path(index_path)
    fmt = next((f for f in FORMAT_SUFFIX if index_path.name.endswith(f"{FORMAT_SUFFIX[f]}.index.json")), None)
    try:
        index = load_json(index_path)
        weight_map = index["weight_map"]
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise TypeError("weight_map is not a mapping of tensor names to file names")
        declared = (index.get("metadata") or {}).get("format")
        fmt = declared if declared in FORMAT_SUFFIX else fmt  # HF's own indexes carry no (or another) format
    except OSError as exc:
        raise MigrateError(f"cannot read index {index_path}: {exc.strerror}") from None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise MigrateError(f"corrupt index {index_path}: {exc}") from None
    if fmt not in FORMAT_SUFFIX:
        raise MigrateError(f"index {index_path} names no known checkpoint format")
    folder = InputFolder(index_path.parent, "checkpoint folder")
    out = {}
    for name, shard in weight_map.items():
        path = folder.member(shard, f"index {index_path.name}", must_exist=False).resolve()  # the reader rule
        if path.parent != folder.real:  # and stricter: shards lie beside their index
            raise MigrateError(f"index {index_path.name} names a file outside its folder: {shard}")
        if path.suffix != FORMAT_SUFFIX[fmt]:
            raise MigrateError(f"index {index_path.name} names {shard}, not a {FORMAT_SUFFIX[fmt]} file")
        if not path.is_file():
            raise MigrateError(f"missing shard {shard} (named by {index_path.name})")
        out[name] = path
    if not out:
        raise MigrateError(f"index {index_path} names no tensors")
    return fmt, out
