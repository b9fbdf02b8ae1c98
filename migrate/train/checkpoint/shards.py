"""Checkpoints of multi-process runs: which rank saved what, per-rank optimizer shards, merge.

A checkpoint folder of a run with more than one process (layout in
`migrate.train.checkpoint.folder`) also holds `parallel_layout.json`:

    {"format": "migrate-parallel-layout", "version": 1,
     "dp": 2, "mp": 1, "pp": 1, "micro_batches": 1, "optimizer_shard": false, "world_size": 2,
     "micro_batch_size": 2, "grad_accum_steps": 2, "global_batch": 8,
     "files": {"model.ckpt": {"kind": "replicated", "saved_by": [0]},
               "optimizer.ckpt": {"kind": "replicated", "saved_by": [0]}, ...}}

Pure data parallel: every rank holds identical parameters and AdamW moments
(the gradients are all-reduced before the update), so rank 0 writes them
whole, once; the folder loads into any dp, including 1.

Optimizer sharding (AdamW states split over the dp ranks, MindSpore's
parallel optimizer; Ascend/GPU only): every moment whose first dimension
divides by dp is split into dp equal row blocks (MindSpore's rule; others
stay whole and are saved by rank 0 alone). Rank r writes
`optimizer.rank-<r>.ckpt` with its blocks, and the layout file gains
`"optimizer_slices": {name: {"shape": [...], "rows": {"<rank>": [start, stop]}}}`.
`merged_optimizer_state` stitches the blocks back for a resume;
`migrate.train.checkpoint.folder.merge_checkpoint` (`migrate ckpt merge`) writes one ordinary single-process
checkpoint. Each shard file is written under a temporary name and renamed,
and the folder itself is assembled by rank 0 under a hidden name and renamed
(`save_checkpoint`), so a crash leaves whole files and whole folders only.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from migrate.errors import MigrateError
from migrate.jsonsafe import load_json
from migrate.train.checkpoint.files import load_ckpt_file, save_tensors_atomically

LAYOUT_FILE = "parallel_layout.json"
LAYOUT_FORMAT = "migrate-parallel-layout"
LAYOUT_VERSION = 1
SHARD_PREFIX = "optimizer.rank-"


def shard_file(rank: int) -> str:
    return f"{SHARD_PREFIX}{rank:05d}.ckpt"


def layout_record(layout, world_size: int | None = None) -> dict:
    """The layout part of parallel_layout.json (files are added by the writer)."""
    return {"format": LAYOUT_FORMAT, "version": LAYOUT_VERSION, "dp": layout.dp, "mp": layout.mp, "pp": layout.pp,
            "micro_batches": layout.micro_batches, "optimizer_shard": bool(layout.optimizer_shard and layout.dp > 1),
            "world_size": world_size or layout.devices, "micro_batch_size": layout.micro_batch_size,
            "grad_accum_steps": layout.grad_accum_steps, "global_batch": layout.global_batch}


def row_block(rows: int, dp: int, index: int) -> tuple[int, int] | None:
    """Rows [start, stop) of dp replica `index` under MindSpore's parallel-optimizer split; None: not split."""
    if dp < 2 or rows % dp:
        return None
    size = rows // dp
    return index * size, (index + 1) * size


# ---------- writing ----------
def slice_table(full_shapes: dict[str, tuple[int, ...]], dp: int) -> dict:
    """name -> {"shape", "rows": {"<rank>": [start, stop]}}: who holds which rows under optimizer sharding."""
    table = {}
    for name, shape in full_shapes.items():
        shape = tuple(shape)
        rows = shape[0] if shape else 0
        blocks = {str(r): row_block(rows, dp, r) for r in range(dp)} if shape else {}
        if not shape or any(b is None for b in blocks.values()):
            blocks = {"0": (0, rows)}  # not split: rank 0 keeps it whole
        table[name] = {"shape": list(shape), "rows": {r: list(b) for r, b in blocks.items()}}
    return table


