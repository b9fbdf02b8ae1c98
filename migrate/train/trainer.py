"""`migrate train`: continued pretraining of a converted model on MindSpore,
step for step what golden/train_torch.py does on the HF model.

    out = train(cfg, out_dir=None, resume=None, progress=True,
                mode="graph", faults=(), peak_flops=None, log=None)

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
                  (`migrate.train.step_profile`)
  effective_hparams.json  read back from the live MindSpore objects
  health.jsonl, health_batches/  the health watch's events (`migrate.train.health`,
                  `migrate.train.health_log`), decided as the golden script decides
  events.out.tfevents.*  TensorBoard scalars (`migrate.train.tensorboard`)
  eval.jsonl      when eval_interval is set (as the golden script)
  checkpoints/checkpoint-N/, checkpoints/latest   when checkpoint_interval is
                  set (layout in `migrate.train.ckpt`)

MFU = flops_per_token * tokens_per_s / peak_flops, flops_per_token = 6 * N +
12 * layers * seq_length * (heads * head_dim) (PaLM's estimate; N = the
parameters that take part in matmuls: all but the input embedding table,
which counts once when tied as the LM head, and the norms; computed from the
family's anatomy, `migrate.models.anatomy`). Recompute is not counted (it is
model FLOPs utilisation). The peak is the `peak_flops` argument, else run.yaml's
`peak_flops`; with neither it is measured at start as
the best fp32 matmul throughput of MindSpore on this device (2 * 1024^3 flops
per call) -- on a CPU an achievable-peak estimate, not a datasheet figure;
pass the datasheet number for accelerators. The figure used and its source go
to effective_hparams.json.

Faults (`migrate.train.knob_faults`) change one live object each, for tests of
`migrate hparams` and `migrate compare`.

Several processes (`parallel`, a `migrate.parallel.runtime.ParallelRun`, set
up by `migrate.train.worker` under msrun): rank r reads its share of every
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
import os
import random
import sys
import time
from pathlib import Path

import mindspore as ms
import numpy as np
from mindspore import Tensor

from migrate.checkpoints.integrity import STATE_FILE
from migrate.data.samples import load_samples, read_meta
from migrate.errors import MigrateError
from migrate.models.registry import load_model_config
from migrate.parallel.layout import Layout
from migrate.train.building import (MSTraining, build_training, checkpoint_names, effective_hparams,
                                    flops_per_token, measure_peak_flops)
from migrate.train.ckpt import (open_checkpoint, remove_partials, rng_state, save_checkpoint, set_rng_state,
                                shard_staging_dir)
from migrate.train.ckpt_files import RNG_FILE
from migrate.train.config import RunConfig
from migrate.train.dist_ckpt import layout_record, slice_table, write_optimizer_shard
from migrate.train.knob_faults import check_faults
from migrate.train.health import HealthWatch, StepFacts
from migrate.train.health_log import HealthLog, replay
from migrate.train.lora_run import check_checkpoint_base
from migrate.train.ms_data import micro_batches, training_order
from migrate.train.optimizer_step import step_graphs
from migrate.train.parallel_setup import wire_parallel
from migrate.train.step_faults import parse_step_faults
from migrate.train.step_profile import format_breakdown, profile_for
from migrate.train.steps import PreShiftedLMLoss
from migrate.train.tensorboard import RunBoard

F32 = ms.float32
MODES = {"graph": ms.GRAPH_MODE, "pynative": ms.PYNATIVE_MODE}
# Keys of the resumed run's config that may differ from the checkpoint's.
RESUME_FREE = {"checkpoint_interval", "keep_checkpoints", "out_dir", "eval_data", "eval_interval", "eval_samples",
               "peak_flops", "health", "tensorboard"}


# ---------- the run ----------
def train(cfg: RunConfig, out_dir: str | Path | None = None, resume: str | Path | None = None, progress: bool = True,
          *, mode: str = "graph", faults=(), peak_flops: float | None = None, log=None,
          stop_after: int | None = None, parallel=None, step_faults=(), profile: bool = False) -> Path:
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
    `migrate.train.step_faults` specs, applied where the golden script applies them.
    The health policy `stop` raises `health_log.HealthStop` (exit code 3).
    profile: time each step's phases behind synchronised calls (`migrate.train.step_profile`),
    log them as time_*_s fields and print the breakdown table at the end; off, nothing changes.
    """
    if mode not in MODES:
        raise MigrateError(f"unknown mode {mode!r}; use graph or pynative")
    faults = check_faults(faults)
    step_faults = parse_step_faults(step_faults)
    health_echo = log or _echo_stderr  # health events are shown even without a step log
    out = Path(out_dir) if out_dir is not None else cfg.out_dir.ms
    previous_mode = ms.get_context("mode")
    ms.set_context(mode=MODES[mode])
    try:
        return _train(cfg, out, resume, progress, mode, faults, peak_flops, log or (lambda line: None), stop_after,
                      parallel, step_faults, health_echo, profile)
    finally:
        ms.set_context(mode=previous_mode)


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


