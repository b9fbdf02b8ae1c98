"""The live side of a multi-process run: which rank this process is, and MindSpore's
collective pieces the trainer calls.

    run = start_parallel(layout)        # under msrun: communication.init() + the parallel context
    grads = run.reduce_grads(grads)     # mindspore.nn.DistributedGradReducer (DATA_PARALLEL, mean)
    loss = run.mean_over_ranks(loss)    # the logged loss of the whole global batch
    if run.is_writer: ...               # rank 0 writes metrics and checkpoints

Data parallel uses MindSpore's own engine: `apply_parallel_context` calls
`mindspore.communication.init()` and sets `parallel_mode=DATA_PARALLEL,
gradients_mean=True`; `nn.DistributedGradReducer` reads the mean and the
degree from that context and all-reduces every gradient. The trainer calls it
once per optimizer step, on the accumulated gradients, so accumulation costs
no extra communication.

Under tensor/pipeline parallel (Ascend/GPU only, never run here) MindSpore's
compiler inserts the gradient reductions itself, so `reduce_grads` is the
identity there; `dp_rank` maps a global rank to the data-parallel replica
whose slice of the batch it reads (every mp/pp rank of one replica reads the
same rows).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from migrate.parallel.context import apply_parallel_context, needs_auto_parallel
from migrate.parallel.layout import Layout


def dp_rank(rank: int, layout: Layout) -> int:
    """The data-parallel replica of a global rank.

    MindSpore numbers ranks stage by stage (pipeline_stages groups of dp × mp
    devices), mp fastest inside a stage, as MindFormers' dataset sharding assumes.
    """
    per_stage = layout.dp * layout.mp
    return (rank % per_stage) // layout.mp


@dataclass
class ParallelRun:
    """This process's place in a run of `layout.devices` processes."""

    layout: Layout
    rank: int
    size: int
    context: dict = field(default_factory=dict)
    _reducer: object = None
    _allreduce: object = None

    @property
    def is_writer(self) -> bool:
        """Rank 0 writes metrics, evaluations and checkpoints; the others only train."""
        return self.rank == 0

    @property
    def data_shard(self) -> tuple[int, int]:
        """(num_shards, shard_id) of this rank's data."""
        return self.layout.dp, dp_rank(self.rank, self.layout)

    def bind(self, parameters) -> None:
        """Build the gradient reducer for the optimizer's parameters (pure data parallel only)."""
        if needs_auto_parallel(self.layout) or self.size == 1:
            return
        from mindspore import nn

        self._reducer = nn.DistributedGradReducer(parameters)

    def use_reducer(self, reducer) -> None:
        """Another reducer (PipelineGradReducer under pp), or None where the compiler reduces."""
        self._reducer = reducer

    def barrier(self) -> None:
        if self.size > 1:
            from mindspore.communication.comm_func import barrier

            barrier()

    def reduce_grads(self, grads):
        return grads if self._reducer is None else self._reducer(grads)

    def mean_over_ranks(self, value: float) -> float:
        if self.size == 1:
            return value
        import mindspore as ms
        import numpy as np
        from mindspore import ops

        if self._allreduce is None:
            self._allreduce = ops.AllReduce(ops.ReduceOp.SUM)
        total = self._allreduce(ms.Tensor(np.float32(value)))
        return float(total.asnumpy()) / self.size

    def describe(self) -> dict:
        """What effective_hparams.json records about the parallel setup."""
        out = {"dp": self.layout.dp, "mp": self.layout.mp, "pp": self.layout.pp,
               "micro_batches": self.layout.micro_batches, "optimizer_shard": self.layout.optimizer_shard,
               "world_size": self.size, "rank": self.rank, "context": dict(self.context),
               "global_batch": self.layout.global_batch,
               "data": f"DistributedSampler(num_shards={self.layout.dp}, shard_id=dp rank) over the global order"}
        reducer = self._reducer
        if reducer is not None:
            out["grad_reducer"] = {"class": f"{type(reducer).__module__}.{type(reducer).__name__}"}
            if hasattr(reducer, "degree"):
                out["grad_reducer"].update(mean=bool(reducer.mean), degree=round(1.0 / float(reducer.degree.asnumpy())))
        return out


def start_parallel(layout: Layout) -> ParallelRun:
    """Join the msrun cluster and set the parallel context (call first thing in a worker).

    The msrun scheduler process runs the same command: `init()` never returns there.
    """
    from mindspore.communication import get_group_size, get_rank

    context = apply_parallel_context(layout, init_comm=True)
    return ParallelRun(layout, get_rank(), get_group_size(), context)
