"""A judged table, whatever it is rendered into: columns, and rows of text that passed or failed.

A client builds `Table`s from its checks or compared tensors; `judge.terminal`,
`judge.markdown` and `judge.html` draw the same table on the console, in report.md and in
report.html, each marking failures its own way.
"""
from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Column", "Row", "Table", "OK", "FAIL", "FIRST", "NOT_JUDGED"]

# What a row says about its figures; each renderer picks the look.
OK, FAIL, FIRST, NOT_JUDGED = "ok", "fail", "first", "not judged"


@dataclass(frozen=True)
class Column:
    name: str
    left: bool = False   # text; figures are right-aligned
    wrap: bool = False   # long text may wrap (status, reasons); other columns stay on one line
    fold: bool = False   # on the console, fold an overlong cell instead of ending it with "…"


@dataclass
class Row:
    cells: list[str]
    state: str = OK      # OK, FAIL, FIRST (the first failure: marked hardest) or NOT_JUDGED

    @property
    def failed(self) -> bool:
        return self.state in (FAIL, FIRST)


@dataclass
class Table:
    columns: list[Column]
    rows: list[Row] = field(default_factory=list)
    title: str | None = None

    def add(self, cells: list[str], state: str = OK) -> None:
        self.rows.append(Row([str(c) for c in cells], state))
