"""Where one training step's wall time goes (`migrate train --profile`, golden `--profile`).

    prof = StepProfile(sync=ms.runtime.synchronize)   # or NO_PROFILE: every call is a no-op
    prof.begin()
    with prof.phase("data"): ...
    with prof.phase("fwd_bwd"): ...
    fields = prof.end(step_wall_s)   # {"time_data_s": ..., ..., "time_host_s": the rest}

Each phase is timed with perf_counter around a synchronised call: `sync` runs before
the clock stops, so a phase owns the device work it launched (MindSpore runs
asynchronously; torch on CPU is synchronous and needs none). Everything of the step
outside the named phases (Python, lr, health watch, logging) is `time_host_s`, so the
fields sum to the step's wall time, never more. Measurement only: the syncs cost a
little, which is why it is off by default.
"""
from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable

from migrate.run_protocol.record import TIME_DECIMALS

# The phases both trainers name, in table order; a trainer may leave some out.
PHASES = ("data", "fwd_bwd", "reduce", "clip", "optimizer")
LABELS = {"data": "data loading (batch -> tensors)", "fwd_bwd": "forward + backward (+ accumulation)",
          "reduce": "gradient reduction (dp)", "clip": "unscale, grad norm (golden: and clip)",
          "optimizer": "optimizer (AdamW); MindSpore: clip + AdamW",
          "host": "host overhead (Python, lr, health, logging)"}


def field_name(phase: str) -> str:
    return f"time_{phase}_s"


def _floor6(x: float) -> float:
    """Rounded down to the microsecond, so the logged fields never sum past the wall time."""
    return math.floor(max(x, 0.0) * 1e6) / 1e6


class StepProfile:
    def __init__(self, sync: Callable[[], None] | None = None):
        self.sync = sync or (lambda: None)
        self._spent: dict[str, float] = {}

    def begin(self) -> None:
        self._spent = {}

    @contextlib.contextmanager
    def phase(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.sync()
            self._spent[name] = self._spent.get(name, 0.0) + time.perf_counter() - start

    def end(self, wall_s: float) -> dict[str, float]:
        """This step's fields: each phase, then host = the wall time the phases leave."""
        fields = {field_name(p): _floor6(self._spent[p]) for p in PHASES if p in self._spent}
        fields[field_name("host")] = _floor6(wall_s - sum(fields.values()))
        return fields


class _NoProfile:
    """Profiling off: no sync, no clock, no fields -- the step runs exactly as without it."""

    def begin(self) -> None:
        pass

    def phase(self, name: str):
        return contextlib.nullcontext()

    def end(self, wall_s: float) -> dict[str, float]:
        return {}


NO_PROFILE = _NoProfile()


def profile_for(enabled: bool, sync: Callable[[], None] | None = None):
    return StepProfile(sync) if enabled else NO_PROFILE


def breakdown(records: list[dict], skip_first: bool = True) -> list[tuple[str, float, float]]:
    """(label, mean seconds per step, share of the wall time) per phase over the steps'
    records; the first step (compile, warm-up) is left out when there are others."""
    rows = [r for r in records if field_name("host") in r]
    if skip_first and len(rows) > 1:
        rows = rows[1:]
    if not rows:
        return []
    names = [p for p in (*PHASES, "host") if any(field_name(p) in r for r in rows)]
    totals = {p: sum(r.get(field_name(p), 0.0) for r in rows) for p in names}
    wall = sum(totals.values())
    return [(LABELS[p], totals[p] / len(rows), totals[p] / wall if wall > 0 else float("nan")) for p in names]


def format_breakdown(records: list[dict], title: str = "step time") -> str:
    """The breakdown as a plain-text table (printed at the end of a profiled run)."""
    table = breakdown(records)
    if not table:
        return f"{title}: no profiled steps"
    steps = sum(1 for r in records if field_name("host") in r)
    lines = [f"{title} (mean over {steps - 1 if steps > 1 else steps} steps"
             f"{', the first (compile, warm-up) left out' if steps > 1 else ''})",
             f"  {'phase':<44} {'s/step':>9} {'share':>7}"]
    lines += [f"  {label:<44} {mean:9.4f} {share:7.1%}" for label, mean, share in table]
    lines.append(f"  {'step wall time':<44} {sum(m for _, m, _ in table):9.4f} {'100.0%':>7}")
    return "\n".join(lines)


def breakdown_problems(records: list[dict], phases=("data", "fwd_bwd", "clip", "optimizer")) -> list[str]:
    """What is wrong with a profiled run's fields, one line each (empty: sound): a phase
    missing or not positive, or the fields summing past the step's wall time (from the
    `time` column: seconds since the run started, logged after each step)."""
    problems, previous = [], 0.0
    for r in records:
        step, wall = r.get("step"), r["time"] - previous
        previous = r["time"]
        missing = [p for p in (*phases, "host") if field_name(p) not in r]
        if missing:
            problems.append(f"step {step}: no {', '.join(field_name(p) for p in missing)}")
            continue
        low = [p for p in phases if not r[field_name(p)] > 0] + ([] if r[field_name("host")] >= 0 else ["host"])
        if low:
            problems.append(f"step {step}: {', '.join(field_name(p) for p in low)} not positive")
        total = sum(v for k, v in r.items() if k.startswith("time_") and k.endswith("_s"))
        # `time` is rounded (TIME_DECIMALS), so a wall time from two of them is off by up to one unit
        if total > wall + 10.0 ** -TIME_DECIMALS:
            problems.append(f"step {step}: the phases sum to {total:.6f} s, past its wall time {wall:.6f} s")
    return problems
