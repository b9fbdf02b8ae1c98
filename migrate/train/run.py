"""`migrate train` as a library call: check the layout and the cluster before anything
starts, then train in this process (one device) or through msrun (several).

    out = run_training("run.yaml", dp=2, echo=print)     # the run folder

Every broken layout rule is one line of the MigrateError; a distributed run that fails
raises `RunFailed` carrying the failed rank's exit code and its one-line account.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from migrate.checkpoints.output_guard import check_apart
from migrate.errors import MigrateError, MigrateErrors
from migrate.resources import need_memory
from migrate.train.building import trainable_model_config
from migrate.train.checkpoint.folder import open_checkpoint
from migrate.train.config import RunConfig
from migrate.train.knob_faults import check_faults
from migrate.train.launch.cluster import Cluster
from migrate.train.launch.msrun import PROCESS_FLOOR, launch
from migrate.train.parallel_setup import layout_errors, refuse_unsupported, run_layout_of
from migrate.train.step.faults import parse_step_faults
from migrate.train.trainer import check_resumable, train


class RunFailed(MigrateError):
    """A worker of a distributed run failed: the run exits with that worker's code."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


def run_training(config: str | Path, *, out: str | Path | None = None, resume: str | Path | None = None,
                 mode: str = "graph", dp: int = 1, mp: int = 1, pp: int = 1, micro_batches: int = 1,
                 optimizer_shard: bool = False, cluster: Cluster = Cluster(),
                 echo: Callable[[str], None] = print, step_faults=(), profile: bool = False,
                 trust: bool = False, faults=()) -> Path:
    """Train the run.yaml at `config`; returns the run folder. `echo` gets the batch line
    and, with several processes, rank 0's progress lines. profile: the step-time breakdown
    (`migrate.train.step.profile`), logged and printed at the end. trust: the converted folder's
    model class may be imported even if migrate does not bundle it (`--trust-model-class`); msrun's
    workers get it through the environment their launcher builds (`launch`). faults: injected porting
    faults (`migrate.train.knob_faults`, NAME or NAME@STEP), for rehearsing compare and replay."""
    cfg = RunConfig.load(config)
    if out is not None:  # the run folder never is, holds or lies inside what the run reads
        check_apart(out, (config, cfg.data, cfg.eval_data, cfg.hf_model, cfg.ms_model, cfg.out_dir.golden))
    layout = run_layout_of(cfg, dp, mp, pp, micro_batches, optimizer_shard)
    errors = layout_errors(layout, trainable_model_config(cfg.require("ms_model"), trust), cfg, cluster)
    if cfg.lora is not None and (layout.mp > 1 or layout.pp > 1):
        errors.append("a LoRA run trains with data parallelism only (--dp): --mp/--pp shard the kernels the "
                      "adapters wrap")
    step_faults = parse_step_faults(step_faults, cfg.total_steps)  # a step past the run's end: one line now
    if step_faults.steps and (layout.devices > 1 or cluster.nodes > 1):
        errors.append("--step-fault rehearses the health watch in one process; drop --dp/--mp/--pp/--nodes")
    faults = check_faults(faults)
    if faults and (layout.mp > 1 or layout.pp > 1 or cluster.nodes > 1):  # --dp: each rank injects it
        errors.append("--fault injects a porting fault in one process or under --dp; drop --mp/--pp/--nodes")
    if errors:
        raise MigrateErrors(errors)  # one line per broken rule
    out_dir = Path(out) if out is not None else cfg.out_dir.ms
    echo(layout.batch_line(cfg.seq_length))
    refuse_unsupported(layout)
    local = layout.devices // max(cluster.nodes, 1)
    if local > 1:  # msrun forks one MindSpore process per local rank: --dp 10**12 forked until the OOM killer came
        need_memory(local * PROCESS_FLOOR, f"--dp × --mp × --pp = {layout.devices:,} ranks ({local:,} MindSpore "
                                           f"processes here, {PROCESS_FLOOR >> 20} MiB each before the model)")
    if resume is not None:
        check_resumable(open_checkpoint(resume), cfg, faults, layout)  # before any process starts
    if layout.devices == 1 and cluster.nodes == 1:
        return train(cfg, out_dir=out_dir, resume=resume, mode=mode, step_faults=step_faults, profile=profile,
                     trust=trust, faults=faults)
    result = launch(cfg.source, out_dir, layout, cluster, resume=resume, mode=mode, echo=echo, profile=profile,
                    trust=trust, faults=faults)
    if result.code != 0:
        raise RunFailed(f"distributed run failed: {result.summary()}", result.code)
    return out_dir
