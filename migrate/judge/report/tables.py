"""The report's tables, whatever they are drawn into: entries, NaN/Inf, run, thresholds.

`terminal`, `markdown` and `html` render these through the judge's renderers, so the three
formats list the same rows with the same figures.
"""
from __future__ import annotations

from typing import Any

from migrate.judge import Column, Table, fmt_cosine, fmt_num, fmt_pct
from migrate.judge.bounds import METRICS
from migrate.judge.checks import nonfinite_side
from migrate.judge.report.entries import STATE_KINDS, Entry, first_words
from migrate.judge.table import FAIL, FIRST, OK
from migrate.judge.thresholds import KINDS

__all__ = ["checks_table", "entry_tables", "nonfinite_table", "run_rows", "thresholds_table"]

_TEXT = ("location", "kind", "status")
_WRAPS = ("location", "status")
COLUMNS = [Column(c, left=c in _TEXT, wrap=c in _WRAPS, fold=True)
           for c in ("#", "location", "kind", "max abs", "× noise", "max rel", "mean abs", "cosine",
                     "≤1e-3", "top-1", "KL", "status")]


def _cells(e: Entry, i: int, first: bool, backward: bool = False) -> list[str]:
    m = e.metrics
    if e.kind == "generation" and "steps" in m:
        cells = ["—"] * 8
        status_ok = e.headline()
    else:
        ratio = e.noise_ratio
        cells = [
            fmt_num(m.get("max_abs")), "—" if ratio is None else f"{ratio:.2g}",
            fmt_num(m.get("max_rel")), fmt_num(m.get("mean_abs")),
            fmt_cosine(m.get("cosine")) if e.kind != "loss" else "—",
            fmt_pct(m.get("within_1e-3")), fmt_pct(m.get("top1")), fmt_num(m.get("kl")),
        ]
        status_ok = "ok"
    status = status_ok if e.passed else f"FAIL: {e.reason}"
    if first:
        status = f"◀ {first_words(e, backward)} · " + status
    return [str(i), e.location, e.kind, *cells, status]


def entry_tables(report: Any) -> list[Table]:
    """Forward entries, then backward ones; failures marked, the first divergence of each hardest."""
    sections = []
    if report.forward:
        sections.append(("Forward", report.forward, False))
    if report.backward:
        state = all(e.kind in STATE_KINDS for e in report.backward)
        sections.append(("Training state (backward order: counters and scalars, then the last layers first)" if state
                         else "Backward (gradients and parameters after one step, backward order)",
                         report.backward, True))
    tables = []
    for title, entries, backward in sections:
        first = report.first_grad_divergence if backward else report.first_divergence
        table = Table(COLUMNS, title=title)
        for e in entries:
            table.add(_cells(e, report.index_of(e), e is first, backward),
                      FIRST if e is first else (OK if e.passed else FAIL))
        tables.append(table)
    if report.checks:
        tables.append(checks_table(report.checks))
    return tables


def checks_table(checks: list) -> Table:
    """The judged figures that are no tensor (`Report.checks`): one row each, its figure against its bound."""
    table = Table([Column("check", left=True), Column("what", left=True, wrap=True, fold=True), Column("value"),
                   Column("bound"), Column("status", left=True, wrap=True)],
                  title="Checks (figures that are no tensor: norms, factors, lr, accumulation)")
    for c in checks:
        status = "not judged" if c.passed is None else ("ok" if c.passed else "FAIL")
        if c.detail:
            status += f": {c.detail}"
        value = c.value if isinstance(c.value, str) else fmt_num(c.value)
        limit = c.limit if isinstance(c.limit, str) else fmt_num(c.limit)
        table.add([c.key, c.label, value, limit, status], FAIL if c.passed is False else OK)
    return table


def nonfinite_table(report: Any) -> Table:
    """One row per entry holding NaN / Inf: index, location, each side's counts and first positions."""
    table = Table([Column("#"), Column("location", left=True), Column(report.ref_label, left=True),
                   Column(report.got_label, left=True)])
    for e in report.nonfinite_entries():
        table.add([str(report.index_of(e)), e.location, nonfinite_side(e.metrics, "ref", 5),
                   nonfinite_side(e.metrics, "got", 5)], FAIL)
    return table


def run_rows(report: Any) -> list[tuple[str, str]]:
    """What was compared, with what, when."""
    rows = [
        ("dtype", report.dtype),
        ("inputs", report.inputs or "—"),
        ("seed", "—" if report.seed is None else str(report.seed)),
        (f"{report.ref_label} model", report.ref_dir or "—"),
        (f"{report.got_label} model", report.got_dir or "—"),
    ]
    rows += [(f"{k} version", str(v)) for k, v in sorted(report.versions.items())]
    rows += [(str(k), str(v)) for k, v in report.extra.items()]
    rows.append(("created", report.created))
    return rows


def thresholds_table(report: Any) -> Table:
    """The bounds of every kind at the report's dtype; — where a bound is not checked."""
    names = tuple(METRICS)   # every declared bound (`judge.bounds`), in declaration order
    table = Table([Column("kind", left=True), *(Column(n) for n in names)])
    for kind in KINDS:
        b = report.thresholds.bounds(kind)
        table.add([kind, *("—" if getattr(b, n) is None else f"{getattr(b, n):g}" for n in names)])
    return table
