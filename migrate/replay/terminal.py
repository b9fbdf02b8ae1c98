"""`migrate replay` on the console: one row per stage of the step, in its order, the notes, and the
line naming the first quantity that parts (the full per-tensor table is `--report DIR`'s)."""
from __future__ import annotations

from typing import Any

from migrate.judge import Column, Table
from migrate.judge.table import FAIL, FIRST, OK
from migrate.judge.terminal import NOTE_STYLE, print_judged
from migrate.replay.judging import STAGES

COLUMNS = [Column("stage", left=True), Column("compared"), Column("part"),
           Column("first to part", left=True, wrap=True), Column("status", left=True)]


def stage_table(items: list) -> Table:
    table = Table(COLUMNS)
    first = next((it for it in items if not it.passed), None)
    for stage in STAGES:
        mine = [it for it in items if it.stage == stage]
        if not mine:
            continue
        parted = [it for it in mine if not it.passed]
        head = parted[0] if parted else None
        state = FIRST if head is not None and head is first else (FAIL if parted else OK)
        table.add([stage, str(len(mine)), str(len(parted)), f"{head.what}: {head.figure}" if head else "",
                   "FAIL" if parted else "ok"], state)
    return table


def print_replay(result: Any, console: Any = None) -> None:
    plan = result.plan
    heading = (f"{plan.golden_run} (golden) vs {plan.ms_run} (MindSpore) · {plan.cfg.dtype} · "
               f"step {plan.step} replayed")
    lines = [("note: " + note, NOTE_STYLE) for note in result.notes]
    print_judged(console, heading, [stage_table(result.items)], lines, result.line, result.first is None)
