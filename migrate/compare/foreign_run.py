"""Building a `Run` from the rows a foreign log reader collected (one dict per logged step)."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from migrate.compare.metrics_log import MAX_STEP, Run
from migrate.errors import MigrateError

__all__ = ["Rows", "number"]

_COLUMNS = ("loss", "lr", "grad_norm", "grad_norm_clipped", "tokens", "loss_scale")


def number(text: str, where: str, what: str) -> float:
    """A logged number ('1.23E+00', '[0.91]', 'nan'); one line naming file:line otherwise."""
    t = text.strip().strip("[]").strip()
    try:
        return float(t)
    except ValueError:
        raise MigrateError(f"{where}: {what} is not a number: {text.strip()[:60]!r}") from None


class Rows:
    """Steps as a foreign log gives them: values, their printed resolution, the line of each."""

    def __init__(self, path: Path, fmt: str):
        self.path, self.fmt = path, fmt
        self.values: dict[int, dict[str, float]] = {}
        self.res: dict[int, dict[str, float]] = {}
        self.lines: dict[int, int] = {}
        self.skipped: dict[int, bool] = {}

    def add(self, step: int, line: int, values: dict[str, float], res: dict[str, float] | None = None,
            skipped: bool | None = None) -> None:
        where = f"{self.path}:{line}"
        if step < 1:
            raise MigrateError(f"{where}: step {step}: steps start at 1")
        if step > MAX_STEP:
            raise MigrateError(f"{where}: step {step} is past any training run (at most {MAX_STEP})"[:300])
        if step in self.lines:
            raise MigrateError(f"{where}: step {step} already logged on line {self.lines[step]} "
                               "(a restarted run? give the log of one attempt)")
        self.values[step], self.lines[step] = values, line
        self.res[step] = res or {}
        if skipped is not None:
            self.skipped[step] = skipped

    def run(self, role: str, *, averaged: bool, required=("loss",), interval: int | None = None) -> Run:
        """The `Run`; with ``averaged`` each loss averages the steps since the previous entry, or with
        ``interval`` (Megatron-LM) the `interval` steps to a multiple of it, since a line logged off the
        interval (its first iteration) does not restart the window."""
        if not self.values:
            raise MigrateError(f"{self.path}: no training steps found in this {self.fmt} log ({role} run)")
        steps = np.array(sorted(self.values), dtype=np.int64)
        for col in required:
            absent = [int(s) for s in steps if col not in self.values[int(s)]]
            if len(absent) == len(steps):
                raise MigrateError(f"{self.path}: the log has no {col!r} ({self.fmt}; {role} run)")

        def col(name: str) -> np.ndarray | None:
            if not any(name in self.values[int(s)] for s in steps):
                return None
            return np.array([self.values[int(s)].get(name, math.nan) for s in steps], dtype=float)

        cols = {name: col(name) for name in _COLUMNS}
        resolution = {}
        for name in _COLUMNS:
            r = np.array([self.res[int(s)].get(name, 0.0) for s in steps], dtype=float)
            if r.any():
                resolution[name] = r
        window = None
        if averaged:
            window = np.diff(np.concatenate([[0], steps])).astype(np.int64)
            if interval:
                window = np.where(steps % interval == 0, np.minimum(steps, interval), window)
        absent = np.full(len(steps), np.nan)  # a column the log lacks: its rules are not judged
        grad = cols["grad_norm"] if cols["grad_norm"] is not None else absent
        lr = cols["lr"] if cols["lr"] is not None else absent
        skipped = (np.array([self.skipped.get(int(s), False) for s in steps], dtype=bool)
                   if self.skipped else None)
        return Run(path=self.path, steps=steps, loss=cols["loss"], lr=lr, grad_norm=grad,
                   tokens=cols["tokens"], time=None, skipped=skipped, loss_scale=cols["loss_scale"],
                   lines=np.array([self.lines[int(s)] for s in steps], dtype=np.int64),
                   grad_norm_clipped=cols["grad_norm_clipped"], format=self.fmt, loss_window=window,
                   resolution=resolution)
