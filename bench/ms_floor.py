"""The MindSpore floor: one optimizer step of the trainer's model -- every micro-batch's
forward + backward, the accumulation, the clip and torch-semantics AdamW -- as ONE
compiled GRAPH_MODE cell, timed alone (no data pipeline, no host work between graphs).

    seconds, losses = floor_step_times(cfg, steps)   # per step; the first carries the compile

Built from the same live objects `migrate train` builds (`build_training`: model and
precision, AdamW groups and moments, clipper) and the trainer's own graph code (`MicroStep`'s
loss, `optimizer_step`'s norm, clip and AdamW), so the work per step is the trainer's; only the
launches, the accumulator Parameters and the host work between its graphs are gone. What `migrate train` takes
over this is the overhead part 2 of issue 18 attacks.
"""
from __future__ import annotations

import time

import mindspore as ms
import numpy as np
from mindspore import Tensor

from migrate.data.samples import load_samples, run_order
from migrate.train.building import build_training
from migrate.train.step.optimizer import WholeStep, clip_tensors


def floor_step_times(cfg, steps: int) -> tuple[list[float], list[float]]:
    """(wall seconds, loss) of `steps` floor steps on the run's data (GRAPH_MODE, synchronised)."""
    previous = ms.get_context("mode")
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        return _run(cfg, steps)
    finally:
        ms.set_context(mode=previous)


def _run(cfg, steps: int) -> tuple[list[float], list[float]]:
    ms.set_seed(cfg.seed)
    training = build_training(cfg)
    opt = training.optimizer
    cell = WholeStep(training.micro, training.clipper, opt, cfg.grad_accum_steps)
    one = Tensor(np.float32(1.0))
    rows = load_samples(cfg.data, cfg.seq_length)
    order = run_order(cfg, len(rows))
    times, losses = [], []
    for step in range(steps):
        batch = np.asarray(rows[order[step % len(order)].reshape(-1)], np.int32).reshape(
            cfg.grad_accum_steps, cfg.micro_batch_size, cfg.seq_length + 1)
        ids, targets = Tensor(np.ascontiguousarray(batch[..., :-1])), Tensor(np.ascontiguousarray(batch[..., 1:]))
        opt.set_lr(training.schedule.lr(step))
        args = opt.advance()
        start = time.perf_counter()
        micro_losses, _, _ = cell(ids, targets, one, one, *clip_tensors(training.clipper), *args)
        losses.append(float(np.mean(micro_losses.asnumpy().astype(np.float64))))
        if ms.get_context("device_target") != "CPU":  # a CPU graph call returns when done
            ms.runtime.synchronize()
        times.append(time.perf_counter() - start)
    return times, losses

