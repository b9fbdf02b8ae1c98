"""report.md: the verdict, the NaN/Inf section, the run, the plot, the entry tables, the
generation and the thresholds."""
from __future__ import annotations

from typing import Any

from migrate.judge import markdown as md
from migrate.judge.report.tables import entry_tables, nonfinite_table, run_rows, thresholds_table

__all__ = ["render_markdown"]


def render_markdown(report: Any, image_name: str = "per_layer_error.png") -> str:
    report._ensure_final()
    out = [f"# Alignment report: {'PASS' if report.passed else 'FAIL'}", "",
           f"**{md.cell(report.verdict_text())}**", ""]
    for line in report.divergence_lines():
        out.append(f"- {md.cell(line)}")
    if report.reference_line():
        out.append(f"- {md.cell(report.reference_line())}")
    if report.divergence_lines() or report.reference_line():
        out.append("")
    nonfinite = nonfinite_table(report)
    if nonfinite.rows:
        out += ["## NaN / Inf", "", "Any NaN or Inf in a compared tensor fails the comparison by itself.", "",
                *md.table(nonfinite), ""]
    out += ["## Run", "", *md.key_values(run_rows(report))]
    out += ["", f"![per-layer error]({image_name})", ""]
    for table in entry_tables(report):
        out += [f"## {table.title}", "", *md.table(table), ""]
    if report.generation is not None:
        g = report.generation
        out += ["## Generation", "", md.cell(g.summary_text()), ""]
        for label, toks in ((report.ref_label, g.ref_tokens), (report.got_label, g.got_tokens)):
            for r, row in enumerate(toks):
                out.append(f"- {label} row {r}: `{' '.join(str(t) for t in row)}`")
        out.append("")
    out += ["## Thresholds", "", f"dtype {report.thresholds.dtype}; None = not checked.", "",
            *md.table(thresholds_table(report)), ""]
    return "\n".join(out)
