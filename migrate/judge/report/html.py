"""report.html: report.md's content on one self-contained page, the plot embedded."""
from __future__ import annotations

import base64
from typing import Any

from migrate.judge import html as h
from migrate.judge.report.tables import entry_tables, nonfinite_table, run_rows, thresholds_table

__all__ = ["render_html"]


def render_html(report: Any, png: bytes) -> str:
    report._ensure_final()
    esc = h.esc
    verdict = "PASS" if report.passed else "FAIL"
    parts = [f'<h1 class="{verdict.lower()}">Alignment report: {verdict}</h1>',
             f'<p class="verdict">{esc(report.verdict_text())}</p>']
    for line in report.divergence_lines():
        parts.append(f'<p class="div">{esc(line)}</p>')
    if report.reference_line():
        parts.append(f'<p>{esc(report.reference_line())}</p>')
    nonfinite = nonfinite_table(report)
    if nonfinite.rows:
        parts.append("<h2>NaN / Inf</h2><p>Any NaN or Inf in a compared tensor fails the comparison by itself.</p>")
        parts += h.table(nonfinite)
    parts += ["<h2>Run</h2>", *h.key_values(run_rows(report))]
    b64 = base64.b64encode(png).decode("ascii")
    parts.append(f'<h2>Per-layer error</h2><img alt="per-layer error" src="data:image/png;base64,{b64}">')
    for table in entry_tables(report):
        parts += [f"<h2>{esc(table.title)}</h2>", *h.table(table)]
    if report.generation is not None:
        g = report.generation
        parts.append(f"<h2>Generation</h2><p>{esc(g.summary_text())}</p><ul>")
        for label, toks in ((report.ref_label, g.ref_tokens), (report.got_label, g.got_tokens)):
            for r, row in enumerate(toks):
                parts.append(f"<li>{esc(label)} row {r}: <code>{esc(' '.join(str(t) for t in row))}</code></li>")
        parts.append("</ul>")
    parts += [f"<h2>Thresholds ({esc(report.thresholds.dtype)})</h2>", *h.table(thresholds_table(report))]
    return h.page(f"Alignment report: {verdict}", parts)
