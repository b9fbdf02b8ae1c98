"""The HTML renderer: one self-contained page of judged tables (failed rows red, the first
failure white on red) and key / value tables."""
from __future__ import annotations

import html
from collections.abc import Iterable

from migrate.judge.table import FAIL, FIRST, Table

__all__ = ["CSS", "page", "table", "key_values", "esc"]

esc = html.escape

CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:2em;color:#222}
h1.pass{color:#1a7f37}h1.fail{color:#cf222e}
table{border-collapse:collapse;margin:1em 0;font-size:13px}
th,td{border:1px solid #d0d7de;padding:3px 8px;text-align:right;white-space:nowrap}
td.l,th.l{text-align:left}td.status{text-align:left;white-space:normal}
tr.fail td{background:#ffebe9;color:#a40e26}
tr.first td{background:#cf222e;color:#fff;font-weight:bold}
.verdict{font-weight:bold;font-size:15px}.div{color:#cf222e;font-weight:bold}
img{max-width:100%;border:1px solid #d0d7de}code{font-size:12px;word-break:break-all}
"""
_ROW_CLASS = {FIRST: "first", FAIL: "fail"}


def page(title: str, body: Iterable[str]) -> str:
    """A whole document: `body` is a list of HTML fragments, one per line."""
    return "\n".join(["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
                      f"<title>{esc(title)}</title><style>{CSS}</style></head><body>",
                      *body, "</body></html>\n"])


def table(t: Table) -> list[str]:
    """The table as HTML fragments: left-aligned text columns, wrapping ones as "status"."""
    def klass(col) -> str:
        return "status" if col.left and col.wrap else ("l" if col.left else "")

    out = ["<table><tr>"]
    out += [f'<th class="{"l" if c.left else ""}">{esc(c.name)}</th>' for c in t.columns]
    out.append("</tr>")
    for row in t.rows:
        out.append(f'<tr class="{_ROW_CLASS.get(row.state, "")}">')
        out += [f'<td class="{klass(c)}">{esc(text)}</td>' for c, text in zip(t.columns, row.cells, strict=True)]
        out.append("</tr>")
    out.append("</table>")
    return out


def key_values(pairs: Iterable[tuple[str, str]]) -> list[str]:
    """A two-column table, keys as row headers: what a run was."""
    return ["<table>", *(f'<tr><th class="l">{esc(k)}</th><td class="l">{esc(v)}</td></tr>' for k, v in pairs),
            "</table>"]
