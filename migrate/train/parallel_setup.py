"""What `migrate train --dp/--mp/--pp/...` checks before anything starts, and how the
trainer is wired for a multi-process layout.

    layout = run_layout_of(cfg, dp=2, mp=1, pp=1, micro_batches=1, optimizer_shard=False)
    errors = layout_errors(layout, model_config, cfg, cluster)   # one line per broken rule
    refuse_unsupported(layout)                                   # SEMI_AUTO_PARALLEL on CPU -> MigrateError
    wire_parallel(training, parallel_run)                        # in each worker, after build_training

Data parallel (mp = pp = 1, no optimizer sharding) is MindSpore's
DATA_PARALLEL mode and runs on CPU. Anything else needs MindSpore's
SEMI_AUTO/AUTO_PARALLEL, which it runs only on Ascend/GPU: there
`wire_model_parallel` applies the shard strategies to every matmul
(`migrate.parallel.strategy`), the pipeline stages
(`migrate.parallel.pipeline`) and, with pp > 1, trains through
`mindspore.parallel.nn.Pipeline` with `PipelineGradReducer`. That path is
written to MindSpore's documented API and tested for what it assigns, never
executed here (no Ascend/GPU on this machine).
"""
from __future__ import annotations

import mindspore as ms

from migrate.errors import MigrateError
from migrate.parallel.context import needs_auto_parallel
from migrate.parallel.layout import Layout, validate
from migrate.parallel.pipeline import assign_pipeline_stages, build_pipeline_network, pipeline_grad_reducer
from migrate.parallel.strategy import assign_strategies
from migrate.train.launch.cluster import cluster_errors
from migrate.train.step.cells import PreShiftedLMLoss, pipeline_micro_step


def run_layout_of(cfg, dp: int = 1, mp: int = 1, pp: int = 1, micro_batches: int = 1,
                  optimizer_shard: bool = False) -> Layout:
    """The layout of a run: the config's micro batch and accumulation on dp × mp × pp devices."""
    return Layout(dp=dp, mp=mp, pp=pp, micro_batches=micro_batches, optimizer_shard=optimizer_shard,
                  micro_batch_size=cfg.micro_batch_size, grad_accum_steps=cfg.grad_accum_steps)


def layout_errors(layout: Layout, model_config, cfg, cluster=None) -> list[str]:
    """Every rule this run breaks, one line each, in a fixed order; empty when it can start."""
    errors = [_as_option(line) for line in validate(layout, model_config)]
    if errors and any("must be a positive integer" in e for e in errors):
        return errors
    if layout.optimizer_shard and layout.dp < 2:
        errors.append(f"--optimizer-shard needs --dp of at least 2 (it splits the AdamW states over the "
                      f"data-parallel ranks), got --dp {layout.dp}")
    if (layout.mp > 1 or layout.pp > 1) and cfg.checkpoint_interval:
        errors.append(f"checkpoints of tensor/pipeline-parallel runs (--mp {layout.mp}, --pp {layout.pp}) are not "
                      f"implemented; set checkpoint_interval: 0 or use --dp only")
    if cluster is not None:
        errors.extend(cluster_errors(cluster, layout.devices))
    return errors


_OPTIONS = {"dp": "--dp", "mp": "--mp", "pp": "--pp", "micro_batches": "--micro-batches"}


def _as_option(line: str) -> str:
    """Layout messages speak of dp/mp/pp; say which option the user passed."""
    for name, option in _OPTIONS.items():
        if line.startswith(f"{name} must be"):
            return line.replace(name, option, 1)
    return line


def refuse_unsupported(layout: Layout, device_target: str | None = None) -> None:
    """A layout MindSpore cannot run on this device: one MigrateError line (call after validation)."""
    device_target = device_target or ms.get_context("device_target")
    if needs_auto_parallel(layout) and device_target == "CPU":
        asked = [f"--mp {layout.mp}"] * (layout.mp > 1) + [f"--pp {layout.pp}"] * (layout.pp > 1) + \
                ["--optimizer-shard"] * (layout.optimizer_shard and layout.dp > 1)
        raise MigrateError(f"{' '.join(asked)} needs MindSpore's SEMI_AUTO_PARALLEL, which runs only on "
                           f"Ascend/GPU; this MindSpore runs on CPU, where only data parallel (--dp) works")


# ---------- wiring, in each worker ----------
def wire_model_parallel(training, layout: Layout) -> dict:
    """Strategies, stages and the pipeline network for a SEMI_AUTO/AUTO_PARALLEL layout.

    Call after `apply_parallel_context` (the worker's `start_parallel`).
    Returns what was set, for effective_hparams.json and tests; the
    gradient reducer it returns is `PipelineGradReducer` with pp > 1 and
    None otherwise (MindSpore's compiler inserts the reductions).
    """
    model = training.model
    strategies = assign_strategies(model, layout) if layout.mp > 1 else {}
    stages = assign_pipeline_stages(model, layout.pp) if layout.pp > 1 else {}
    reducer = None
    if layout.pp > 1:
        network = build_pipeline_network(PreShiftedLMLoss(model), layout)
        training.micro = pipeline_micro_step(training, layout, network)
        reducer = pipeline_grad_reducer(training.optimizer, layout)
    return {"strategies": strategies, "stages": stages, "micro_step": type(training.micro).__name__,
            "grad_reducer": reducer}


def wire_parallel(training, parallel) -> None:
    """Hook the trainer's live objects to this process's ParallelRun."""
    if needs_auto_parallel(parallel.layout):
        wired = wire_model_parallel(training, parallel.layout)
        parallel.use_reducer(wired["grad_reducer"])
    else:
        parallel.bind(training.optimizer.parameters)
