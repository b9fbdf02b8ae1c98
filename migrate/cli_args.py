"""Argument types every verb shares, and the parser that reports a bad argument in one line.

A number's shape (an integer >= 1, a share in [0, 1], a finite float, a 32-bit seed) is checked
as argparse reads it, so `--batch 0` or `--max-unk-share nan` is refused before any model loads:

    p.add_argument("--batch", type=POSITIVE_INT)       # migrate: error: dump: argument --batch: must be an
                                                       # integer >= 1, got '0'

A value the library already refuses in one line before it allocates (`--dp 0`, `--top-p 1.5`,
`--max-new-tokens 0`) stays the library's, so API callers get the same check; these types are for
options nothing else checked. What depends on the model or the machine (a length past the learned
positions, a cache larger than the memory available) is checked by the library where the model's
config is read, before anything is allocated (`migrate.resources`).
"""
from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable

from migrate.errors import MigrateError

__all__ = ["Parser", "integer", "number", "utf8_text", "POSITIVE_INT", "COUNT", "SEED", "SHARE", "POSITIVE",
           "NON_NEGATIVE"]


# A value that starts like a negative number is a value, not an option: argparse's own pattern takes
# only "-1" and "-1.5", so `--ids -1,2` or `--ids "-1 2"` ended as "expected one argument" and the
# value's own check (negative ids, here) never ran. No option of migrate looks like a number.
_NEGATIVE_VALUE = re.compile(r"^-\.?\d")


class Parser(argparse.ArgumentParser):
    """argparse's parser whose errors are `MigrateError`s: one `migrate: error:` line, exit 2, and
    no usage block (`migrate VERB --help` has it). Subparsers are built of this class too."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = _NEGATIVE_VALUE  # argparse reads it in _parse_optional

    def error(self, message: str):
        verb = self.prog.removeprefix("migrate").strip()
        raise MigrateError(f"{verb}: {message}" if verb else message)


def _shown(text: str) -> str:
    return repr(text if len(text) <= 40 else text[:40] + "...")


def integer(lo: int | None = None, hi: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer in [lo, hi] (either end open when None)."""
    bounds = (f" in {lo}..{hi}" if lo is not None and hi is not None
              else f" >= {lo}" if lo is not None else f" <= {hi}" if hi is not None else "")

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or (lo is not None and value < lo) or (hi is not None and value > hi):
            raise argparse.ArgumentTypeError(f"must be an integer{bounds}, got {_shown(text)}")
        return value

    parse.__name__ = "integer"
    return parse


def number(lo: float | None = None, hi: float | None = None, *, above: bool = False) -> Callable[[str], float]:
    """An argparse type: a finite float in [lo, hi] ((lo, hi] with `above`); NaN and inf are refused."""
    if lo is not None and hi is not None:
        bounds = f" in {'(' if above else '['}{lo:g}, {hi:g}]"
    elif lo is not None:
        bounds = f" {'>' if above else '>='} {lo:g}"
    else:
        bounds = f" <= {hi:g}" if hi is not None else ""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        ok = math.isfinite(value) and (lo is None or (value > lo if above else value >= lo)) \
            and (hi is None or value <= hi)
        if not ok:
            raise argparse.ArgumentTypeError(f"must be a finite number{bounds}, got {_shown(text)}")
        return value

    parse.__name__ = "number"
    return parse


def utf8_text(text: str) -> str:
    """An argparse type: text that is valid UTF-8 (a prompt, --text). Bytes that are not arrive as
    lone surrogates (Python's surrogateescape), which no tokenizer takes."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        code = ord(exc.object[exc.start])
        what = f"byte 0x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"U+{code:04X}"
        raise argparse.ArgumentTypeError(f"is not valid UTF-8 text ({what} at character {exc.start})") from None
    return text


POSITIVE_INT = integer(1)               # sizes, lengths, counts of things that must exist
COUNT = integer(0)                      # 0 means none / off
SEED = integer(0, 2**32 - 1)            # numpy's legacy seeding, torch and MindSpore take 32 bits
SHARE = number(0.0, 1.0)                # a fraction of rows or tokens
POSITIVE = number(0.0, above=True)      # a rate, a learning rate
NON_NEGATIVE = number(0.0)
