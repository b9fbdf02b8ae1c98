"""`migrate convert`: HF checkpoint folder -> MindSpore checkpoint folder.

Driven entirely by a keymap. Coverage is checked against the bundled model's
own parameter shapes (read from a model built without parameter data) before
any data moves; then every tensor streams from the source files to the output
files in bounded chunks, reading and writing overlapped (`checkpoints.stream`),
so peak memory does not grow with tensor, shard or model size. Keymap rows
that fuse or split tensors through a layout (`migrate.transforms`: MindFormers'
w_qkv, GPT-2's c_attn) are the exception: each such group is materialized alone,
when its first output is written, and dropped after its last. Output above
the shard size is split into shards with an index (`checkpoints.sharding`).
The output folder appears under its final name only when complete.
"""
from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from migrate import __version__
from migrate.checkpoints import stream
from migrate.checkpoints.atomic import atomic_output_dir
from migrate.checkpoints.dtypes import CLI_DTYPES, COMPUTE_DTYPE, SAFETENSORS_TO_NUMPY, cast_into, is_float, short_name
from migrate.checkpoints.hf_reader import open_hf_checkpoint
from migrate.checkpoints.ms_ckpt import CRC_TRAILER, CkptWriter, record_bytes
from migrate.checkpoints.ms_safetensors import SafetensorsWriter
from migrate.checkpoints.output_guard import check_output
from migrate.checkpoints.sharding import (
    DEFAULT_MAX_SHARD,
    PROTOBUF_LIMIT,
    ShardedWriter,
    index_name,
    parse_size,
    plan_balanced_shards,
)
from migrate.errors import CoverageError, MigrateError
from migrate.hf_config import load_hf_config, read_raw_config
from migrate.keymap import resolve
from migrate.keymap_check import coverage
from migrate.models.config import ConfigIO
from migrate.models.conversion_plan import ConversionPlan
from migrate.resources import human_bytes
from migrate.sidecar import copy_sidecars, sidecars

FORMATS = {"ckpt": "model.ckpt", "safetensors": "model.safetensors"}  # single-file names


@dataclass
class ConversionResult:
    out_dir: Path
    checkpoint: Path                 # the checkpoint file, or the index of a sharded one
    config: ConfigIO                 # the target model's config (LlamaConfig, GPT2Config, ...)
    tensors: int = 0
    parameters: int = 0
    bytes_written: int = 0           # tensor bytes
    seconds: float = 0.0
    records: list[dict] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)  # every checkpoint data file


def convert(
    src_dir: str | Path,
    out_dir: str | Path,
    keymap: str = "hf_llama",
    fmt: str = "ckpt",
    dtype: str = "keep",
    overwrite: bool = False,
    on_tensor: Callable[[str, int, int], None] | None = None,
    max_shard_size: int | str | None = None,
    crc: bool = False,
    hash_sources: bool = False,
    target: str | None = None,
    trust: bool = False,
) -> ConversionResult:
    """Convert; `max_shard_size` (bytes or "1.9GB"-style) defaults to 1.9GB for .ckpt
    and to one file for safetensors; `crc` appends MindSpore's CRC32 trailer to each
    .ckpt file (checked by `mindspore.load_checkpoint(crc_check=True)` and by our reader).
    `hash_sources=True` records the sha256 of every source file in conversion.json
    (otherwise their names and sizes): hashing runs beside the copy, but at about
    0.9 CPU-seconds per GB it costs more than the copy itself, so it is opt-in.
    `target` names an entry of the keymap's `targets` (another MindSpore layout of the
    same model, e.g. "qkv_concat" or "mcore"); None converts to the keymap's own layout. `trust`:
    import a model class migrate does not bundle (the keymap's `target`; `--trust-model-class`)."""
    started = time.perf_counter()
    src, out = Path(src_dir), Path(out_dir)
    if fmt not in FORMATS:
        raise MigrateError(f"unknown format {fmt!r}; choose from {', '.join(FORMATS)}")
    max_shard = DEFAULT_MAX_SHARD[fmt] if max_shard_size is None else max_shard_size
    max_bytes = parse_size(max_shard) if max_shard is not None else None
    if fmt == "ckpt" and max_bytes > PROTOBUF_LIMIT:
        raise MigrateError(
            f"--max-shard-size {max_shard} is over 2 GiB: mindspore.load_checkpoint parses a .ckpt file as one "
            "protobuf message, which protobuf caps at 2 GiB; choose a smaller size or --format safetensors"
        )
    if dtype != "keep" and dtype not in CLI_DTYPES:
        raise MigrateError(f"unknown dtype {dtype!r}; choose from keep, {', '.join(CLI_DTYPES)}")
    if not src.is_dir():
        raise MigrateError(f"model folder not found: {src}")
    # Fail before any heavy work; checked again, with every file read, when the output is created.
    keymap_file = keymap if str(keymap).endswith((".yaml", ".yml")) else None
    check_output(out, overwrite=overwrite, source=src, inputs=(keymap_file,))

    sidecars(src)  # a tokenizer file linking outside the folder is refused before any work
    raw_config = read_raw_config(src)
    km = resolve(keymap, raw_config)  # a family name, "auto", or a keymap file checked against the registry
    km.check_source(raw_config)
    km = km.for_source(raw_config).with_target(target)  # the architecture's variant, then the target layout
    ms_fields = km.hf_to_ms_config(load_hf_config(src, km))
    ckpt = open_hf_checkpoint(src).add_prefix_if_absent(km.base_prefix)  # a base-model-only file: full names
    try:
        return _convert(ckpt, src, out, km, ms_fields, fmt, dtype, overwrite, on_tensor, max_bytes, crc,
                        hash_sources, started, trust)
    finally:
        ckpt.close()


