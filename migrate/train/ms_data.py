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

Data parallel (dp ranks): the order is cut into *global* micro-batches of
micro_batch_size × dp rows (`training_order(cfg, dp)`), the same flat draws a
single process with micro batch micro_batch_size × dp reads. Rank r reads its
share through `DistributedSampler(num_shards=dp, shard_id=r)` -- the sampler
`MindDataset(num_shards=, shard_id=)` builds, which MindDataset refuses to
combine with a `sampler=` argument ("sampler and sharding cannot be specified
at the same time") -- with the run-order SubsetSampler as its child. It deals
the flat order round-robin (MindDataset's sharding strategy 1), so rank r's
micro-batch of step s, micro m is rows `order[s, m, r::dp]`: the union over
ranks is exactly the global micro-batch, each rank holding micro_batch_size rows.
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from migrate.data.samples import MINDRECORD_FILE, read_meta, run_order, sample_order
from migrate.errors import MigrateError

COLUMN = "input_ids"


def mindrecord_path(data_dir: str | Path) -> Path:
    path = Path(data_dir) / MINDRECORD_FILE
    if not path.is_file():
        raise MigrateError(f"no {MINDRECORD_FILE} in {data_dir}: not a folder written by `migrate data tokenize`")
    return path


def training_order(cfg, dp: int = 1) -> np.ndarray:
    """[total_steps, grad_accum_steps, micro_batch_size × dp] row indices: the global micro-batches.

    dp = 1 is the golden's `run_order`; any dp draws the same flat sequence.
    """
    meta = read_meta(cfg.data)
    if meta["seq_length"] != cfg.seq_length:
        raise MigrateError(f"run config seq_length is {cfg.seq_length} but {cfg.data} was tokenized "
                           f"with seq_length {meta['seq_length']}")
    if dp == 1:
        return run_order(cfg, int(meta["samples"]))
    shape = (cfg.total_steps, cfg.grad_accum_steps, cfg.micro_batch_size * dp)
    return sample_order(int(meta["samples"]), int(np.prod(shape)), cfg.shuffle_seed).reshape(shape)


def micro_batches(cfg, start_step: int = 0, order: np.ndarray | None = None, shard: tuple[int, int] = (1, 0),
                  ) -> Iterator[tuple[int, int, np.ndarray]]:
    """(step, micro, rows) for every micro-batch from optimizer step `start_step` (0-based) on.

    rows: int32 [micro_batch_size, seq_length + 1], read through MindDataset.
    shard: (num_shards, shard_id) -- this data-parallel rank's share of the
    global micro-batches of `order` (see the module docstring).
    """
    import mindspore.dataset as ds

    num_shards, shard_id = shard
    if not 0 <= shard_id < num_shards:
        raise MigrateError(f"data shard {shard_id} is outside 0..{num_shards - 1}")
    order = training_order(cfg, num_shards) if order is None else order
    if order.shape[-1] != cfg.micro_batch_size * num_shards:
        raise MigrateError(f"the run order holds global micro-batches of {order.shape[-1]} rows, "
                           f"not micro_batch_size {cfg.micro_batch_size} × {num_shards} shards")
    if not 0 <= start_step <= len(order):
        raise MigrateError(f"data position {start_step} is outside the run's {len(order)} steps")
    todo = order[start_step:]
    if todo.size == 0:
        return
    # MindDataset's SubsetSampler takes at most as many indices as the file has rows, so a
    # run of several epochs reads one MindDataset per chunk of that size, concatenated in order.
    flat, rows_in_file = todo.reshape(-1), int(read_meta(cfg.data)["samples"])
    path = str(mindrecord_path(cfg.data))
    # Chunks start at multiples of num_shards, so the round-robin deal stays aligned across them.
    chunk = max(rows_in_file // num_shards, 1) * num_shards
    parts = [ds.MindDataset(path, columns_list=[COLUMN], sampler=_sampler(flat[i:i + chunk], num_shards, shard_id),
                            shuffle=None, num_parallel_workers=1)
             for i in range(0, len(flat), chunk)]
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


def _sampler(indices: np.ndarray, num_shards: int, shard_id: int):
    import mindspore.dataset as ds

    subset = ds.SubsetSampler(indices.tolist())
    if num_shards == 1:
        return subset
    sharded = ds.DistributedSampler(num_shards=num_shards, shard_id=shard_id, shuffle=False)
    sharded.add_child(subset)
    return sharded


def _concat(parts):
    dataset = parts[0]
    for part in parts[1:]:
        dataset = dataset + part
    return dataset

