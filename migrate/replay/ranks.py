"""The ranks of a `migrate train --dp N` run in one process: how `migrate replay` replays a dp step.
It replays the global batch on ONE process, rank by rank, not on N processes.

`RanksInOneProcess` stands in for the worker's `ParallelRun` (`migrate.parallel.runtime`) where the
MindSpore recipe uses it. It is rank 0 and reads rank 0's share (`data_shard`). Its `reduce_grads`,
which the trainer's step calls once on rank 0's accumulated gradients, runs every other rank's share
of the step's micro-batches (`ms_data.micro_batches(shard=(dp, r))`, the rows that rank reads)
through the same micro-step graphs (`StepGraphs.forward_backward`), with the accumulators zeroed
before each rank. It then applies MindSpore's own reduction, `nn.DistributedGradReducer`'s
`_tensors_allreduce` under DATA_PARALLEL with gradients_mean, to each gradient: the all-reduce (here
a stand-in: the ranks' sum, in rank order, in the gradient's dtype) times 1/dp. `mean_over_ranks` is
ParallelRun's: the fp32 sum of the ranks' losses over dp. The only difference from N processes is the
order of the all-reduce's sum over more than two ranks (rounding); with two ranks it is the same add.
"""
from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import Tensor, ops
from mindspore.nn.wrap.grad_reducer import _tensors_allreduce

from migrate.errors import MigrateError
from migrate.parallel.layout import Layout
from migrate.train.ms_data import micro_batches

HOW = ("the global batch on one process: each dp rank's micro-batches run rank by rank through the "
       "trainer's micro-step, their gradients reduced by DistributedGradReducer's mean (sum over ranks x 1/dp)")


class RanksInOneProcess:
    """A `ParallelRun` for a data-parallel layout, its ranks run in this process (see the module docstring)."""

    def __init__(self, layout: Layout):
        self.layout, self.rank, self.size = layout, 0, layout.dp
        self.recipe = None          # the MindSpore recipe it serves (`attach`)
        self.rank_losses: list = []  # per rank after rank 0: its micro-batches' losses, this step
        self.reduced: list = []      # the reduced gradients, in the optimizer's parameter order (numpy)
        self._batches: dict = {}     # rank -> its micro-batch iterator
        self.is_writer = True        # the replay's recipe writes to a temporary folder

    @property
    def data_shard(self) -> tuple[int, int]:
        return self.layout.dp, 0

    def attach(self, recipe) -> None:
        self.recipe = recipe

    def bind(self, parameters) -> None:
        """No reducer to build: `reduce_grads` reduces in this process."""

    def barrier(self) -> None:
        """One process: nothing to wait for."""

    def describe(self) -> dict:
        return {"dp": self.layout.dp, "replayed": HOW}

    def reduce_grads(self, grads) -> tuple:
        """Rank 0's accumulated `grads` -> the mean over every rank's, the other ranks run here first."""
        recipe = self.recipe
        graphs, step, accum = recipe.graphs, recipe.position.step, recipe.cfg.grad_accum_steps
        scaler = recipe.training.scaler
        scale = Tensor(np.float32(scaler.scale if scaler is not None else 1.0))
        ranks = [[_copy(g) for g in grads]]
        self.rank_losses = []
        for r in range(1, self.size):
            graphs.reduce_grads(lambda values: tuple(ops.zeros_like(v) for v in values))  # this rank starts at 0
            batch = []
            for micro in range(accum):
                s, m, rows = next(self._rank_batches(r, step))
                if (s, m) != (step, micro):  # as the trainer's `_batch`: pipeline and loop never part
                    raise MigrateError(f"rank {r}'s data at step {s + 1} micro {m}, the replay at {step + 1} {micro}")
                batch.append(rows)
            self.rank_losses.append(graphs.forward_backward(batch, scale))
            graphs.reduce_grads(lambda values: ranks.append([_copy(v) for v in values]) or values)
        degree = Tensor(1.0 / self.size, ms.float32)
        reduced = tuple(_tensors_allreduce(degree, True, None, lambda g, i=i: _rank_sum(ranks, i), True, g)
                        for i, g in enumerate(ranks[0]))
        self.reduced = [g.astype(ms.float32).asnumpy().copy() for g in reduced]  # the accumulators alias them
        return reduced

    def mean_over_ranks(self, value: float) -> float:
        """ParallelRun's: every rank's mean loss summed in fp32 (rank 0's is `value`), over dp."""
        total = np.float32(value)
        for losses in self.rank_losses:
            total = np.float32(total + np.float32(sum(losses) / len(losses)))
        return float(total) / self.size

    def _rank_batches(self, rank: int, step: int):
        """Rank `rank`'s micro-batches from optimizer step `step` (0-based) on, as that rank reads them."""
        if rank not in self._batches:
            recipe = self.recipe
            self._batches[rank] = micro_batches(recipe.cfg, step, recipe.order, shard=(self.size, rank))
        return self._batches[rank]


def _copy(tensor):
    """A tensor's value, apart from the accumulator it came from (which the next rank overwrites)."""
    return ops.add(tensor, ops.zeros_like(tensor))


def _rank_sum(ranks: list, index: int):
    """The stand-in all-reduce of gradient `index`: the ranks' values summed in rank order."""
    total = ranks[0][index]
    for values in ranks[1:]:
        total = total + values[index]
    return total