def _convert(ckpt, src, out, km, ms_fields, fmt, dtype, overwrite, on_tensor, max_bytes, crc, hash_sources,
             started, trust=False):
    plan = ConversionPlan.for_source(km, ms_fields, trust=trust)  # the target model's config, the rows, the names
    out_dtype = _choose_dtype(ckpt, dtype, plan.ignored)
    plan.set_compute_dtype(COMPUTE_DTYPE[out_dtype])
    config, fields = plan.config, plan.fields
    expected = plan.expected  # computed without importing MindSpore

    _check_coverage(ckpt, plan)
    written_name = plan.written_name()

    position = {name: i for i, name in enumerate(expected)}
    ordered = sorted(plan.groups, key=lambda g: min(position.get(d, len(position)) for d in g.dst))
    jobs = [job for group in ordered
            for job in _group_jobs(ckpt, group, out_dtype, not crc, fields, written_name)]
    shards = _plan(jobs, fmt, max_bytes, crc)

    result = ConversionResult(out, out / FORMATS[fmt], config)
    inputs = (km.path, *_source_files(src, ckpt))
    with atomic_output_dir(out, overwrite=overwrite, command="convert", source=src, inputs=inputs) as tmp:
        tied_records = _check_tied(ckpt, plan.tied)  # before the long part: fail fast
        hasher = _SourceHasher(_source_files(src, ckpt), enabled=hash_sources)  # beside the conversion
        record_of = {written_name(d): _record(g, d) for g in ordered for d in g.dst}
        writer = ShardedWriter(tmp, fmt, shards, _writer_factory(fmt, jobs, crc),
                               {"producer": f"migrate {__version__}"})

        done_lock = threading.Lock()   # shards written side by side report from their threads

        def done(job):
            with done_lock:
                result.tensors += 1
                result.parameters += job.size
                result.bytes_written += job.size * job.dtype.itemsize
                result.records.append({
                    **record_of[job.name], "target": job.name, "shape": list(job.shape),
                    "source_dtype": short_name(job.src_dtype), "dtype": short_name(job.dtype),
                })
                if on_tensor:
                    on_tensor(job.name, result.tensors, len(jobs))

        try:
            with writer:
                workers = _shard_writers(jobs, shards)
                if workers > 1:
                    shard_of = {name: k for k, shard in enumerate(shards) for name in shard}
                    by_shard = [[] for _ in shards]
                    for job in jobs:
                        by_shard[shard_of[job.name]].append(job)
                    writer.write_each(lambda k, sink: stream.run(by_shard[k], sink, on_done=done), workers)
                else:
                    stream.run(jobs, writer, on_done=done)
        except BaseException:
            hasher.cancel()
            raise
        order = {job.name: i for i, job in enumerate(jobs)}
        result.records.sort(key=lambda record: order[record["target"]])
        sources = hasher.result()
        result.files = [out / name for name in writer.files]
        if len(writer.files) > 1:
            result.checkpoint = out / index_name(fmt)
        config.save(tmp / "model.yaml")
        sidecars = copy_sidecars(src, tmp)
        manifest = {
            "tool": f"migrate {__version__}",
            "keymap": {"name": km.name, "version": km.version, "file": km.path.name,
                       "variant": km.variant, "target": km.target_name},
            "target": km.target,
            "format": fmt,
            "dtype": short_name(out_dtype),
            "files": writer.files,
            "sources": sources,
            "tensors": result.records,
            "tied": tied_records,
            "ignored": sorted(n for n in ckpt.specs if n in plan.ignored),
            "parameters": result.parameters,
            "copied": sidecars,
        }
        (tmp / "conversion.json").write_text(json.dumps(manifest, indent=2))
    result.seconds = time.perf_counter() - started
    return result


