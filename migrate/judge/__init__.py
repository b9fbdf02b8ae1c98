"""The judge: how `migrate diff` and `migrate compare` turn figures into verdicts and print them.

Framework-free (no torch, no MindSpore). Its two clients keep what they measure and the
rules they hold it to -- `migrate.align` the tensor metrics and per-dtype thresholds,
`migrate.compare` the curve statistics and rules -- and share the rest:

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
