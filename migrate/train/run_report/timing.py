"""Where a run's time went, from metrics.jsonl: `time` (seconds since the run started, logged
after each step) gives each step's wall time; the first step carries graph compilation and
warm-up, steps at the checkpoint interval carry the save; fields named `*_time` / `*_s`
(besides tokens_per_s) that a trainer logs are shown as their share of the step."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from migrate.train.run_report.run_files import RunFiles


@dataclass
class Timing:
    steps: np.ndarray
    seconds: np.ndarray                 # wall time of each step
    rows: list[tuple[str, str]] = field(default_factory=list)   # the breakdown, label -> text
    tokens_per_s: np.ndarray | None = None


def _fields(records: list[dict]) -> list[str]:
    names = {k for r in records for k, v in r.items()
             if (k.endswith("_time") or k.endswith("_s")) and k != "tokens_per_s" and isinstance(v, (int, float))}
    return sorted(names)


def step_timing(run: RunFiles) -> Timing | None:
    m = run.metrics
    if m.time is None or not len(m.time):
        return None
    t = m.time
    dt = np.diff(t, prepend=0.0)
    dt = np.where(dt < 0, t, dt)  # a resumed run restarts its clock
    timing = Timing(m.steps, dt)
    tps = [r.get("tokens_per_s") for r in run.records]
    if any(isinstance(v, (int, float)) for v in tps):
        timing.tokens_per_s = np.array([v if isinstance(v, (int, float)) else np.nan for v in tps], float)
    rows = timing.rows
    rows.append(("wall time", f"{t[-1]:.2f} s over {len(t)} steps"))
    rows.append(("first step (compile, warm-up)", f"{dt[0]:.3f} s"))
    steady = dt[1:]
    if len(steady):
        p10, p50, p90 = np.percentile(steady, [10, 50, 90])
        rows.append(("later steps", f"median {p50:.4f} s · p10 {p10:.4f} s · p90 {p90:.4f} s · "
                                    f"mean {steady.mean():.4f} s"))
        rows.append(("first step vs median", f"{dt[0] / p50:.1f}×" if p50 > 0 else "—"))
        interval = run.config("checkpoint_interval") or 0
        if interval:
            at = (m.steps[1:] % interval) == 0
            if at.any():
                extra = float(np.mean(steady[at]) - p50)
                rows.append((f"checkpoint steps (every {interval})",
                             f"{int(at.sum())} steps, {np.mean(steady[at]):.4f} s each ({extra:+.4f} s vs median)"))
        slow = np.argsort(-steady)[:3]
        rows.append(("slowest later steps", ", ".join(f"step {int(m.steps[1:][i])} {steady[i]:.4f} s" for i in slow)))
    for name in _fields(run.records):
        vals = np.array([r.get(name, np.nan) for r in run.records], float)
        vals = vals[np.isfinite(vals)]
        if len(vals):
            share = vals.sum() / dt.sum() if dt.sum() > 0 else np.nan
            rows.append((name, f"mean {vals.mean():.4f} s per step · {share:.1%} of the wall time"))
    if timing.tokens_per_s is not None and np.isfinite(timing.tokens_per_s[1:]).any():
        rows.append(("tokens/s (later steps)", f"median {np.nanmedian(timing.tokens_per_s[1:]):,.0f}"))
    mfu = np.array([r.get("mfu") if isinstance(r.get("mfu"), (int, float)) else np.nan for r in run.records], float)
    if np.isfinite(mfu[1:]).any():
        rows.append(("MFU (later steps)", f"median {np.nanmedian(mfu[1:]):.2%}"))
    return timing
