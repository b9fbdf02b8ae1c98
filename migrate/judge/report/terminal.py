"""The report on the console: the entry tables, the generation, the first divergences, the verdict."""
from __future__ import annotations

from typing import Any

from migrate.judge.report.tables import entry_tables
from migrate.judge.terminal import FAIL_STYLE, print_judged

__all__ = ["print_table"]


def print_table(report: Any, console: Any = None) -> None:
    """Print the entries (one line each; failures red, first divergence marked)
    and a PASS/FAIL summary line with the headline figures."""
    report._ensure_final()
    heading = (f"{report.ref_label} vs {report.got_label} · {report.dtype} · "
               f"{report.inputs or 'inputs not described'}"
               + (f" · seed {report.seed}" if report.seed is not None else ""))
    lines = []
    if report.generation is not None:
        g = report.generation
        lines.append((g.summary_text(), "red" if not g.passed else ("yellow" if g.first_diff_step is not None
                                                                     else "green")))
    lines += [(line, FAIL_STYLE) for line in report.divergence_lines()]
    if report.reference_line():
        lines.append((report.reference_line(), None))
    print_judged(console, heading, entry_tables(report), lines, report.verdict_text(), report.passed)
