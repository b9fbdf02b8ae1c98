"""Everything a training run logs as it goes, for both trainers: metrics.jsonl (through the run
protocol's `MetricsLog`), eval.jsonl, the health watch's log and the TensorBoard board, plus
the one text line per step.

    run_log = RunLog(out, cfg, echo=print)           # out None: a rank that writes nothing
    verdict = run_log.health.step(facts, losses, samples)
    run_log.step(record, verdict)                    # metrics line, board, log line
    run_log.eval(step, mean_loss, samples)
    run_log.close()

golden/train_torch.py and `migrate.train.trainer` both run through it, so each writes the
same files at the same points of a step.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from migrate.run_protocol.record import (
    EVAL_FILE,
    METRICS_FILE,
    MetricsLog,
    append_eval,
    log_line,
    parse_lines,
    truncate_jsonl,
)
from migrate.train.health.log import HealthLog, replay
from migrate.train.health.watch import HealthWatch
from migrate.train.tensorboard import RunBoard


def _quiet(line: str) -> None:
    return None


class RunLog:
    """out: the run folder (None: decide and build records, write nothing); start: the steps a
    resumed run already has, `previous` their metrics lines; echo: the per-step line;
    health_echo: the health watch's lines (default echo)."""

    def __init__(self, out: Path | None, cfg, *, echo: Callable[[str], None] = _quiet,
                 health_echo: Callable[[str], None] | None = None, start: int = 0, previous: Sequence[str] = (),
                 watch: HealthWatch | None = None):
        self.out, self.total_steps, self.echo = out, cfg.total_steps, echo
        watch = watch or HealthWatch.for_run(cfg)
        replay(watch, parse_lines(previous))  # a resume: the watch's statistics as they were
        self.eval_path = out / EVAL_FILE if out is not None else None
        if self.eval_path is not None:
            truncate_jsonl(self.eval_path, start)  # a rerun must not append to an old run's evals
        self.metrics = MetricsLog(out / METRICS_FILE if out is not None else None, previous)
        self.health = HealthLog(watch, out, cfg.data, cfg.seq_length,
                                (health_echo or echo) if out is not None else _quiet, start_step=start)
        self.board = RunBoard(out if out is not None and cfg.tensorboard else None, start)

    def step(self, record: dict, verdict) -> None:
        """Write one step's record (metrics.jsonl, the board) and log its line."""
        self.metrics.write(record)
        self.board.step(record, events=verdict.events)
        self.echo(log_line(record, self.total_steps))

    def eval(self, step: int, mean_loss: float, samples: int) -> None:
        if self.eval_path is not None:
            append_eval(self.eval_path, step, mean_loss, samples)

    def close(self) -> None:
        self.metrics.close()
        self.board.close()
