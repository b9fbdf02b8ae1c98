"""`migrate train`: continued pretraining of a converted model on MindSpore,
step for step what golden/train_torch.py does on the HF model.

    out = train(cfg, out_dir=None, resume=None, progress=True,
                mode="graph", faults=(), peak_flops=None, log=None)

The run is a recipe (`MindSporeRecipe`): `setup` builds every live object and the run log,
`resume` loads a checkpoint into them, `step` runs one optimizer step and returns its
record, `save` writes a checkpoint, `train` is the loop. The step record, its log line, the
eval and checkpoint cadence, the checkpoint state keys and the resume checks are the run
protocol's (`migrate.run_protocol`), the very ones golden/train_torch.py uses.

Per optimizer step s (1-based), exactly as the golden script:
  * lr = lr_at(s' ) with s' the scheduler position (optimizer steps taken; an
    fp16 step skipped for overflow does not advance it);
  * micro-batch m reads rows run_order[s-1, m] through MindDataset
    (`migrate.train.ms_data`); the model reads row[:-1], the targets are
    row[1:], the loss is HF's mean token cross-entropy on fp32 logits;
  * gradients of loss / grad_accum_steps (times the loss scale in fp16) are
    summed over the micro-batches into the micro-step's accumulators (`MicroStep`,
    its `loss_divisor`);
  * fp16: unscale, then skip the step on inf/nan (GradScaler semantics,
    `precision.DynamicLossScaler`);
  * clip_grad_norm_ semantics (`optim.GradClipper`; the pre-clip norm is
    logged), then torch-semantics AdamW (`optim.AdamW`) over HF Trainer's
    decay / no-decay groups carried through the keymap. The step runs as one
    graph where nothing on the host can intervene, else as micro-step graphs
    and two graphs around the host's decision (`optimizer_step.step_graphs`).

Precision: fp32; bf16/fp16 as torch.autocast over fp32 weights
(`precision.autocast_model`), so the parameters are the fp32 master weights.
`cfg.recompute` calls `Cell.recompute()` on every decoder layer.

Writes to the output folder (default cfg.out_dir.ms):
  metrics.jsonl   one line per optimizer step with the golden's keys -- step,
                  loss (mean of the micro-batch losses), lr, grad_norm (pre-clip
                  total norm; null when not finite), grad_norm_clipped (total
                  norm of the gradients the optimizer stepped with, measured
                  after clipping), tokens (target tokens so far), time
                  (seconds since the run started, carried across a resume)
                  -- plus tokens_per_s (this step's tokens / its wall
                  time) and mfu; fp16 adds loss_scale (the scale this step
                  used) and skipped; a step the health watch flags adds health
                  (its event kinds), and skipped where the policy skipped it;
                  with profile=True the step-time breakdown, time_*_s
                  (`migrate.train.step.profile`)
  effective_hparams.json  read back from the live MindSpore objects
  health.jsonl, health_batches/  the health watch's events (`migrate.train.health.watch`,
                  `migrate.train.health.log`), decided as the golden script decides
  events.out.tfevents.*  TensorBoard scalars (`migrate.train.tensorboard`)
  eval.jsonl      when eval_interval is set (as the golden script)
  checkpoints/checkpoint-N/, checkpoints/latest   when checkpoint_interval is
                  set (layout in `migrate.train.checkpoint.folder`)

MFU = flops_per_token * tokens_per_s / peak_flops, flops_per_token = 6 * N +
12 * layers * seq_length * (heads * head_dim) (PaLM's estimate; N = the
parameters that take part in matmuls: all but the input embedding table,
which counts once when tied as the LM head, and the norms; computed from the
family's anatomy, `migrate.models.anatomy`). Recompute is not counted (it is
model FLOPs utilisation). The peak (`migrate.run_protocol.throughput`) is the `peak_flops` argument, else run.yaml's
`peak_flops`; with neither it is measured at start as
the best fp32 matmul throughput of MindSpore on this device (2 * 1024^3 flops
per call) -- on a CPU an achievable-peak estimate, not a datasheet figure;
pass the datasheet number for accelerators. The figure used and its source go
to effective_hparams.json.

Faults (`migrate.train.knob_faults`) change one live object each, for tests of
`migrate hparams` and `migrate compare`.

Several processes (`parallel`, a `migrate.parallel.runtime.ParallelRun`, set
up by `migrate.train.launch.worker` under msrun): rank r reads its share of every
global micro-batch (`ms_data.micro_batches(shard=...)`), the accumulated
gradients go through MindSpore's DistributedGradReducer (mean over dp) once
per optimizer step, the logged loss is the mean over ranks and the tokens are
the global count, so metrics.jsonl reads as the single-process run with the
same global batch does. Rank 0 alone writes the run folder. Tensor/pipeline
parallel layouts are wired by `migrate.train.parallel_setup` (Ascend/GPU).
"""
from __future__ import annotations

