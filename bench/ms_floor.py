"""The MindSpore floor: one optimizer step of the trainer's model -- every micro-batch's
forward + backward, the accumulation, the clip and torch-semantics AdamW -- as ONE
compiled GRAPH_MODE cell, timed alone (no data pipeline, no host work between graphs).

    seconds, losses = floor_step_times(cfg, steps)   # per step; the first carries the compile

Built from the same live objects `migrate train` builds (`build_training`: model and
precision, AdamW groups and moments, clipper), so the work per step is the trainer's;
only the launches and host work between its graphs are gone. What `migrate train` takes
over this is the overhead part 2 of issue 18 attacks.
"""
from __future__ import annotations

import time

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn, ops

from migrate.data.samples import load_samples, run_order
from migrate.train.building import build_training


class FloorStep(nn.Cell):
    """accum × (forward + backward), clip, AdamW: one graph, one launch per optimizer step."""

    def __init__(self, training, accum: int):
        super().__init__(auto_prefix=False)
        self.micro = training.micro            # MicroStep: loss and acc + grads
        self.clip = training.clipper._cell     # _NormAndClip
        self.update = training.optimizer._update  # _AdamWUpdate (assigns params and moments)
        self.accum = accum

    def construct(self, ids, targets, scale, acc, inv_scale, max_norm, eps, decays, w1, b2, w2, neg_step,
                  bc2_sqrt, adam_eps):
        losses = 0.0
        for i in range(self.accum):  # unrolled at compile time
            loss, acc = self.micro(ids[i], targets[i], scale, acc)
            losses = losses + loss
        grads, total, _, _ = self.clip(acc, inv_scale, max_norm, eps)
        done = self.update(grads, decays, w1, b2, w2, neg_step, bc2_sqrt, adam_eps)
        return ops.depend(losses / self.accum, done), total  # the update's assigns are part of the output


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
    opt, clipper = training.optimizer, training.clipper
    cell = FloorStep(training, cfg.grad_accum_steps)
    rows = load_samples(cfg.data, cfg.seq_length)
    order = run_order(cfg, len(rows))
    f32 = lambda x: Tensor(np.float32(x))  # noqa: E731
    zeros = tuple(Tensor(np.zeros(p.shape, np.float32)) for p in opt.parameters)
    times, losses = [], []
    for step in range(steps):
        batch = np.asarray(rows[order[step % len(order)].reshape(-1)], np.int32).reshape(
            cfg.grad_accum_steps, cfg.micro_batch_size, cfg.seq_length + 1)
        ids, targets = Tensor(np.ascontiguousarray(batch[..., :-1])), Tensor(np.ascontiguousarray(batch[..., 1:]))
        opt.set_lr(training.schedule.lr(step))
        s = opt.scalars(step + 1)
        decays = tuple(f32(s["decays"][g]) for g in opt._group_of)
        start = time.perf_counter()
        loss, _ = cell(ids, targets, f32(1.0), ms.mutable(zeros), f32(1.0), f32(clipper.max_norm or 0.0),
                       f32(clipper.eps), ms.mutable(decays), f32(s["w1"]), f32(s["b2"]), f32(s["w2"]),
                       f32(s["neg_step"]), f32(s["bc2_sqrt"]), f32(s["eps"]))
        losses.append(float(loss.asnumpy()))
        if ms.get_context("device_target") != "CPU":  # a CPU graph call returns when done
            ms.runtime.synchronize()
        times.append(time.perf_counter() - start)
    return times, losses

