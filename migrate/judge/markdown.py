"""The Markdown renderer: judged tables (failed rows in bold) and key / value tables."""
from __future__ import annotations

from collections.abc import Iterable

from migrate.judge.table import Table

__all__ = ["cell", "table", "key_values"]


def cell(text: object) -> str:
    """Text safe inside a table cell: pipes escaped, one line."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def _line(cells: Iterable[str]) -> str:
    return "|" + "|".join(f" {c} " if c else " " for c in cells) + "|"


def table(t: Table) -> list[str]:
    """The table's lines: header, rule, one line per row; every cell of a failed row in bold."""
    out = [_line(cell(c.name) for c in t.columns), "|" + "|".join("---" for _ in t.columns) + "|"]
    for row in t.rows:
        out.append(_line(f"**{cell(c)}**" if row.failed else cell(c) for c in row.cells))
    return out


def key_values(pairs: Iterable[tuple[str, str]]) -> list[str]:
    """A two-column table without a header: what a run was."""
    return ["| | |", "|---|---|", *(_line((cell(k), cell(v))) for k, v in pairs)]