import contextlib
import json
import math
import random
import sys
import time
from pathlib import Path

import mindspore as ms
import numpy as np
from mindspore import Tensor

from migrate.checkpoints.atomic import atomic_write_text
from migrate.errors import MigrateError
from migrate.models.mode import MODES, execution_mode
from migrate.models.registry import load_model_config
from migrate.parallel.context import needs_auto_parallel
from migrate.parallel.layout import Layout
from migrate.run_protocol import state as run_state
from migrate.run_protocol.cadence import checkpoint_due, eval_due
from migrate.run_protocol.inputs import check_vocab, eval_rows
from migrate.run_protocol.record import finite, step_record
from migrate.run_protocol.state import Position
from migrate.run_protocol.throughput import peak_basis
from migrate.train.building import (
    MSTraining,
    build_training,
    checkpoint_names,
    effective_hparams,
    flops_per_token,
    measure_peak_flops,
)
from migrate.train.checkpoint.folder import (
    open_checkpoint,
    remove_partials,
    rng_state,
    save_checkpoint,
    set_rng_state,
    shard_staging_dir,
)
from migrate.train.checkpoint.shards import layout_record, slice_table, write_optimizer_shard
from migrate.train.config import RunConfig
from migrate.train.health.watch import StepFacts
from migrate.train.knob_faults import check_faults, faults_at
from migrate.train.lora_run import check_checkpoint_base
from migrate.train.ms_data import micro_batches, training_order
from migrate.train.parallel_setup import wire_parallel
from migrate.train.run_log import RunLog
from migrate.train.step import reuse
from migrate.train.step.cells import PreShiftedLMLoss
from migrate.train.step.faults import parse_step_faults
from migrate.train.step.optimizer import step_graphs
from migrate.train.step.profile import format_breakdown, profile_for

F32 = ms.float32
PEAK_MEASURED = "measured: best fp32 MatMul 1024x1024x1024 on this device (achievable peak, not a datasheet)"
PEAK_UNMEASURED = "not measured on this rank (rank 0 logs MFU)"


# ---------- the run ----------
def train(cfg: RunConfig, out_dir: str | Path | None = None, resume: str | Path | None = None, progress: bool = True,
          *, mode: str = "graph", faults=(), peak_flops: float | None = None, log=None,
          stop_after: int | None = None, parallel=None, step_faults=(), profile: bool = False,
          trust: bool = False) -> Path:
    """Train on MindSpore; returns the output folder.

    resume: a checkpoint folder, or a run folder (its `latest`); the run goes on
    exactly where that checkpoint left off. mode: "graph" (default) or
    "pynative". faults: names from `migrate.train.knob_faults.TRAIN_FAULTS`.
    peak_flops: the MFU denominator (None: the config's peak_flops, else measured;
    see the module docstring).
    log: called with one text line per step. stop_after: end the loop after
    this optimizer step (1-based) as if interrupted -- the schedule still
    spans total_steps; no checkpoint is forced. parallel: this process's
    `ParallelRun` in a multi-process run (None: one process). step_faults:
    `migrate.train.step.faults` specs, applied where the golden script applies them.
    The health policy `stop` raises `health_log.HealthStop` (exit code 3).
    profile: time each step's phases behind synchronised calls (`migrate.train.step.profile`),
    log them as time_*_s fields and print the breakdown table at the end; off, nothing changes.
    trust: the converted folder's model class may be imported even if migrate does not bundle it
    (`--trust-model-class`; the run's plan carries it, `building.resolve_plan`).
    """
    if mode not in MODES:
        raise MigrateError(f"unknown mode {mode!r}; use graph or pynative")
    recipe = MindSporeRecipe(cfg, out_dir, mode=mode, faults=faults, peak_flops=peak_flops, log=log,
                             parallel=parallel, step_faults=step_faults, profile=profile, trust=trust)
    with execution_mode(mode):
        return recipe.train(resume, stop_after=stop_after, progress=progress)


