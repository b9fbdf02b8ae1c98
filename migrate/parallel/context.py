"""MindSpore's auto-parallel context for a layout.

    kwargs = parallel_context(layout)        # for mindspore.set_auto_parallel_context(**kwargs)
    apply_parallel_context(layout)           # communication.init() + set_auto_parallel_context

Modes (`mode=`):
- "sharding_propagation" (default when mp > 1, pp > 1 or the optimizer is
  sharded): parallel_mode="auto_parallel", search_mode="sharding_propagation".
  `assign_strategies` annotates the key operators (every matmul, the
  embedding gather, the attention softmax); MindSpore derives the layouts of
  the unannotated ones (RMSNorm, RoPE, SwiGLU's elementwise ops) from them,
  as its sharding-propagation docs describe. That keeps activations between
  a column and a row projection split over mp, as `migrate.memory_plan` assumes.
- "semi_auto": parallel_mode="semi_auto_parallel" (what MindFormers uses with
  a strategy on every op). Here unannotated ops get MindSpore's default
  data-parallel strategy, so MindSpore inserts redistributions around them:
  correct, but slower and with full-width SwiGLU activations.
- dp only (mp == pp == 1, no optimizer sharding): parallel_mode="data_parallel",
  the one mode MindSpore also runs on CPU (msrun, mccl).

MindSpore refuses semi-auto/auto parallel on CPU ("only support Ascend/GPU
backend"): those contexts are built to the documented API and unit-tested for
what they set, not executed here. `set_auto_parallel_context` is marked for
deprecation in 2.10 in favour of `mindspore.parallel.auto_parallel.AutoParallel`;
`auto_parallel_network` builds that form from the same layout.
"""
from __future__ import annotations

from typing import Any

from migrate.errors import MigrateError
from migrate.parallel.layout import Layout

MODES = ("sharding_propagation", "semi_auto")


def needs_auto_parallel(layout: Layout) -> bool:
    return layout.mp > 1 or layout.pp > 1 or (layout.optimizer_shard and layout.dp > 1)


def parallel_context(layout: Layout, mode: str = "sharding_propagation") -> dict[str, Any]:
    """The keyword arguments of `mindspore.set_auto_parallel_context` for this layout."""
    if mode not in MODES:
        raise MigrateError(f"unknown parallel mode {mode!r}; use one of: {', '.join(MODES)}")
    kwargs: dict[str, Any] = {"device_num": layout.devices}
    if not needs_auto_parallel(layout):
        if layout.devices == 1:
            return {"parallel_mode": "stand_alone"}
        kwargs.update(parallel_mode="data_parallel", gradients_mean=True)
        return kwargs
    if mode == "sharding_propagation":
        kwargs.update(parallel_mode="auto_parallel", search_mode="sharding_propagation")
    else:
        kwargs.update(parallel_mode="semi_auto_parallel")
    kwargs.update(
        gradients_mean=True,
        dataset_strategy="data_parallel",  # each dp replica reads its own slice of the batch
        pipeline_stages=layout.pp,
        enable_parallel_optimizer=bool(layout.optimizer_shard and layout.dp > 1),
    )
    if layout.pp > 1:
        kwargs["pipeline_config"] = {"pipeline_interleave": False, "pipeline_scheduler": "1f1b"}
    return kwargs


def apply_parallel_context(layout: Layout, mode: str = "sharding_propagation", init_comm: bool = True) -> dict:
    """Initialise communication (under msrun) and set the auto-parallel context; return the kwargs used."""
    import mindspore as ms

    kwargs = parallel_context(layout, mode)
    if needs_auto_parallel(layout) and ms.get_context("device_target") == "CPU":
        raise MigrateError(f"layout {layout.describe()} needs tensor/pipeline parallel or optimizer sharding, "
                           f"which MindSpore runs only on Ascend or GPU (CPU supports data parallel only)")
    if init_comm and layout.devices > 1:
        from mindspore.communication import init

        init()
    if kwargs["parallel_mode"] != "stand_alone":
        ms.set_auto_parallel_context(**kwargs)
    return kwargs


def auto_parallel_network(net, layout: Layout, mode: str = "sharding_propagation"):
    """The 2.10 form: `mindspore.parallel.auto_parallel.AutoParallel` configured from the layout.

    Needs initialised communication (AutoParallel asks for the rank when built).
    """
    from mindspore.parallel.auto_parallel import AutoParallel

    if mode not in MODES:
        raise MigrateError(f"unknown parallel mode {mode!r}; use one of: {', '.join(MODES)}")
    try:
        wrapped = AutoParallel(net, parallel_mode="semi_auto" if mode == "semi_auto" else "sharding_propagation")
    except RuntimeError as exc:
        raise MigrateError(f"AutoParallel needs initialised communication (launch with msrun): "
                           f"{' '.join(str(exc).split())[:200]}") from None
    wrapped.dataset_strategy("data_parallel")
    wrapped.enable_gradients_mean()
    if layout.pp > 1:
        wrapped.pipeline(stages=layout.pp, scheduler="1f1b")
    if layout.optimizer_shard and layout.dp > 1:
        wrapped.hsdp()
    return wrapped
