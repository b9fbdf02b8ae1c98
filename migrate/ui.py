"""Terminal output through rich: one console, progress bars on stderr."""
from __future__ import annotations

from contextlib import contextmanager
from functools import lru_cache

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


@lru_cache(maxsize=1)
def console() -> Console:
    # Piped output (CI logs, files) gets a wide fixed width instead of rich's 80 columns.
    probe = Console()
    return probe if probe.is_terminal else Console(width=140)


@contextmanager
def progress_bar(label: str):
    """Yields update(name, done, total); draws only on a terminal."""
    err = Console(stderr=True)
    if not err.is_terminal:
        yield lambda *_: None
        return
    with Progress(TextColumn(f"{label} {{task.description}}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=err, transient=True) as progress:
        task = progress.add_task("", total=None)

        def update(name: str, done: int, total: int) -> None:
            progress.update(task, description=name, completed=done, total=total)

        yield update