def _group_jobs(ckpt, group, out_dtype, kernel_copy: bool, fields: dict, written_name) -> list[stream.Job]:
    """The output tensors of one keymap row: a rename streams straight from the file;
    a fused row's outputs come from `_FusedGroup`, one group in memory at a time."""
    spec = ckpt.specs[group.src[0]]
    src_dtype = spec.numpy_dtype
    dtype = out_dtype  # every source is floating point (`_refuse_non_float`)
    cast = cast_into if dtype != src_dtype else None
    if group.layout is None:
        name = group.src[0]
        return [stream.Job(
            written_name(group.dst[0]), tuple(spec.shape), src_dtype, dtype,
            read_into=lambda start, buffer: ckpt.read_into(name, start, buffer),
            cast=cast,
            # Unchanged bytes lying in a file go file to file in the kernel; with a CRC to
            # compute they must pass through memory, and then reading and writing overlap.
            source=ckpt.source(name) if kernel_copy and cast is None else None,
        )]
    fused = _FusedGroup(ckpt, group, fields)
    shapes = group.transform().out_shapes([ckpt.specs[s].shape for s in group.src], fields)
    return [stream.Job(written_name(dst), tuple(shape), src_dtype, dtype,
                       read_into=lambda start, buffer, k=k: fused.read_into(k, start, buffer), cast=cast)
            for k, (dst, shape) in enumerate(zip(group.dst, shapes, strict=True))]


class _FusedGroup:
    """One fused keymap row (N sources -> M targets through a layout), materialized when
    its first output is read and dropped once every output has been read. The layouts
    only move bytes, so the sources are read as raw unsigned integers of their item
    size: every dtype, bf16 included, comes through bit for bit."""

    def __init__(self, ckpt, group, fields: dict):
        self.ckpt, self.group, self.fields = ckpt, group, fields
        self.outputs: list[np.ndarray] | None = None
        self.pending = len(group.dst)

    def _raw(self, name: str) -> np.ndarray:
        spec = self.ckpt.specs[name]
        raw = np.empty(tuple(spec.shape), np.dtype(f"<u{spec.numpy_dtype.itemsize}"))
        if raw.size:
            self.ckpt.read_into(name, 0, raw.reshape(-1).view(np.uint8))
        return raw

    def read_into(self, k: int, start: int, out: np.ndarray) -> None:
        if self.outputs is None:
            arrays = self.group.transform().forward([self._raw(s) for s in self.group.src], self.fields)
            self.outputs = [a.reshape(-1).view(np.uint8) for a in arrays]
        data = self.outputs[k]
        out[:] = data[start:start + out.size]
        if start + out.size == data.size:
            self.pending -= 1
            if not self.pending:
                self.outputs = None


def _record(group, dst: str) -> dict:
    """conversion.json's account of where one written tensor came from."""
    if group.layout is None:
        return {"source": group.src[0]}
    return {"source": list(group.src), "layout": group.layout, "parameter": dst}


# Shards written at once at most: page-cache copies scale with cores, a disk's flushing does not.
MAX_SHARD_WRITERS = 4