def _train(cfg, out, resume, progress, mode, faults, peak_flops, log, stop_after, parallel, step_faults,
           health_echo, profile=False) -> Path:
    layout = run_layout(cfg, parallel)
    writer = parallel is None or parallel.is_writer  # rank 0 alone writes the run folder
    if writer:
        out.mkdir(parents=True, exist_ok=True)
    # Under pp, one trainer micro-step feeds the Pipeline micro_batches micro-batches at once.
    data_cfg = cfg if layout.pp == 1 else cfg.replace(micro_batch_size=cfg.micro_batch_size * layout.micro_batches)
    order = training_order(data_cfg, layout.dp)
    _check_vocab(cfg)
    checkpoint = open_checkpoint(resume) if resume is not None else None
    if checkpoint is not None:
        check_resumable(checkpoint, cfg, faults, layout)
    if writer:
        remove_partials(out)  # a killed run's half-written checkpoint
    _seed_everything(cfg.seed)
    training = build_training(cfg, faults)
    model, optimizer, scaler = training.model, training.optimizer, training.scaler
    if parallel is not None:
        wire_parallel(training, parallel)

    start, sched_pos, tokens, elapsed0 = 0, 0, 0, 0.0
    metrics_lines: list[str] = []
    if checkpoint is not None:
        model_name = {saved: own for own, saved in checkpoint_names(training).items()}
        params = {model_name.get(name, name): value for name, value in checkpoint.parameters().items()}
        not_loaded, unused = ms.load_param_into_net(model, params, strict_load=True)
        if training.lora is not None:  # the frozen base comes from ms_model, the checkpoint holds the adapters
            check_checkpoint_base(checkpoint.lora or {}, training.lora, checkpoint.path)
            adapters = {p.name for p in training.lora.parameters(model)}
            not_loaded = [name for name in not_loaded if name in adapters]
        if not_loaded or unused:
            raise MigrateError(f"checkpoint {checkpoint.path} does not fit the model: "
                               f"{len(not_loaded)} parameters not loaded, {len(unused)} entries unused")
        optimizer.load_state_dict(checkpoint.optimizer_state())
        st = checkpoint.state
        if scaler is not None:
            scaler.load_state_dict(st["loss_scale"])
        start, sched_pos, tokens = checkpoint.step, int(st["scheduler_step"]), int(st["tokens"])
        elapsed0 = float(st["elapsed"])
        set_rng_state(st["rng"])
        metrics_lines = checkpoint.metrics_text.splitlines(keepends=True)

    peak_source = "given"
    if peak_flops is None and cfg.peak_flops is not None:
        peak_flops, peak_source = cfg.peak_flops, "run config (peak_flops)"
    if peak_flops is None and not writer:
        peak = {"peak_flops": 1.0, "source": "not measured on this rank (rank 0 logs MFU)"}
    elif peak_flops is None:
        peak = {"peak_flops": measure_peak_flops(), "source": "measured: best fp32 MatMul 1024x1024x1024 "
                                                                "on this device (achievable peak, not a datasheet)"}
    else:
        peak = {"peak_flops": float(peak_flops), "source": peak_source}
    fpt = flops_per_token(training.model_config, cfg.seq_length)
    peak["flops_per_token"] = fpt
    peak["mfu"] = "flops_per_token * tokens_per_s / peak_flops"
    eval_rows = _eval_rows(cfg) if writer else None
    eval_path = out / "eval.jsonl"
    metrics_path = out / "metrics.jsonl"
    if writer:
        hparams = effective_hparams(training, peak)
        if parallel is not None:
            hparams["parallel"] = parallel.describe()
        (out / "effective_hparams.json").write_text(json.dumps(hparams, indent=2) + "\n")
        _truncate_jsonl(eval_path, start)
        metrics_path.write_text("".join(metrics_lines))

    watch = HealthWatch.for_run(cfg)
    replay(watch, [json.loads(line) for line in metrics_lines if line.strip()])  # a resume: the same statistics
    health = HealthLog(watch, out if writer else None, cfg.data, cfg.seq_length,
                       health_echo if writer else (lambda line: None), start_step=start)
    board = RunBoard(out if writer and cfg.tensorboard else None, start)
    # After wire_parallel: pp swaps the micro-step. One graph per step where no host decision can intervene.
    graphs = step_graphs(training, parallel=parallel, poisons=bool(step_faults.steps.get("nan_grad")), profile=profile)
    eval_step = PreShiftedLMLoss(model) if eval_rows is not None else None
    batches = micro_batches(data_cfg, start, order, shard=parallel.data_shard if parallel is not None else (1, 0))
    # Measurement only; off: no sync, no fields. A CPU graph call returns when it is done (measured).
    prof = profile_for(profile, None if ms.get_context("device_target") == "CPU" else ms.runtime.synchronize)
    run_start = time.perf_counter() - elapsed0
    sink = metrics_path if writer else os.devnull  # rank 0 alone writes the metrics
    with open(sink, "a") as metrics, _progress_bar(progress and writer, cfg.total_steps, start) as bar, \
            contextlib.closing(board):
        last = cfg.total_steps if stop_after is None else min(cfg.total_steps, stop_after)
        for step in range(start, last):
            step_start = time.perf_counter()
            prof.begin()
            lr = training.schedule.lr(sched_pos) * step_faults.lr_factor(step + 1)
            optimizer.set_lr(lr)
            scale = scaler.scale if scaler is not None else 1.0
            scale_t = Tensor(np.float32(scale))
            batch = []
            with prof.phase("data"):
                for micro in range(cfg.grad_accum_steps):
                    s, m, rows = next(batches)
                    if (s, m) != (step, micro):  # the pipeline and the loop must never part
                        raise MigrateError(f"data pipeline at step {s + 1} micro {m}, trainer at {step + 1} {micro}")
                    batch.append(rows)
            with prof.phase("fwd_bwd"):
                losses = graphs.forward_backward(batch, scale_t)
            step_tokens = sum(int(rows[:, 1:].size) for rows in batch) * layout.dp  # every dp rank reads as many
            tokens += step_tokens
            step_loss = sum(losses) / len(losses)
            if parallel is not None:
                with prof.phase("reduce"):
                    update = graphs.update  # split: one process per rank never runs one graph
                    update.replace_grads(parallel.reduce_grads(tuple(p.value() for p in update.grads)))
                    step_loss = parallel.mean_over_ranks(step_loss)
            if step_faults.poison_grad(step + 1):  # before unscaling, as the golden: fp16's scaler sees it
                graphs.update.poison_first()
            with prof.phase("clip"):
                norm = graphs.measure(scaler.inv_scale if scaler is not None else 1.0)
                all_finite = graphs.all_finite(norm) if scaler is not None else math.isfinite(norm)
            verdict = health.step(StepFacts(step + 1, _finite(step_loss), _finite(norm), lr,
                                            scale if scaler is not None else None), losses, order[step])
            # fp16 overflow, or the health policy skips (or stops at) this step: no optimizer, no scheduler step
            skipped = (scaler is not None and not all_finite) or verdict.action != "continue"
            with prof.phase("optimizer"):
                clipped_norm = graphs.finish(apply=not skipped)  # skipped: the clipped norm alone
            if not skipped:
                sched_pos += 1
            if scaler is not None:
                scaler.update(found_inf=not all_finite)
            now = time.perf_counter()
            tokens_per_s = step_tokens / max(now - step_start, 1e-9)
            record = {"step": step + 1, "loss": _finite(step_loss), "lr": lr,
                      "grad_norm": _finite(norm), "grad_norm_clipped": _finite(clipped_norm),
                      "tokens": tokens, "time": round(now - run_start, 4),
                      "tokens_per_s": round(tokens_per_s, 3), "mfu": _finite(fpt * tokens_per_s / peak["peak_flops"])}
            if scaler is not None:
                record.update(loss_scale=scale, skipped=skipped)
            elif skipped:
                record["skipped"] = True
            if verdict.events:
                record["health"] = [e.kind for e in verdict.events]
            record.update(prof.end(now - step_start))
            line = json.dumps(record) + "\n"
            metrics.write(line)
            metrics.flush()
            metrics_lines.append(line)
            board.step(record, events=verdict.events)
            log(f"step {step + 1}/{cfg.total_steps} loss {record['loss']} lr {lr:.3e} grad_norm {record['grad_norm']}")
            bar(step + 1, record)
            health.stop_if(verdict)
            if eval_rows is not None and (step + 1) % cfg.eval_interval == 0:
                _evaluate(eval_step, model, eval_rows, cfg, eval_path, step + 1)
            if cfg.checkpoint_interval and ((step + 1) % cfg.checkpoint_interval == 0 or step + 1 == cfg.total_steps):
                state = {"step": step + 1, "scheduler_step": sched_pos, "tokens": tokens,
                         "elapsed": time.perf_counter() - run_start,
                         "loss_scale": scaler.state_dict() if scaler is not None else None,
                         "data_position": {"next_step": step + 1,
                                           "draws_done": (step + 1) * layout.global_batch},
                         "rng": rng_state(), "faults": list(faults), "keymap": training.keymap.name,
                         "mode": mode, "config": cfg.to_dict(), "parallel": _parallel_state(layout)}
                _save(out, step + 1, training, state, metrics_lines, cfg, parallel)
    if profile and writer:
        health_echo(format_breakdown([json.loads(line) for line in metrics_lines if line.strip()],
                                     "MindSpore trainer step time"))
    return out


