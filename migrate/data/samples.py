"""Reading tokenized data and the global sample order both sides follow.

Row convention (written by `migrate.data.tokenize`): each row holds
seq_length + 1 consecutive tokens; the model reads row[:-1] and learns to
predict row[1:], so every one of the seq_length positions has a target (the
MindFormers layout; HF's `model(row, labels=row)` gives the same loss).

Order convention (`sample_order`): draws are grouped in epochs; epoch e visits
every row once, as `numpy.random.default_rng([seed, e]).permutation(n)`
(SeedSequence of the two ints, PCG64), or 0..n-1 when not shuffling. Epochs are
concatenated and cut at the number of draws the run needs. Seeding each epoch
on its own lets a resumed run recompute any epoch without replaying the others.
Optimizer step s (0-based), micro-batch m reads the rows
`run_order(cfg, n)[s, m]`, i.e. draws (s * grad_accum_steps + m) * micro_batch_size
onward.
"""
from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np

from migrate.checkpoints.input_folder import InputFolder
from migrate.errors import MigrateError
from migrate.safeyaml import clip, quote

SAMPLES_FILE = "train.npy"
MINDRECORD_FILE = "train.mindrecord"
META_FILE = "data.json"


def read_meta(data_dir: str | Path) -> dict:
    """data.json, read under the reader rule (bounded JSON inside the folder), with the two sizes
    every reader of the rows relies on checked."""
    folder = InputFolder(data_dir, "data folder")
    if not (folder.path / META_FILE).is_file():
        raise MigrateError(f"no {META_FILE} in {data_dir}: not a folder written by `migrate data tokenize`")
    meta = folder.json(META_FILE, expect=dict)
    for key in ("samples", "seq_length"):
        value = meta.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < (1 if key == "seq_length" else 0):
            raise MigrateError(f"{folder.path / META_FILE}: {key} must be a whole number, found {quote(value)}")
    return meta


def load_samples(data_dir: str | Path, seq_length: int | None = None) -> np.ndarray:
    """The int32 [n, seq_length + 1] rows, memory-mapped (read-only); a file whose header
    promises more bytes than it holds, or rows that are not whole numbers, is refused in one line."""
    meta = read_meta(data_dir)
    folder = InputFolder(data_dir, "data folder")
    if not os.path.lexists(folder.path / SAMPLES_FILE):
        raise MigrateError(f"no {SAMPLES_FILE} in {data_dir}")
    path = folder.member(SAMPLES_FILE, SAMPLES_FILE)
    try:
        rows = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise MigrateError(f"{path}: not a readable .npy of token rows ({_first_line(exc)})") from None
    if not isinstance(rows, np.ndarray) or not np.issubdtype(rows.dtype, np.integer):
        raise MigrateError(f"{path}: token rows must be whole numbers, found {getattr(rows, 'dtype', type(rows))}")
    if rows.ndim != 2 or rows.shape[0] != meta["samples"] or rows.shape[1] != meta["seq_length"] + 1:
        raise MigrateError(f"{path} has shape {rows.shape}, {META_FILE} promises "
                           f"({meta['samples']}, {meta['seq_length'] + 1})")
    if seq_length is not None:
        check_seq_length(data_dir, seq_length, meta)
    return rows


def check_seq_length(data_dir: str | Path, seq_length: int, meta: dict | None = None) -> None:
    """The run config's seq_length is the one `data_dir` was tokenized with (its data.json): what
    both trainers refuse otherwise, and `migrate hparams` checks before it says the knobs agree."""
    meta = read_meta(data_dir) if meta is None else meta
    if seq_length != meta.get("seq_length"):
        raise MigrateError(f"run config seq_length is {seq_length} but {data_dir} was tokenized "
                           f"with seq_length {meta.get('seq_length')}")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return clip(text[0]) if text else type(exc).__name__


def sample_order(n: int, count: int, seed: int | None) -> np.ndarray:
    """Row indices of the first `count` draws over n rows (see the module docstring)."""
    if n < 1:
        raise MigrateError("the data folder holds no samples")
    epochs = math.ceil(count / n)
    parts = [np.arange(n) if seed is None else np.random.default_rng([seed, e]).permutation(n)
             for e in range(epochs)]
    return np.concatenate(parts)[:count].astype(np.int64) if parts else np.zeros(0, np.int64)


def run_order(cfg, n: int) -> np.ndarray:
    """[total_steps, grad_accum_steps, micro_batch_size] row indices for a RunConfig."""
    shape = (cfg.total_steps, cfg.grad_accum_steps, cfg.micro_batch_size)
    return sample_order(n, math.prod(shape), cfg.shuffle_seed).reshape(shape)
