"""Tensor / pipeline / optimizer parallel layouts for the bundled Llama on MindSpore.

- layout.py   Layout(dp, mp, pp, ...), validate/check: the divisibility rules; the global-batch line.
- strategy.py assign_strategies(model, layout): shard strategies on every matmul, read back for inspection.
- pipeline.py assign_pipeline_stages(model, pp), build_pipeline_network (mindspore.parallel.nn.Pipeline).
- context.py  parallel_context(layout): kwargs for mindspore.set_auto_parallel_context; apply_parallel_context.
- runtime.py  start_parallel(layout) -> ParallelRun: this rank under msrun, its data shard, the grad reducer.

MindSpore runs tensor/pipeline parallel and optimizer sharding only on
Ascend/GPU; here these are built to its documented API and tested for what
they assign, not executed.
"""
from migrate.parallel.layout import Layout, check, kv_replicated, validate

__all__ = ["Layout", "check", "kv_replicated", "validate"]
