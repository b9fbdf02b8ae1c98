"""`from_pretrained` with transformers' load report kept off the terminal unless the load succeeds.

A folder whose weights do not fit its config makes transformers print a multi-line LOAD REPORT table
and then raise "look at the above report"; a command's bad input is one line. The report is caught
while loading: on success it is printed as transformers would have printed it, on failure its first
problem row (a size mismatch, a missing or unexpected key) goes into the one MigrateError line.
"""
from __future__ import annotations

import logging
import re

from migrate.errors import MigrateError

_ROW = re.compile(r"^\s*(?P<key>\S+)\s*\|\s*(?P<status>MISMATCH|MISSING|UNEXPECTED)\s*\|\s*(?P<why>.*)$", re.M)


class _Kept(logging.Handler):
    def __init__(self):
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)


def from_pretrained(model_class, folder, **kwargs):
    """`model_class.from_pretrained(folder, local_files_only=True, **kwargs)`; one MigrateError line on failure."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    root = hf_logging.get_logger()  # the "transformers" logger, whose handler writes to stderr
    kept, handlers, level = _Kept(), list(root.handlers), root.level
    for handler in handlers:
        root.removeHandler(handler)
    root.addHandler(kept)
    root.setLevel(min(level or logging.WARNING, logging.WARNING))  # the report, even where verbosity is lower
    try:
        model = model_class.from_pretrained(str(folder), local_files_only=True, **kwargs)
    except Exception as exc:
        raise MigrateError(f"transformers cannot load {folder}: {_why(exc, kept.records)}") from None
    finally:
        root.removeHandler(kept)
        root.setLevel(level)
        for handler in handlers:
            root.addHandler(handler)
    for record in kept.records:  # a load that worked says what transformers would have said
        if record.levelno >= root.getEffectiveLevel():
            root.handle(record)
    return model


def _why(exc: Exception, records) -> str:
    text = "\n".join(r.getMessage() for r in records)
    row = _ROW.search(re.sub(r"\x1b\[[0-9;]*m", "", text))
    if row is not None:
        return f"{row['key']}: {row['status'].lower()}, {row['why'].strip()}"[:300]
    lines = str(exc).strip().splitlines()
    return (lines[0] if lines else type(exc).__name__)[:300]


__all__ = ["from_pretrained"]
