"""The step record: one JSON object per optimizer step in metrics.jsonl.

Both trainers build it with `step_record` and write it through `MetricsLog`; `migrate compare`
reads it (`migrate.compare.metrics_log`) by the same names. Fields, in this order:

  step               optimizer step, 1-based
  loss               mean of the step's micro-batch losses (unscaled); null when not finite
  lr                 the lr this step used
  grad_norm          total gradient norm before clipping; null when not finite
  grad_norm_clipped  total norm of the gradients after clipping, measured on them
  tokens             target tokens so far (every rank's)
  time               seconds since the run started (carried across a resume)
  tokens_per_s       this step's tokens / its wall time
  mfu                flops_per_token * tokens_per_s / peak_flops (where the run has a basis)
  loss_scale, skipped  fp16: the scale this step used, and whether the step was skipped;
                     other precisions write skipped (true) only on a step the health policy skipped
  health             the kinds of the health events this step raised, where it raised any
  ...                then a trainer's own extras (the golden's step-1 float64 reference, the
                     step-time breakdown time_*_s)
"""
from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path

from migrate.errors import MigrateError
from migrate.jsonsafe import parse_json
from migrate.safeyaml import quote

METRICS_FILE = "metrics.jsonl"
EVAL_FILE = "eval.jsonl"

STEP = "step"
LOSS = "loss"
LR = "lr"
GRAD_NORM = "grad_norm"
GRAD_NORM_CLIPPED = "grad_norm_clipped"
TOKENS = "tokens"
TIME = "time"
# the `time` column is rounded to this many decimals (a reader comparing it allows 10**-TIME_DECIMALS)
TIME_DECIMALS = 4
TOKENS_PER_S = "tokens_per_s"
MFU = "mfu"
LOSS_SCALE = "loss_scale"
SKIPPED = "skipped"
HEALTH = "health"
# what every metrics.jsonl line holds (the reader refuses a line without one)
REQUIRED_KEYS = (STEP, LOSS, LR, GRAD_NORM)
# the eval record (eval.jsonl)
EVAL_LOSS = "eval_loss"
EVAL_SAMPLES = "samples"


def finite(x):
    """x, or None when it is not finite (JSON has no inf/nan)."""
    return x if math.isfinite(x) else None


def step_record(step: int, loss: float, lr: float, grad_norm: float, grad_norm_clipped: float, *,
                tokens: int, step_tokens: int, step_seconds: float, run_seconds: float,
                flops_per_token: float | None = None, peak_flops: float | None = None,
                loss_scale: float | None = None, skipped: bool = False, health: Sequence[str] = (),
                extra: Iterable[dict] = ()) -> dict:
    """The record of optimizer step `step` (1-based); loss: the mean of its micro-batch losses.
    loss_scale: the fp16 scale the step used (None: no loss scaling); flops_per_token None: no
    mfu field; extra: dicts appended in order."""
    tokens_per_s = step_tokens / max(step_seconds, 1e-9)
    record = {STEP: step, LOSS: finite(float(loss)), LR: lr, GRAD_NORM: finite(float(grad_norm)),
              GRAD_NORM_CLIPPED: finite(float(grad_norm_clipped)), TOKENS: tokens,
              TIME: round(run_seconds, TIME_DECIMALS), TOKENS_PER_S: round(tokens_per_s, 3)}
    if flops_per_token is not None:
        record[MFU] = finite(flops_per_token * tokens_per_s / peak_flops)
    if loss_scale is not None:
        record.update({LOSS_SCALE: loss_scale, SKIPPED: bool(skipped)})
    elif skipped:
        record[SKIPPED] = True
    if health:
        record[HEALTH] = list(health)
    for more in extra:
        record.update(more)
    return record


def log_line(record: dict, total_steps: int) -> str:
    """The one text line a trainer logs per step."""
    return (f"step {record[STEP]}/{total_steps} loss {record[LOSS]} lr {record[LR]:.3e} "
            f"grad_norm {record[GRAD_NORM]}")


class MetricsLog:
    """metrics.jsonl: the lines a resumed run carries over, then one line per step, flushed as written.

    path None: build the lines, write nothing (a rank that does not write the run folder)."""

    def __init__(self, path: Path | None, previous: Sequence[str] = ()):
        self.lines = list(previous)
        self._fh = None
        if path is not None:
            Path(path).write_text("".join(self.lines))
            self._fh = open(path, "a")

    def write(self, record: dict) -> str:
        line = json.dumps(record) + "\n"
        if self._fh is not None:
            self._fh.write(line)
            self._fh.flush()
        self.lines.append(line)
        return line

    @property
    def text(self) -> str:
        return "".join(self.lines)

    def records(self) -> list[dict]:
        return parse_lines(self.lines)

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def parse_lines(lines: Iterable[str]) -> list[dict]:
    return [json.loads(line) for line in lines if line.strip()]


def step_of(line: str, where: str) -> int:
    """The step of one .jsonl line, read as bounded JSON (a run folder is input too: one line otherwise)."""
    record = parse_json(line, where, expect=dict)
    step = record.get(STEP, 0)
    if not isinstance(step, int) or isinstance(step, bool):
        raise MigrateError(f"{where}: step must be a whole number, found {quote(step)}")
    return step


def eval_record(step: int, mean_loss: float, samples: int) -> dict:
    return {STEP: step, EVAL_LOSS: finite(mean_loss), EVAL_SAMPLES: samples}


def append_eval(path: Path, step: int, mean_loss: float, samples: int) -> None:
    with open(path, "a") as fh:
        fh.write(json.dumps(eval_record(step, mean_loss, samples)) + "\n")


def truncate_jsonl(path: Path, last_step: int) -> None:
    """Keep the records of steps <= last_step (a resumed run rewrites what follows; 0: remove the file)."""
    path = Path(path)
    if not path.is_file():
        return
    if last_step == 0:
        path.unlink()
        return
    keep = [line for n, line in enumerate(path.read_text().splitlines(keepends=True), 1)
            if line.strip() and step_of(line, f"{path}:{n}") <= last_step]
    path.write_text("".join(keep))
