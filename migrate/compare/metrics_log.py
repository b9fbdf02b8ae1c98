"""Reading a training run's metrics.jsonl into a `Run`.

A path may be the metrics.jsonl file or the run folder holding it.

Input
-----
One JSON object per line, as ``golden/train_torch.py`` writes them: ``step``
(int >= 1), ``loss`` (number, or null when non-finite), ``lr`` (finite
number), ``grad_norm`` (number or null); optional ``grad_norm_clipped`` (the
total norm measured on the gradients after clipping; number or null),
``tokens``, ``time``, and in fp16 ``skipped`` (bool) and ``loss_scale``. Blank lines are ignored. A missing
or unreadable file, a line that is not a JSON object, a missing required key,
a value of the wrong type and a step logged twice are `MigrateError`s naming
``file:line`` (the CLI exits 2). So is a pair of runs with no step in common.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from migrate.checkpoints.input_folder import InputFolder
from migrate.compare.log_formats import LogFormat, log_format
from migrate.errors import MigrateError
from migrate.jsonsafe import parse_json
from migrate.run_protocol.record import REQUIRED_KEYS  # the step record's contract, shared with both writers

__all__ = ["METRICS", "REQUIRED_KEYS", "Run", "read_metrics"]


@dataclass
class Run:
    """One metrics.jsonl, sorted by step. Non-finite / null values are NaN."""

    path: Path
    steps: np.ndarray
    loss: np.ndarray
    lr: np.ndarray
    grad_norm: np.ndarray
    tokens: np.ndarray | None
    time: np.ndarray | None
    skipped: np.ndarray | None
    loss_scale: np.ndarray | None
    lines: np.ndarray  # 1-based line number of each step
    grad_norm_clipped: np.ndarray | None = None  # total norm after clipping, where logged
    format: str = "metrics"  # a registered format's key (log_formats.FORMATS) or "tensorboard:<dialect>"
    loss_window: np.ndarray | None = None  # steps each logged loss averages (ending at its step); None: 1
    resolution: dict = field(default_factory=dict)  # column -> per-step half unit of the last printed digit

    def __len__(self) -> int:
        return len(self.steps)

    def span(self) -> str:
        return f"steps {int(self.steps[0])}..{int(self.steps[-1])}" if len(self) else "no steps"


def _resolve(path: Any, role: str) -> Path:
    if path is None:
        raise MigrateError(f"no {role} metrics file given")
    p = Path(path)
    if p.is_dir():
        member = InputFolder(p, "run folder").optional("metrics.jsonl")
        if member is not None:
            return member
        raise MigrateError(f"{p}: a folder without metrics.jsonl ({role} run)")
    if not p.exists():
        raise MigrateError(f"{p}: no such file ({role} metrics)")
    return p


# Steps are held as int64 and plotted as float64: one past 2**53 is no training run's (10**30 ended in an
# OverflowError traceback in a foreign log's reader)
MAX_STEP = 2**53


def _number(rec: dict, key: str, where: str, *, nullable: bool, optional: bool = False) -> float:
    if key not in rec:
        if optional:
            return math.nan
        raise MigrateError(f"{where}: missing key {key!r}")
    v = rec[key]
    if v is None:
        if nullable or optional:
            return math.nan
        raise MigrateError(f"{where}: {key!r} is null; expected a number")
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise MigrateError(f"{where}: {key!r} must be a number{' or null' if nullable else ''}, got {v!r}")
    v = float(v)
    if not nullable and not optional and not math.isfinite(v):
        raise MigrateError(f"{where}: {key!r} must be finite, got {v!r}")
    return v


METRICS = LogFormat(
    "metrics", "metrics.jsonl", "golden/train_torch.py, migrate train",
    {"step": "step", "loss": "loss", "lr": "lr", "grad_norm": "grad_norm",
     "grad_norm_clipped": "grad_norm_clipped", "skipped": "skipped", "loss_scale": "loss_scale",
     "tokens": "tokens"},
    loss_averaged=False, torch_clip=True,
    sniff=lambda s: s.child("metrics.jsonl"), rank=0, folder="metrics.jsonl",
    # a file no other format claims: JSON lines, empty, or not text (its reader names the bad line or byte)
    fallback=lambda s: not s.is_dir and (s.first.startswith("{") or not s.first or not s.utf8))


@log_format(METRICS)
def read_metrics(path: Any, role: str = "metrics") -> Run:
    """Parse a metrics.jsonl (or a run folder holding one) into a `Run`."""
    p = _resolve(path, role)
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise MigrateError(f"{p}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise MigrateError(f"{p}: cannot read ({e.strerror or e})") from None
    rows: dict[int, tuple] = {}
    seen_line: dict[int, int] = {}
    has = {"tokens": False, "time": False, "skipped": False, "loss_scale": False, "grad_norm_clipped": False}
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{p}:{lineno}"
        rec = parse_json(line, where)  # bounded: one line naming the file and line otherwise
        if not isinstance(rec, dict):
            raise MigrateError(f"{where}: expected a JSON object, got {type(rec).__name__}")
        for key in REQUIRED_KEYS:
            if key not in rec:
                raise MigrateError(f"{where}: missing key {key!r} (need {', '.join(REQUIRED_KEYS)})")
        step = rec["step"]
        if (isinstance(step, bool) or not isinstance(step, (int, float)) or not math.isfinite(step)
                or step != int(step) or not 1 <= step <= MAX_STEP):
            raise MigrateError(f"{where}: 'step' must be an integer in 1..{MAX_STEP}, got {step!r}"[:300])
        step = int(step)
        if step in seen_line:
            raise MigrateError(f"{where}: step {step} already logged on line {seen_line[step]}")
        seen_line[step] = lineno
        loss = _number(rec, "loss", where, nullable=True)
        lr = _number(rec, "lr", where, nullable=False)
        grad = _number(rec, "grad_norm", where, nullable=True)
        tokens = _number(rec, "tokens", where, nullable=False, optional=True)
        tm = _number(rec, "time", where, nullable=False, optional=True)
        scale = _number(rec, "loss_scale", where, nullable=True, optional=True)
        clipped = _number(rec, "grad_norm_clipped", where, nullable=True, optional=True)
        skipped = rec.get("skipped", False)
        if skipped is None:
            skipped = False
        if not isinstance(skipped, bool):
            raise MigrateError(f"{where}: 'skipped' must be true or false, got {skipped!r}")
        for key in has:
            has[key] = has[key] or key in rec
        rows[step] = (loss, lr, grad, tokens, tm, skipped, scale, lineno, clipped)
    if not rows:
        raise MigrateError(f"{p}: no metrics lines ({role} run)")
    steps = np.array(sorted(rows), dtype=np.int64)
    cols = list(zip(*(rows[s] for s in steps), strict=True))

    def col(i, dtype=float):
        return np.array(cols[i], dtype=dtype)

    return Run(path=p, steps=steps, loss=col(0), lr=col(1), grad_norm=col(2),
               tokens=col(3) if has["tokens"] else None, time=col(4) if has["time"] else None,
               skipped=col(5, bool) if has["skipped"] else None,
               loss_scale=col(6) if has["loss_scale"] else None, lines=col(7, np.int64),
               grad_norm_clipped=col(8) if has["grad_norm_clipped"] else None)
