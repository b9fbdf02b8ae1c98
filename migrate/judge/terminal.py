"""The console renderer: a bold heading, judged tables, notes, and the verdict line last.

Failed rows are red, the first failure white on red, rows not judged dim; the verdict line is
bold green or bold red. Both `migrate diff` and `migrate compare` print through `print_judged`.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rich.console import Console
from rich.table import Table as RichTable
from rich.text import Text

from migrate.judge.table import FAIL, FIRST, NOT_JUDGED, Table

__all__ = ["print_judged", "FAIL_STYLE", "NOTE_STYLE"]

ROW_STYLES = {FIRST: "bold white on red", FAIL: "red", NOT_JUDGED: "dim"}
FAIL_STYLE = "bold red"   # lines that name a failure
NOTE_STYLE = "yellow"     # notes: what was not judged, or judged with a caveat


def _rich(table: Table) -> RichTable:
    out = RichTable(title=table.title, title_justify="left", pad_edge=False)
    for col in table.columns:
        extra = {"overflow": "fold"} if col.fold else {}
        out.add_column(col.name, justify="left" if col.left else "right", no_wrap=not col.wrap, **extra)
    for row in table.rows:
        out.add_row(*[Text(c) for c in row.cells], style=ROW_STYLES.get(row.state))
    return out


def print_judged(console: Any, heading: str, tables: Iterable[Table], lines: Iterable[tuple[str, str | None]],
                 verdict_line: str, passed: bool) -> None:
    """Print `heading`, each table, each (text, rich style) line, then `verdict_line`."""
    console = console or Console()
    console.print(Text(heading, style="bold"))
    for table in tables:
        console.print(_rich(table))
    for text, style in lines:
        console.print(Text(text, style=style))
    console.print(Text(verdict_line, style="bold green" if passed else "bold red"))