def _shard_writers(jobs, shards) -> int:
    """How many shards are written side by side: several only where every tensor is a kernel copy
    (its bytes unchanged, read by the kernel at an offset: nothing shared between the threads; a
    cast or a fused row reads through the checkpoint reader, which keeps per-tensor state)."""
    if len(shards) < 2 or not all(job.source is not None and job.cast is None for job in jobs):
        return 1
    return min(len(shards), os.cpu_count() or 1, MAX_SHARD_WRITERS)


def _plan(jobs, fmt, max_bytes, crc) -> list[list[str]]:
    if fmt == "ckpt":
        sizes = [(job.name, record_bytes(job.name, job.dtype, job.shape)) for job in jobs]
        shards = plan_balanced_shards(sizes, max_bytes, fixed=CRC_TRAILER if crc else 0)
        size_of = dict(sizes)
        for shard in shards:
            if len(shard) == 1 and size_of[shard[0]] > PROTOBUF_LIMIT:
                raise MigrateError(
                    f"tensor {shard[0]} alone needs {human_bytes(size_of[shard[0]])}, over the 2 GiB protobuf limit "
                    "of one .ckpt file that mindspore.load_checkpoint can parse; use --format safetensors"
                )
        return shards
    return plan_balanced_shards([(job.name, job.size * job.dtype.itemsize) for job in jobs], max_bytes)


def _writer_factory(fmt, jobs, crc):
    metadata = {"format": "ms", "producer": f"migrate {__version__}"}
    by_name = {job.name: job for job in jobs}

    def open_writer(path, names):
        if fmt == "ckpt":
            return CkptWriter(path, crc=crc)
        specs = [(name, by_name[name].dtype, by_name[name].shape) for name in names]
        return SafetensorsWriter(path, specs, metadata=metadata)

    return open_writer


def _choose_dtype(ckpt, dtype: str, ignored: set[str] = frozenset()) -> np.dtype:
    """The output dtype: `dtype`, or with "keep" the one float dtype of the tensors
    to be written. Ignored buffers do not count: old fp16 Llama files keep RoPE's
    `inv_freq` in fp32 beside fp16 weights."""
    if dtype != "keep":
        return CLI_DTYPES[dtype]
    floats = Counter(
        SAFETENSORS_TO_NUMPY[s.dtype] for name, s in ckpt.specs.items()
        if SAFETENSORS_TO_NUMPY.get(s.dtype) in COMPUTE_DTYPE and name not in ignored
    )  # (dtypes outside the table fail later, naming the tensor)
    if not floats:
        raise MigrateError("checkpoint holds no fp32/fp16/bf16 tensors")
    if len(floats) > 1:
        raise MigrateError(
            "checkpoint mixes float dtypes ("
            + ", ".join(short_name(d) for d in floats)
            + "); pass --dtype to choose one"
        )
    return next(iter(floats))


def _check_coverage(ckpt, plan: ConversionPlan) -> None:
    found = coverage(ckpt.specs, plan)
    groups = plan.groups
    if not found.complete:
        target_of = {s: ", ".join(g.dst) for g in groups for s in g.src}
        missing = [f"{s} (-> {target_of[s]})" for s in found.absent_source]
        missing += [f"{name} (model parameter no keymap entry fills)" for name in found.unfilled_target]
        unexpected = found.unmapped_source + [f"{d} (keymap target the model lacks)" for d in found.unknown_target]
        unexpected += [f"{d} (filled by several keymap entries)" for d in found.twice_filled]
        raise CoverageError(missing, unexpected, found.misshaped)
    _refuse_non_float(ckpt, groups)


def _refuse_non_float(ckpt, groups) -> None:
    """Every tensor a keymap row writes becomes a model parameter, and the bundled
    models' parameters are floating point: an int8 / bool / integer weight (a quantized
    checkpoint, a buffer no `ignore` entry names) would be written and then refused by
    MindSpore when the checkpoint loads. Refuse it here, naming it; a buffer that
    is not a parameter belongs in the keymap's `ignore` section."""
    for name in (s for g in groups for s in g.src):
        dtype = SAFETENSORS_TO_NUMPY.get(ckpt.specs[name].dtype)
        if dtype is not None and not is_float(dtype):
            raise MigrateError(
                f"tensor {name} is {short_name(dtype)}, not floating point: the model's parameters are "
                "fp32/fp16/bf16 and MindSpore would refuse it (dequantize the checkpoint first; a buffer that "
                "is not a parameter belongs in the keymap's ignore section)"
            )


