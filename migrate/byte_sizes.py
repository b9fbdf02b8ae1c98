"""Sizes in bytes as a user writes them: "1.9GB", "500MB", "2GiB", "4096" (HF's max_shard_size
convention: KB/MB/GB are powers of 10, KiB/MiB/GiB powers of 2). One parser for every option that
takes one (`--max-shard-size`, `--device-memory`); a size below one byte is a typo, not a question.
"""
from __future__ import annotations

import re

import numpy as np

from migrate.errors import MigrateError

__all__ = ["parse_size", "parse_memory_size"]

_UNITS = {
    "": 1, "B": 1,
    "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
    "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40,
}
_SIZE = re.compile(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*")


def parse_size(size: int | str, *, unreadable: str | None = None, nonpositive: str | None = None) -> int:
    """Bytes from an int or a string like "1.9GB"; MigrateError otherwise. `unreadable` and
    `nonpositive` word the two refusals for the caller's option ({size} is the value as given)."""
    if isinstance(size, (int, np.integer)) and not isinstance(size, bool):
        value = int(size)
    else:
        match = _SIZE.fullmatch(str(size))
        unit = match.group(2).upper() if match else None
        if unit not in _UNITS:
            raise MigrateError((unreadable or "cannot read size {size}: use a number of bytes or a unit like "
                                "500MB, 1.9GB, 2GiB").format(size=repr(size)))
        value = int(float(match.group(1)) * _UNITS[unit])
    if value < 1:
        raise MigrateError((nonpositive or "size must be positive, got {size}").format(size=repr(size)))
    return value


def parse_memory_size(text: str) -> int:
    """'64GB', '80GiB', '1.5TB' -> bytes. Device memory is quoted in GB by vendors but means GiB in
    practice; GB here is taken literally (10**9) -- pass GiB if you mean it."""
    return parse_size(text, unreadable="not a memory size: {size} (try 64GB or 80GiB)",
                      nonpositive="a memory size must be positive, got {size}")
