"""Compare two training runs' metrics.jsonl: the golden PyTorch run and the MindSpore run.

    result = compare_runs("golden/metrics.jsonl", "ms/metrics.jsonl",
                          noise_path="golden-seed2/metrics.jsonl", dtype="bf16",
                          tolerances={"mean": 5e-3})      # overrides; None keeps a default
    print_summary(result, console)                      # rich table + verdict line
    write_plot(result, "compare.png"); write_json(result, "compare.json")
    sys.exit(result.exit_code)                          # 0 within tolerance, 1 drift

A path may be the metrics.jsonl file or the run folder holding it, or one of the field's logs --
HF Trainer's trainer_state.json, Megatron-LM or MindSpore Transformers log lines, TensorBoard event
files -- detected by `readers.read_run` (`log_formats` is the registry: each format declared beside
its reader with its field mapping, sniff and read;
`log_alignment` matches window-averaged losses, sparse steps, next-step lrs and printed precision).

One module per concern: `metrics_log` reads a run, `stats` holds the per-step statistics,
`tolerances` the bounds per dtype, `rules` (with `drift` and `clip`) turns the paired curves
into `migrate.judge` checks, `runs.compare_runs` orchestrates, `result.CompareResult` carries
the verdict and compare.json's schema, `terminal` and `plot` draw it.

Output: `print_summary` (rich table, one row per rule: MindSpore's figure,
the noise run's, the bound, the first step out; then notes and a verdict line
naming the first step and metric out of tolerance), `write_plot` (PNG: loss
curves, per-step |ms - golden| rel diff with the noise band shaded, lr;
failing steps marked) and `write_json` / ``to_dict()`` (strict JSON,
non-finite floats as "nan" / "inf"). Files are written atomically.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from migrate.compare.metrics_log import Run, read_metrics
from migrate.compare.plot import render_plot, write_plot
from migrate.compare.readers import read_run
from migrate.compare.result import SCHEMA_VERSION, CompareResult
from migrate.compare.runs import compare_runs
from migrate.compare.terminal import print_summary
from migrate.compare.tolerances import Tolerances
from migrate.judge import Check
from migrate.judge.jsonfile import write_json as _write_json

__all__ = [
    "SCHEMA_VERSION",
    "Tolerances",
    "Run",
    "Check",
    "CompareResult",
    "read_metrics",
    "read_run",
    "compare_runs",
    "print_summary",
    "render_plot",
    "write_plot",
    "write_json",
]


def write_json(result: CompareResult, path: Any) -> Path:
    """`CompareResult.to_dict` as strict JSON, written atomically."""
    return _write_json(path, result.to_dict(), ascii_only=True)
