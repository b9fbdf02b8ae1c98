"""`migrate compare` on the console: one row per rule, the differing hyperparameters, the
notes, the verdict line."""
from __future__ import annotations

import math
from typing import Any

from migrate.compare.result import CompareResult
from migrate.judge import Column, Table, fmt_figure, short
from migrate.judge.table import FAIL, FIRST, NOT_JUDGED, OK
from migrate.judge.terminal import FAIL_STYLE, NOTE_STYLE, print_judged

__all__ = ["print_summary"]

COLUMNS = [Column("rule", left=True, wrap=True), Column("MindSpore"), Column("noise run"), Column("bound"),
           Column("first step out"), Column("status", left=True)]
_EXACT = ("steps", "tokens", "skipped", "loss_scale", "hparams")   # counted, not measured


def rules_table(r: CompareResult) -> Table:
    table = Table(COLUMNS)
    first = r.first_failure
    for c in r.checks:
        status = "—" if c.passed is None else ("ok" if c.passed else "FAIL")
        state = FIRST if c is first else {False: FAIL, None: NOT_JUDGED}.get(c.passed, OK)
        exact = c.key in _EXACT
        if exact and not math.isfinite(c.value):
            value, status = "—", "skipped"   # the hparams cross-check without both files
        else:
            value = f"{int(c.value)} differ" if exact else fmt_figure(c.value)
        table.add([c.label, value, fmt_figure(c.noise), fmt_figure(c.limit) if not exact else "exact",
                   "" if c.step is None else str(c.step), status], state)
    return table


def print_summary(result: CompareResult, console: Any = None) -> None:
    """A rich table, one row per rule, then notes and the verdict line."""
    r = result
    head = (f"{r.golden_path} (golden) vs {r.ms_path} (MindSpore) · {r.dtype} · "
            f"{len(r.steps)} paired steps ({r.golden_steps} golden, {r.ms_steps} MindSpore)")
    if r.noise_path is not None:
        head += f" · noise run {r.noise_path} ({r.noise_steps} steps)"
    lines = []
    if r.hparams is not None:
        lines += [(f"hyperparameter differs: {row.knob} · golden {short(row.golden)} · "
                   f"MindSpore {short(row.mindspore)}" + (f" · {row.detail}" if row.detail else ""), FAIL_STYLE)
                  for row in r.hparams.differing]
    lines += [("note: " + note, NOTE_STYLE) for note in r.notes]
    print_judged(console, head, [rules_table(r)], lines, r.verdict_text(), r.passed)