def write_optimizer_shard(folder: Path, rank: int, dp: int, moments: dict[str, np.ndarray],
                          full_shapes: dict[str, tuple[int, ...]]) -> Path:
    """Write this rank's rows of every moment as `optimizer.rank-<rank>.ckpt` (atomically).

    moments: name -> this rank's array, either the full tensor (cut here) or
    already its row block (as MindSpore's parallel optimizer holds it).
    """
    tensors = {}
    for name, entry in slice_table(full_shapes, dp).items():
        if str(rank) not in entry["rows"]:
            continue
        start, stop = entry["rows"][str(rank)]
        shape = tuple(entry["shape"])
        value = np.asarray(moments[name])
        if value.shape == shape:
            value = value[start:stop] if shape else value
        elif value.shape != (stop - start, *shape[1:]):
            raise MigrateError(f"optimizer state {name} on rank {rank} has shape {value.shape}; expected the "
                               f"full {shape} or its block of {stop - start} rows")
        tensors[name] = value
    path = Path(folder) / shard_file(rank)
    save_tensors_atomically(tensors, path)
    return path


# ---------- reading ----------
def read_layout(folder: Path) -> dict | None:
    """parallel_layout.json of a checkpoint folder, or None for a single-process checkpoint."""
    path = Path(folder) / LAYOUT_FILE
    if not path.is_file():
        return None
    record = load_json(path, expect=dict)  # bounded; one line naming the file otherwise
    if record.get("format") != LAYOUT_FORMAT:
        raise MigrateError(f"{path} is not a migrate parallel layout file")
    slices = record.get("optimizer_slices") or {}
    if not isinstance(slices, dict) or not all(_slice_ok(entry) for entry in slices.values()):
        raise MigrateError(f"{path}: optimizer_slices must give each state's shape and the rows each rank holds")
    return record


def _slice_ok(entry) -> bool:
    """{"shape": [rows, ...], "rows": {"RANK": [start, stop], ...}} with whole numbers in order."""
    def whole(v):
        return isinstance(v, int) and not isinstance(v, bool) and v >= 0

    if not isinstance(entry, dict) or not isinstance(entry.get("shape"), list):
        return False
    if not isinstance(entry.get("rows"), dict):
        return False
    return (all(whole(n) for n in entry["shape"]) and all(
        isinstance(rank, str) and rank.isdigit() and isinstance(span, list) and len(span) == 2
        and all(whole(v) for v in span) and span[0] <= span[1] for rank, span in entry["rows"].items()))


def is_sharded(record: dict | None) -> bool:
    return bool(record and record.get("optimizer_slices"))


def merged_optimizer_state(folder: Path, record: dict) -> dict[str, np.ndarray]:
    """Every moment whole again, stitched from the per-rank shard files the layout names."""
    folder = Path(folder)
    shards = sorted({rank for entry in record["optimizer_slices"].values() for rank in entry["rows"]}, key=int)
    loaded = {}
    for rank in shards:
        path = folder / shard_file(int(rank))
        if not path.is_file():
            raise MigrateError(f"checkpoint {folder} lacks {path.name}, which {LAYOUT_FILE} names")
        loaded[rank] = {name: p.asnumpy() for name, p in load_ckpt_file(path).items()}
    out = {}
    for name, entry in record["optimizer_slices"].items():
        shape = tuple(entry["shape"])
        full = np.empty(shape, np.float32)
        covered = 0
        for rank, (start, stop) in sorted(entry["rows"].items(), key=lambda kv: kv[1][0]):
            if start != covered or name not in loaded[rank]:
                raise MigrateError(f"optimizer state {name}: the shards of {folder} do not tile rows 0..{shape[0]}")
            full[start:stop] = loaded[rank][name].reshape((stop - start, *shape[1:]))
            covered = stop
        if covered != (shape[0] if shape else 0):
            raise MigrateError(f"optimizer state {name}: the shards of {folder} cover rows 0..{covered} "
                               f"of {shape[0]}")
        out[name] = full
    return out


def layout_without_files(record: dict | None) -> dict | None:
    """The layout record without its per-file and per-slice tables (what a merged checkpoint cites)."""
    if record is None:
        return None
    return {k: v for k, v in record.items() if k not in ("files", "optimizer_slices")}