class MindSporeRecipe:
    """One MindSpore training run: setup / resume / step / save, and the loop over them (`train`)."""

    def __init__(self, cfg: RunConfig, out_dir=None, *, mode: str = "graph", faults=(), peak_flops=None, log=None,
                 parallel=None, step_faults=(), profile: bool = False, trust: bool = False, observe=None):
        self.cfg, self.mode, self.parallel, self.profile = cfg, mode, parallel, profile
        self.observe = observe  # `migrate replay`: told what each step computes (`optimizer_step.SplitSteps`)
        self.trust = trust  # `--trust-model-class`, until `build_training` puts it on the run's plan
        self.faults = check_faults(faults)
        self.step_faults = parse_step_faults(step_faults)
        self.peak_flops = peak_flops
        self.log = log or (lambda line: None)
        self.health_echo = log or _echo_stderr  # health events are shown even without a step log
        self.out = Path(out_dir) if out_dir is not None else cfg.out_dir.ms
        self.layout = run_layout(cfg, parallel)
        self.writer = parallel is None or parallel.is_writer  # rank 0 alone writes the run folder
        self.position = Position()

    # ---------- setup ----------
    def setup(self, resume=None) -> None:
        """Check the inputs, build every live object (resumed from `resume` when given) and the run log."""
        cfg, layout, parallel = self.cfg, self.layout, self.parallel
        if self.writer:
            self.out.mkdir(parents=True, exist_ok=True)
        # Under pp, one trainer micro-step feeds the Pipeline micro_batches micro-batches at once.
        data_cfg = cfg if layout.pp == 1 else cfg.replace(micro_batch_size=cfg.micro_batch_size * layout.micro_batches)
        self.order = training_order(data_cfg, layout.dp)
        check_vocab(cfg.data, load_model_config(Path(cfg.require("ms_model")) / "model.yaml", self.trust).vocab_size,
                    cfg.ms_model)
        checkpoint = open_checkpoint(resume) if resume is not None else None
        if checkpoint is not None:
            check_resumable(checkpoint, cfg, self.faults, layout)
        if self.writer:
            remove_partials(self.out)  # a killed run's half-written checkpoint
        _seed_everything(cfg.seed)
        first = (checkpoint.step if checkpoint is not None else 0) + 1
        training = build_training(cfg, faults_at(self.faults, first), trust=self.trust)
        if parallel is not None:
            wire_parallel(training, parallel)
        # After wire_parallel: pp swaps the micro-step. One graph per step where no host decision can intervene;
        # graphs this process compiled for an earlier run like this one are reused when it keeps them (`reuse`).
        self.training, self.graphs = self._adopt(training)
        training = self.training
        previous = self.resume(checkpoint) if checkpoint is not None else []
        measure = measure_peak_flops if self.writer else None
        self.peak = peak_basis(flops_per_token(training.model_config, cfg.seq_length), given=self.peak_flops,
                               config_peak=cfg.peak_flops, measure=measure, measured_source=PEAK_MEASURED,
                               unmeasured=PEAK_UNMEASURED)
        out = self.out if self.writer else None
        if out is not None:
            self._write_hparams(training)
        self.eval_rows = eval_rows(cfg) if self.writer else None
        self.run_log = RunLog(out, cfg, echo=self.log, health_echo=self.health_echo, start=self.position.step,
                              previous=previous)
        self.eval_step = PreShiftedLMLoss(training.model) if self.eval_rows is not None else None
        self.batches = micro_batches(data_cfg, self.position.step, self.order,
                                     shard=parallel.data_shard if parallel is not None else (1, 0))
        # Measurement only; off: no sync, no fields. A CPU graph call returns when it is done (measured).
        self.prof = profile_for(self.profile, None if ms.get_context("device_target") == "CPU"
                                else ms.runtime.synchronize)
        self.run_start = time.perf_counter() - self.position.elapsed

    def _write_hparams(self, training, from_step: int | None = None) -> None:
        """effective_hparams.json, read back from `training`'s live objects; from_step: they were rebuilt
        before that step (a fault starting there), and the file says what they do from then on."""
        hparams = effective_hparams(training, self.peak)
        hparams["faults"] = list(self.faults)  # with the step each starts at (NAME@STEP)
        if from_step is not None:
            hparams["live_from_step"] = from_step
        if self.parallel is not None:
            hparams["parallel"] = self.parallel.describe()
        atomic_write_text(self.out / "effective_hparams.json", json.dumps(hparams, indent=2) + "\n")

    def _adopt(self, training, held=None) -> tuple:
        """(training, its step graphs): `training`'s own, or compiled ones that take its values
        (`reuse.adopt`: `held`, this run's before a fault rebuilt its objects, or a kept run's). Not
        under several processes or the profiler (their graphs hold more than the run's state)."""
        graphs = step_graphs(training, self.observe, parallel=self.parallel,
                             poisons=bool(self.step_faults.steps.get("nan_grad")), profile=self.profile)
        if self.parallel is not None or self.profile or self.mode != "graph":
            return training, graphs
        return reuse.adopt(training, graphs, held)

    def faults_from(self, step: int) -> None:
        """Before optimizer step `step` (1-based): a fault that starts there (NAME@STEP) rebuilds the
        live objects with it on, carrying parameters, moments, step count and loss scale over."""
        wanted = faults_at(self.faults, step)
        old = self.training
        if wanted == old.faults:
            return
        parallel = self.parallel
        if parallel is not None and needs_auto_parallel(parallel.layout):
            raise MigrateError("a training fault that starts at a later step runs in one process or under --dp")
        new = build_training(self.cfg, wanted, model=old.model, model_config=old.model_config, trust=self.trust)
        new.optimizer.load_state_dict(old.optimizer.state_dict())
        if old.scaler is not None:
            new.scaler.load_state_dict(old.scaler.state_dict())
        if parallel is not None:  # data parallel: a reducer over the new optimizer's (the same) parameters
            wire_parallel(new, parallel)
        # A fault that changes graph inputs only (beta2, eps, lr, clip epsilon) runs on the graphs compiled.
        self.training, self.graphs = self._adopt(new, held=(old, self.graphs))
        if self.writer and self.out is not None:  # what the live objects do now (compare reads it)
            self._write_hparams(self.training, from_step=step)

    def resume(self, checkpoint) -> list[str]:
        """Load `checkpoint` into the live objects and the position; returns its metrics lines."""
        training = self.training
        model_name = {saved: own for own, saved in checkpoint_names(training).items()}
        params = {model_name.get(name, name): value for name, value in checkpoint.parameters().items()}
        not_loaded, unused = ms.load_param_into_net(training.model, params, strict_load=True)
        if training.lora is not None:  # the frozen base comes from ms_model, the checkpoint holds the adapters
            check_checkpoint_base(checkpoint.lora or {}, training.lora, checkpoint.path)
            adapters = {p.name for p in training.lora.parameters(training.model)}
            not_loaded = [name for name in not_loaded if name in adapters]
        if not_loaded or unused:
            raise MigrateError(f"checkpoint {checkpoint.path} does not fit the model: "
                               f"{len(not_loaded)} parameters not loaded, {len(unused)} entries unused")
        training.optimizer.load_state_dict(checkpoint.optimizer_state())
        state = checkpoint.state
        if training.scaler is not None:
            training.scaler.load_state_dict(state[run_state.LOSS_SCALE])
        self.position = Position.from_state(state)
        self.position.step = checkpoint.step
        set_rng_state(state[run_state.RNG])
        return checkpoint.metrics_text.splitlines(keepends=True)

    # ---------- one optimizer step ----------
    def step(self, step: int):
        """Optimizer step step + 1: accumulate, reduce, clip, decide, step. Returns (record, health verdict)."""
        training, graphs, prof, pos = self.training, self.graphs, self.prof, self.position
        scaler, parallel = training.scaler, self.parallel
        step_start = time.perf_counter()
        prof.begin()
        lr = training.schedule.lr(pos.scheduler_step) * self.step_faults.lr_factor(step + 1)
        training.optimizer.set_lr(lr)
        scale = scaler.scale if scaler is not None else 1.0
        with prof.phase("data"):
            batch = self._batch(step)
        with prof.phase("fwd_bwd"):
            losses = graphs.forward_backward(batch, Tensor(np.float32(scale)))
        step_tokens = sum(int(rows[:, 1:].size) for rows in batch) * self.layout.dp  # every dp rank reads as many
        pos.tokens += step_tokens
        loss = sum(losses) / len(losses)
        if parallel is not None:
            with prof.phase("reduce"):
                graphs.reduce_grads(parallel.reduce_grads)
                loss = parallel.mean_over_ranks(loss)
        if self.step_faults.poison_grad(step + 1):  # before unscaling, as the golden: fp16's scaler sees it
            graphs.poison_grad()
        with prof.phase("clip"):
            norm = graphs.measure(scaler.inv_scale if scaler is not None else 1.0)
            all_finite = graphs.all_finite(norm) if scaler is not None else math.isfinite(norm)
        loss_scale = scale if scaler is not None else None
        verdict = self.run_log.health.step(StepFacts(step + 1, finite(loss), finite(norm), lr, loss_scale),
                                           losses, self.order[step])
        # fp16 overflow, or the health policy skips (or stops at) this step: no optimizer, no scheduler step
        skipped = (scaler is not None and not all_finite) or verdict.action != "continue"
        with prof.phase("optimizer"):
            clipped_norm = graphs.finish(apply=not skipped)  # skipped: the clipped norm alone
        if not skipped:
            pos.scheduler_step += 1
        if scaler is not None:
            scaler.update(found_inf=not all_finite)
        pos.step = step + 1
        now = time.perf_counter()
        record = step_record(step + 1, loss, lr, norm, clipped_norm, tokens=pos.tokens, step_tokens=step_tokens,
                             step_seconds=now - step_start, run_seconds=now - self.run_start,
                             flops_per_token=self.peak["flops_per_token"], peak_flops=self.peak["peak_flops"],
                             loss_scale=loss_scale, skipped=skipped, health=[e.kind for e in verdict.events],
                             extra=[prof.end(now - step_start)])
        return record, verdict

    def _batch(self, step: int) -> list:
        batch = []
        for micro in range(self.cfg.grad_accum_steps):
            s, m, rows = next(self.batches)
            if (s, m) != (step, micro):  # the pipeline and the loop must never part
                raise MigrateError(f"data pipeline at step {s + 1} micro {m}, trainer at {step + 1} {micro}")
            batch.append(rows)
        return batch

    # ---------- eval and checkpoints ----------
    def evaluate(self, step: int) -> None:
        """Mean loss over the eval rows in file order, micro_batch_size at a time (as the golden script)."""
        model, rows, size = self.training.model, self.eval_rows, self.cfg.micro_batch_size
        model.set_train(False)
        total = 0.0
        for start in range(0, len(rows), size):
            batch = np.asarray(rows[start:start + size], dtype=np.int32)
            loss = self.eval_step(Tensor(np.ascontiguousarray(batch[:, :-1])),
                                  Tensor(np.ascontiguousarray(batch[:, 1:])))
            total += float(loss.asnumpy()) * len(batch)
        model.set_train(True)
        self.run_log.eval(step, total / len(rows), len(rows))

    def save(self, step: int) -> None:
        """Checkpoint after `step`: rank 0 writes it; with optimizer sharding every rank first writes its shard."""
        training, parallel, cfg = self.training, self.parallel, self.cfg
        state = run_state.run_state(self.position, elapsed=time.perf_counter() - self.run_start,
                                    loss_scale=training.scaler.state_dict() if training.scaler is not None else None,
                                    global_batch=self.layout.global_batch, rng=rng_state(), faults=self.faults,
                                    keymap=training.keymap.name, mode=self.mode, config=cfg.to_dict(),
                                    layout=self.layout)
        layout_file, staging = None, None
        if parallel is not None:
            layout_file = layout_record(parallel.layout, parallel.size)
            if layout_file["optimizer_shard"]:
                staging = self._write_optimizer_shard(step)
                layout_file["optimizer_slices"] = slice_table(self._moment_shapes(), parallel.layout.dp)
                parallel.barrier()  # every shard file is in place before rank 0 assembles the folder
        if self.writer:
            save_checkpoint(self.out, step, model=training.model, model_config=training.model_config,
                            optimizer=training.optimizer, state=state, metrics_text=self.run_log.metrics.text,
                            sidecar_src=cfg.ms_model, keep=cfg.keep_checkpoints, parallel_layout=layout_file,
                            shard_staging=staging, param_names=checkpoint_names(training),
                            **_lora_content(training, cfg))

    def _moment_shapes(self) -> dict:
        optimizer = self.training.optimizer
        return {p.name: tuple(q.shape) for p, q in zip((*optimizer.exp_avg, *optimizer.exp_avg_sq),
                                                       (*optimizer.parameters, *optimizer.parameters), strict=True)}

    def _write_optimizer_shard(self, step: int) -> Path:
        optimizer, parallel = self.training.optimizer, self.parallel
        moments = {p.name: p.asnumpy() for p in (*optimizer.exp_avg, *optimizer.exp_avg_sq)}
        staging = shard_staging_dir(self.out, step)
        write_optimizer_shard(staging, parallel.rank, parallel.layout.dp, moments, self._moment_shapes())
        return staging

    # ---------- the loop ----------
    def train(self, resume=None, *, stop_after: int | None = None, progress: bool = True) -> Path:
        """setup, then step / log / eval / save to total_steps (or stop_after); returns the run folder."""
        cfg = self.cfg
        self.setup(resume)
        last = cfg.total_steps if stop_after is None else min(cfg.total_steps, stop_after)
        with _progress_bar(progress and self.writer, cfg.total_steps, self.position.step) as bar, \
                contextlib.closing(self.run_log), _released(self):
            for step in range(self.position.step, last):
                self.faults_from(step + 1)
                record, verdict = self.step(step)
                self.run_log.step(record, verdict)
                bar(step + 1, record)
                self.run_log.health.stop_if(verdict)
                if self.eval_rows is not None and eval_due(cfg, step + 1):
                    self.evaluate(step + 1)
                if checkpoint_due(cfg, step + 1):
                    self.save(step + 1)
        if self.profile and self.writer:
            self.health_echo(format_breakdown(self.run_log.metrics.records(), "MindSpore trainer step time"))
        return self.out