def _parallel_state(layout: Layout) -> dict:
    return {"dp": layout.dp, "mp": layout.mp, "pp": layout.pp, "micro_batches": layout.micro_batches,
            "optimizer_shard": layout.optimizer_shard, "global_batch": layout.global_batch}


def _save(out: Path, step: int, training: MSTraining, state: dict, metrics_lines, cfg: RunConfig, parallel) -> None:
    """One checkpoint: rank 0 writes it; with optimizer sharding every rank first writes its shard."""
    layout_file, staging = None, None
    if parallel is not None:
        layout_file = layout_record(parallel.layout, parallel.size)
        if layout_file["optimizer_shard"]:
            optimizer = training.optimizer
            moments = {p.name: p.asnumpy() for p in (*optimizer.exp_avg, *optimizer.exp_avg_sq)}
            shapes = {p.name: tuple(q.shape) for p, q in zip((*optimizer.exp_avg, *optimizer.exp_avg_sq),
                                                              (*optimizer.parameters, *optimizer.parameters))}
            staging = shard_staging_dir(out, step)
            write_optimizer_shard(staging, parallel.rank, parallel.layout.dp, moments, shapes)
            layout_file["optimizer_slices"] = slice_table(shapes, parallel.layout.dp)
            parallel.barrier()  # every shard file is in place before rank 0 assembles the folder
    if parallel is None or parallel.is_writer:
        save_checkpoint(out, step, model=training.model, model_config=training.model_config,
                        optimizer=training.optimizer, state=state, metrics_text="".join(metrics_lines),
                        sidecar_src=cfg.ms_model, keep=cfg.keep_checkpoints, parallel_layout=layout_file,
                        shard_staging=staging, param_names=checkpoint_names(training),
                        **_lora_content(training, cfg))


