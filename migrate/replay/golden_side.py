"""The golden side of a replay: golden/train_torch.py's own state loader and its own step.

The golden script is loaded as `migrate hparams` loads it (`train.hparams.load_golden`); the step
is its `optimizer_step`, the very function its `train` loop calls, told about each seam."""
from __future__ import annotations

from pathlib import Path

from migrate.data.samples import load_samples, run_order
from migrate.replay.recording import StepRecording
from migrate.train.config import RunConfig
from migrate.train.hparams import load_golden


def golden_state(cfg: RunConfig, checkpoint: Path | None):
    """(golden module, model, optimizer, scheduler, scaler): as the run was after `checkpoint`
    (None: before its first step, as `train` builds them)."""
    golden = load_golden()
    if checkpoint is None:
        golden.seed_everything(cfg.seed)
        model = golden.build_model(cfg)
        optimizer, scaler = golden.build_optimizer(model, cfg), golden.build_scaler(cfg)
        return golden, model, optimizer, golden.build_scheduler(optimizer, cfg), scaler
    model, optimizer, scheduler, scaler, _ = golden.load_checkpoint(cfg, checkpoint)
    return golden, model, optimizer, scheduler, scaler


def golden_step(cfg: RunConfig, state, step: int) -> StepRecording:
    """Optimizer step `step` (1-based) of the golden run, recorded; its rows are run_order's, as in `train`."""
    golden, model, optimizer, scheduler, scaler = state
    samples = load_samples(cfg.data, cfg.seq_length)
    order = run_order(cfg, len(samples))
    watch = golden.build_health_watch(cfg)
    params = [p for g in optimizer.param_groups for p in g["params"]]
    recording = StepRecording()
    golden.optimizer_step(model, optimizer, scheduler, scaler, cfg, step - 1, params=params,
                          read=lambda micro: golden.batch_rows(samples, order, step - 1, micro),
                          decide=lambda facts, losses: watch.check(facts),  # the watch alone: nothing logged
                          observe=recording)
    return recording


def golden_rows(cfg: RunConfig, step: int, micro: int = 0):
    """The rows micro-batch `micro` of step `step` (1-based) reads, as numpy int64."""
    samples = load_samples(cfg.data, cfg.seq_length)
    order = run_order(cfg, len(samples))
    return load_golden().batch_rows(samples, order, step - 1, micro).numpy()
