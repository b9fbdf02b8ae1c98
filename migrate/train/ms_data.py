"""The MindSpore side's input pipeline: `mindspore.dataset.MindDataset` over the
tokenized `train.mindrecord`, in exactly the golden script's order.

The order is `run_order(cfg, n)` (migrate.data.samples), flattened step by
step and micro-batch by micro-batch, and handed to MindDataset as a
`SubsetSampler` (which visits the given indices in the given order, repeats
included); MindDataset itself never shuffles. SubsetSampler accepts at most
as many indices as the file has rows, so a multi-epoch run concatenates one
MindDataset per chunk of that size (in order) before batching. `.batch(micro_batch_size)`
then cuts consecutive micro-batches, so micro-batch m of optimizer step s is
rows `order[s, m]` -- the same rows the golden side reads from train.npy.
A resumed run starts the sampler at its step: nothing before it is read.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import numpy as np

from migrate.data.samples import MINDRECORD_FILE, read_meta, run_order
from migrate.errors import MigrateError

COLUMN = "input_ids"


def mindrecord_path(data_dir: str | Path) -> Path:
    path = Path(data_dir) / MINDRECORD_FILE
    if not path.is_file():
        raise MigrateError(f"no {MINDRECORD_FILE} in {data_dir}: not a folder written by `migrate data tokenize`")
    return path


def training_order(cfg) -> np.ndarray:
    """[total_steps, grad_accum_steps, micro_batch_size] row indices (the golden's `run_order`)."""
    meta = read_meta(cfg.data)
    if meta["seq_length"] != cfg.seq_length:
        raise MigrateError(f"run config seq_length is {cfg.seq_length} but {cfg.data} was tokenized "
                           f"with seq_length {meta['seq_length']}")
    return run_order(cfg, int(meta["samples"]))


def micro_batches(cfg, start_step: int = 0, order: np.ndarray | None = None,
                  ) -> Iterator[tuple[int, int, np.ndarray]]:
    """(step, micro, rows) for every micro-batch from optimizer step `start_step` (0-based) on.

    rows: int32 [micro_batch_size, seq_length + 1], read through MindDataset.
    """
    import mindspore.dataset as ds

    order = training_order(cfg) if order is None else order
    if not 0 <= start_step <= len(order):
        raise MigrateError(f"data position {start_step} is outside the run's {len(order)} steps")
    todo = order[start_step:]
    if todo.size == 0:
        return
    # MindDataset's SubsetSampler takes at most as many indices as the file has rows, so a
    # run of several epochs reads one MindDataset per chunk of that size, concatenated in order.
    flat, rows_in_file = todo.reshape(-1), int(read_meta(cfg.data)["samples"])
    path = str(mindrecord_path(cfg.data))
    parts = [ds.MindDataset(path, columns_list=[COLUMN], sampler=ds.SubsetSampler(flat[i:i + rows_in_file].tolist()),
                            shuffle=None, num_parallel_workers=1)
             for i in range(0, len(flat), rows_in_file)]
    dataset = _concat(parts)
    dataset = dataset.batch(cfg.micro_batch_size, drop_remainder=False)
    accum = cfg.grad_accum_steps
    count = 0
    for (rows,) in dataset.create_tuple_iterator(num_epochs=1, output_numpy=True):
        step, micro = start_step + count // accum, count % accum
        if rows.shape != (cfg.micro_batch_size, cfg.seq_length + 1):
            raise MigrateError(f"{MINDRECORD_FILE} gave a batch of shape {rows.shape} at step {step + 1}, "
                               f"expected ({cfg.micro_batch_size}, {cfg.seq_length + 1})")
        yield step, micro, rows
        count += 1
    if count != todo.shape[0] * accum:
        raise MigrateError(f"{MINDRECORD_FILE} ran out after {count} micro-batches; "
                           f"the run needs {todo.shape[0] * accum}")


def _concat(parts):
    dataset = parts[0]
    for part in parts[1:]:
        dataset = dataset + part
    return dataset