def _check_tied(ckpt, tied) -> list[dict]:
    """A tied weight present in the file must equal the weight it is tied to
    (compared chunk by chunk, so neither is ever whole in memory)."""
    records = []
    for pair in tied:
        record = {"source": pair.src, "tied_to": pair.tied_to, "present_in_source": pair.src in ckpt.specs}
        if pair.src in ckpt.specs and not _same_bytes(ckpt, pair.src, pair.tied_to):
            raise MigrateError(
                f"config ties {pair.src} to {pair.tied_to} but the checkpoint holds different values; "
                "set tie_word_embeddings to false in config.json"
            )
        records.append(record)
    return records


def _same_bytes(ckpt, a: str, b: str, chunk: int = stream.CHUNK_BYTES) -> bool:
    spec_a, spec_b = ckpt.specs[a], ckpt.specs[b]
    if spec_a.dtype != spec_b.dtype or tuple(spec_a.shape) != tuple(spec_b.shape):
        return False
    buf_a, buf_b = np.empty(min(chunk, spec_a.nbytes), np.uint8), np.empty(min(chunk, spec_a.nbytes), np.uint8)
    for start in range(0, spec_a.nbytes, chunk):
        n = min(chunk, spec_a.nbytes - start)
        ckpt.read_into(a, start, buf_a[:n])
        ckpt.read_into(b, start, buf_b[:n])
        if not np.array_equal(buf_a[:n], buf_b[:n]):
            return False
    return True


def _source_files(src: Path, ckpt) -> list[Path]:
    """config.json and the weights files read: the index used, not one beside it that
    transformers' precedence passes over (`hf_reader.weights_file`)."""
    extra = [src / "config.json"] + ([ckpt.index] if ckpt.index is not None else [])
    return [p for p in extra if p.is_file()] + list(ckpt.files)


class _SourceHasher:
    """sha256 of every source file for conversion.json, computed beside the
    conversion on threads of their own (hashlib releases the GIL), one file per
    thread at a time, each through one small buffer. sha256 runs at about
    1.1 GB/s per core here, slower than the copy itself, so several files are
    hashed at once when there are several."""

    def __init__(self, files: list[Path], enabled: bool = True, workers: int | None = None,
                 chunk: int = 1024 * 1024):
        if workers is None:  # at least two (overlap beats idling even on two cores), at most eight
            workers = max(2, min(8, (os.cpu_count() or 2) // 2))
        self.files, self.chunk = list(files), chunk
        if not enabled:
            workers = 0
        self.records: dict[Path, dict] = {}
        self.error: BaseException | None = None
        self.stop = threading.Event()
        self._todo = list(reversed(self.files)) if enabled else []  # list.pop is atomic under the GIL
        self.threads = [threading.Thread(target=self._run, name=f"migrate-sha256-{i}", daemon=True)
                        for i in range(min(workers, len(self.files)))]
        for thread in self.threads:
            thread.start()

    def _run(self) -> None:
        try:
            buffer = bytearray(self.chunk)
            view = memoryview(buffer)
            while not self.stop.is_set():
                try:
                    path = self._todo.pop()
                except IndexError:
                    return
                digest = hashlib.sha256()
                with open(path, "rb", buffering=0) as fh:
                    while (n := fh.readinto(view)) and not self.stop.is_set():
                        digest.update(view[:n])
                self.records[path] = {"file": path.name, "bytes": path.stat().st_size, "sha256": digest.hexdigest()}
        except BaseException as exc:
            self.error = exc
            self.stop.set()

    def cancel(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join()

    def result(self) -> list[dict]:
        """The records, in the order of the files, once every file is hashed."""
        for thread in self.threads:
            thread.join()
        if self.error is not None:
            raise MigrateError(f"cannot hash source files: {self.error}")
        return [self.records.get(path) or {"file": path.name, "bytes": path.stat().st_size, "sha256": None}
                for path in self.files]