@contextlib.contextmanager
def _released(recipe):
    """When the loop ends (or fails), the run's compiled graphs may serve a later run (`reuse.release`)."""
    try:
        yield
    finally:
        reuse.release(recipe.training)


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    ms.set_seed(seed)


def run_layout(cfg: RunConfig, parallel=None) -> Layout:
    """The run's layout: the parallel one, or one process with the config's batch."""
    if parallel is not None:
        return parallel.layout
    return Layout(micro_batch_size=cfg.micro_batch_size, grad_accum_steps=cfg.grad_accum_steps)


def _echo_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _lora_content(training: MSTraining, cfg: RunConfig) -> dict:
    """A LoRA run checkpoints its adapters and lora.json, not the frozen base."""
    if training.lora is None:
        return {}
    return {"adapters": training.lora.parameters(training.model),
            "lora_record": training.lora.checkpoint_record(cfg.ms_model)}


def check_resumable(checkpoint, cfg: RunConfig, faults, layout: Layout | None = None) -> None:
    """Refuse a resume that would not continue the same curve (one MigrateError line;
    `migrate.run_protocol.state.check_resumable`)."""
    run_state.check_resumable(checkpoint, cfg.to_dict(), faults, layout or run_layout(cfg), cfg.total_steps)


@contextlib.contextmanager
def _progress_bar(enabled: bool, total: int, done: int):
    """update(step, record); a rich bar on a terminal's stderr, nothing otherwise."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    err = Console(stderr=True)
    if not enabled or not err.is_terminal or not sys.stderr.isatty():
        yield lambda step, record: None
        return
    columns = (TextColumn("train"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
               TimeElapsedColumn(), TimeRemainingColumn())
    with Progress(*columns, console=err) as bar:
        task = bar.add_task("", total=total, completed=done, info="")

        def update(step: int, record: dict) -> None:
            loss = record["loss"]
            info = (f"loss {loss:.4f}" if loss is not None else "loss nan") + \
                   f" lr {record['lr']:.2e} {record['tokens_per_s']:.0f} tok/s"
            bar.update(task, completed=step, info=info)

        yield update
