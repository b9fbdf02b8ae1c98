"""The judge: how `migrate diff`, `migrate generate --compare-hf` and `migrate compare` turn figures
into verdicts and print them.

Framework-free at import (no torch, no MindSpore; `twin` imports torch inside its functions).
Everything that judges two tensors lives here, below every tool that produces them
(`migrate.align`, `migrate.probe`, `migrate.infer`): `metrics` (tensor, logits and generation
metrics on numpy arrays), `thresholds` (the per-dtype `Bounds`), `checks` (metrics held to their
bounds), `noise` (the reference's own error against its float64 twin) and `twin` (running a torch
model in float64 in place), and `report` (the judged entries of `migrate diff`, the first
divergence, the report in every format). `migrate.compare` keeps its curve statistics and
rules and shares the rest:

- `verdict`: `Check` (one figure, its bound, passed / failed / not judged and why, the first
  step out) and `Verdict` (pass, exit code, first failure, the verdict line);
- `tolerances`: validation of user overrides, keyword or ``KIND.NAME=VALUE``;
- `fmt`: how a figure reads (3.20e-04, cosine 0.99999, 99.87%);
- renderers, one per format: `table` (the judged table every renderer draws), `terminal`
  (rich), `markdown`, `html`, `jsonfile` (strict JSON, atomic), `plot` (matplotlib helpers).

The dtype vocabulary the tolerances are keyed by is `migrate.dtype_names`, at the bottom of the
package because the converter's planner reads it too.
"""
from migrate.judge.fmt import fmt_cosine, fmt_figure, fmt_num, fmt_pct, fmt_share, short
from migrate.judge.table import Column, Row, Table
from migrate.judge.tolerances import bound_value, parse_spec, validated
from migrate.judge.verdict import Check, Verdict

__all__ = ["Check", "Verdict", "Column", "Row", "Table", "bound_value", "validated", "parse_spec",
           "fmt_num", "fmt_figure", "fmt_cosine", "fmt_share", "fmt_pct", "short"]