def _lora_content(training: MSTraining, cfg: RunConfig) -> dict:
    """A LoRA run checkpoints its adapters and lora.json, not the frozen base."""
    if training.lora is None:
        return {}
    return {"adapters": training.lora.parameters(training.model),
            "lora_record": training.lora.checkpoint_record(cfg.ms_model)}


def _check_vocab(cfg: RunConfig) -> None:
    vocab = read_meta(cfg.data)["tokenizer"]["vocab_size"]
    model_vocab = load_model_config(Path(cfg.require("ms_model")) / "model.yaml").vocab_size
    if vocab > model_vocab:
        raise MigrateError(f"{cfg.data} was tokenized with a {vocab}-token vocabulary, "
                           f"but {cfg.ms_model} has only {model_vocab} embeddings")


def check_resumable(checkpoint, cfg: RunConfig, faults, layout: Layout | None = None) -> None:
    """Refuse a resume that would not continue the same curve (one MigrateError line).

    The split of the global batch may change (dp, micro batch size, accumulation):
    the run order, the loss and the gradient are functions of the global batch alone.
    """
    layout = layout or run_layout(cfg)
    _check_resume_state(checkpoint)
    saved = checkpoint.state.get("config", {})
    now = cfg.to_dict()
    saved_parallel = checkpoint.state.get("parallel") or {"global_batch": saved.get("micro_batch_size", 0)
                                                          * saved.get("grad_accum_steps", 0)}
    if saved_parallel["global_batch"] != layout.global_batch:
        raise MigrateError(f"cannot resume from {checkpoint.path}: its global batch is "
                           f"{saved_parallel['global_batch']} samples per step, this run's is {layout.batch_line()}")
    free = RESUME_FREE | {"micro_batch_size", "grad_accum_steps"}
    differ = sorted(k for k in set(saved) | set(now) if k not in free and saved.get(k) != now.get(k))
    if differ:
        raise MigrateError(f"cannot resume from {checkpoint.path}: the run config differs in "
                           + ", ".join(f"{k} ({saved.get(k)!r} -> {now.get(k)!r})" for k in differ[:4]))
    if list(checkpoint.state.get("faults", [])) != list(faults):
        raise MigrateError(f"cannot resume from {checkpoint.path}: it was trained with faults "
                           f"{checkpoint.state.get('faults')}, this run has {list(faults)}")
    if checkpoint.step > cfg.total_steps:
        raise MigrateError(f"checkpoint {checkpoint.path} is at step {checkpoint.step}, past total_steps")


