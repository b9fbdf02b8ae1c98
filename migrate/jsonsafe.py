"""JSON in and out. Out: strict-JSON conversion shared by the report writers (numpy scalars and
arrays become Python values, non-finite floats the strings "nan", "inf", "-inf"). In: `load_json`
and `parse_json`, the one way a JSON file from a folder a user may have been handed is read
(bounded in size and depth, refused in one line)."""
from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from migrate.errors import MigrateError


def jsonable(x: Any) -> Any:
    if isinstance(x, Mapping):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, np.ndarray):
        return [jsonable(v) for v in x.tolist()]
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        v = float(x)
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return v
    if x is None or isinstance(x, str):
        return x
    return str(x)  # paths and anything else: their text


# ---------- reading: JSON a user may have been handed ----------
# Every JSON file migrate reads from a folder (indexes, manifests, records, configs, logs) comes
# through `load_json` / `parse_json`: bounded in size before it is read and in depth before it is
# parsed (json's decoder recurses: a file of 100,000 '[' is a RecursionError, not a message), and
# refused in one line naming the file. `JSONError` is also a ValueError, so a reader that already
# tolerates an unreadable optional file (`except ValueError`) keeps doing so.
MAX_JSON_BYTES = 64 << 20   # a dump's modules.json of a 70B model is a few MB; an index a few hundred KB
MAX_JSON_DEPTH = 100        # nesting of arrays and objects; migrate's and HF's files use fewer than 10

_NOT_STRUCTURE = bytes(i for i in range(256) if i not in b'"[]{}')
_STRING = re.compile(rb'"[^"]*"')


class JSONError(MigrateError, ValueError):
    """A JSON file or line that cannot be read as JSON within the bounds: one line."""


def json_depth(raw: bytes) -> int:
    """The deepest nesting of arrays and objects in JSON text, brackets inside strings not counted;
    computed without recursion (C-speed passes: escapes dropped, then strings, then a running sum)."""
    structure = raw.replace(b"\\\\", b"").replace(b'\\"', b"").translate(None, _NOT_STRUCTURE)
    structure = _STRING.sub(b"", structure)
    if not structure:
        return 0
    codes = np.frombuffer(structure, np.uint8)
    return int(np.cumsum(np.where((codes == ord("[")) | (codes == ord("{")), 1, -1), dtype=np.int64).max())


def parse_json(raw: bytes | str, where: str, expect: type | tuple[type, ...] | None = None,
               parse_float=None) -> Any:
    """JSON text (a file's bytes, or one line of a .jsonl) as Python values, or JSONError naming
    `where`: not UTF-8, nested deeper than MAX_JSON_DEPTH, not JSON, or (with `expect`) of another
    type at the top. NaN and Infinity are read, as Python writes them (a diverged run's loss)."""
    if isinstance(raw, bytes):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise JSONError(f"{where}: not UTF-8 text (byte {exc.start})") from None
    else:
        text, raw = raw, raw.encode("utf-8", "surrogatepass")
    if json_depth(raw) > MAX_JSON_DEPTH:
        raise JSONError(f"{where}: nested more than {MAX_JSON_DEPTH} levels deep; refused")
    try:
        value = json.loads(text, parse_float=parse_float, object_pairs_hook=_unique_keys)
    except _DuplicateKey as exc:
        raise JSONError(f"{where}: key {exc.args[0]!r} appears twice in one object; which one is meant is "
                        f"ambiguous"[:300]) from None
    except (ValueError, RecursionError) as exc:
        raise JSONError(f"{where}: not JSON ({_first_line(exc)})") from None
    if expect is not None and not isinstance(value, expect):
        raise JSONError(f"{where}: expected {_kind(expect)}, found {_kind(type(value))}")
    return value


class _DuplicateKey(Exception):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict:
    """An object whose keys are all different: json keeps the last of a repeated key silently (a
    config.json with num_hidden_layers twice was planned with the second)."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return out


def load_json(path: str | Path, what: str = "", expect: type | tuple[type, ...] | None = None,
              max_bytes: int = MAX_JSON_BYTES, parse_float=None) -> Any:
    """The JSON file `path` (`what`: how errors name it, e.g. "dump record file"), read only when it is
    no larger than `max_bytes` (checked on the open file: a FIFO or a growing file cannot run past it).
    A file that cannot be opened raises its OSError (the command line turns it into one line)."""
    path = Path(path)
    where = f"{what} {path}" if what else str(path)
    if path.exists() and not path.is_file():  # open() of a FIFO blocks until a writer comes: refuse first
        raise JSONError(f"{where}: not a regular file")
    with open(path, "rb") as fh:
        raw = fh.read(max_bytes + 1)
    if len(raw) > max_bytes:
        raise JSONError(f"{where}: larger than {max_bytes >> 20} MiB; refused")
    return parse_json(raw, where, expect, parse_float)


def _kind(kinds) -> str:
    names = {dict: "an object", list: "an array", str: "a string", int: "an integer", float: "a number",
             bool: "true or false", type(None): "null"}
    kinds = kinds if isinstance(kinds, tuple) else (kinds,)
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else type(exc).__name__
