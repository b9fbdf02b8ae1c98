"""The JSON renderer: strict JSON (non-finite floats as "nan" / "inf" strings, numpy values as
Python ones, through `migrate.jsonsafe`), written atomically."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from migrate.checkpoints.atomic import atomic_write_text
from migrate.jsonsafe import jsonable

__all__ = ["dumps", "write_json"]


def dumps(data: Any, *, ascii_only: bool = False) -> str:
    """Indented strict JSON with a final newline. ``ascii_only`` escapes every non-ASCII
    character (compare.json has always been written that way)."""
    return json.dumps(jsonable(data), indent=2, ensure_ascii=ascii_only, allow_nan=False) + "\n"


def write_json(path: Any, data: Any, *, ascii_only: bool = False) -> Path:
    """`dumps(data)` written atomically: a reader never sees half a file."""
    return atomic_write_text(path, dumps(data, ascii_only=ascii_only))