RESUME_STATE = ("step", "scheduler_step", "optimizer_step", "tokens", "elapsed", "config")


def _check_resume_state(checkpoint) -> None:
    """What a resume reads from trainer_state.json and rng_state.json is there and well-formed
    (a checkpoint too old for a manifest can still be damaged): one line naming the file."""
    lacking = [k for k in RESUME_STATE if k not in checkpoint.state]
    if lacking:
        raise MigrateError(f"cannot resume from {checkpoint.path}: {STATE_FILE} lacks {', '.join(lacking)}")
    rng = checkpoint.state.get("rng")
    try:
        version, internal, _ = rng["python"]
        _, keys, pos, _, _ = rng["numpy"]
        ok = (isinstance(version, int) and len(internal) == 625 and len(keys) == 624 and isinstance(pos, int)
              and isinstance(rng["mindspore"]["state"], list))
    except (TypeError, KeyError, ValueError):
        ok = False
    if not ok:
        raise MigrateError(f"cannot resume from {checkpoint.path}: {RNG_FILE} does not hold the Python, numpy and "
                           f"MindSpore generator states")


def _finite(x: float):
    return x if math.isfinite(x) else None  # JSON has no inf/nan


def _truncate_jsonl(path: Path, last_step: int) -> None:
    """Keep the records of steps <= last_step (a resumed run rewrites what follows)."""
    if not path.is_file():
        return
    if last_step == 0:
        path.unlink()
        return
    keep = [line for line in path.read_text().splitlines(keepends=True)
            if line.strip() and json.loads(line).get("step", 0) <= last_step]
    path.write_text("".join(keep))


def _eval_rows(cfg: RunConfig):
    if not cfg.eval_interval:
        return None
    rows = load_samples(cfg.eval_data, cfg.seq_length)
    return rows[: cfg.eval_samples] if cfg.eval_samples else rows


def _evaluate(eval_step, model, rows, cfg: RunConfig, path: Path, step: int) -> None:
    """Mean loss over the eval rows in file order, micro_batch_size at a time (as the golden script)."""
    model.set_train(False)
    total = 0.0
    for start in range(0, len(rows), cfg.micro_batch_size):
        batch = np.asarray(rows[start:start + cfg.micro_batch_size], dtype=np.int32)
        loss = eval_step(Tensor(np.ascontiguousarray(batch[:, :-1])), Tensor(np.ascontiguousarray(batch[:, 1:])))
        total += float(loss.asnumpy()) * len(batch)
    model.set_train(True)
    with open(path, "a") as fh:
        fh.write(json.dumps({"step": step, "eval_loss": _finite(total / len(rows)), "samples": len(rows)}) + "\n")


@contextlib.contextmanager
def _progress_bar(enabled: bool, total: int, done: int):
    """update(step, record); a rich bar on a terminal's stderr, nothing otherwise."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, \
        TimeRemainingColumn

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
