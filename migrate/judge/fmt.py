"""How figures read in verdicts, tables and notes: one spelling for every renderer."""
from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

__all__ = ["fmt_num", "fmt_figure", "fmt_cosine", "fmt_share", "fmt_pct", "short"]


def fmt_num(x: Any, digits: int = 2, nan: str = "nan") -> str:
    """Compact scientific formatting: 3.20e-04, 0, inf, ``nan`` for NaN, — for None;
    integers and booleans as they are."""
    if x is None:
        return "—"
    if isinstance(x, (bool, np.bool_)):
        return str(bool(x))
    if isinstance(x, (int, np.integer)):
        return str(int(x))
    x = float(x)
    if math.isnan(x):
        return nan
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if x == 0:
        return "0"
    return f"{x:.{digits}e}"


def fmt_figure(x: Any) -> str:
    """A figure measured over a run: as `fmt_num`, but "n/a" where it could not be measured
    (NaN: no step to measure it on)."""
    return fmt_num(x, nan="n/a")


def fmt_cosine(c: Any) -> str:
    """Cosine with enough decimals to show its distance from 1: 0.93, 0.99999, 0.9999999."""
    if c is None:
        return "—"
    c = float(c)
    if math.isnan(c):
        return "nan"
    if c >= 1.0:
        return "1"
    gap = 1.0 - c
    if gap < 1e-9:
        return f"1-{gap:.1e}"
    decimals = max(math.ceil(-math.log10(gap)) + 1, 2) if gap < 1 else 2
    text = f"{c:.{decimals}f}".rstrip("0")
    return text + "0" if text.endswith(".") else text


def fmt_share(x: float) -> str:
    """A share in [0, 1] with four significant digits: 0.9987."""
    return f"{x:.4g}"


def fmt_pct(x: Any) -> str:
    """A share as a percentage: 99.87%, nan, — for None."""
    if x is None:
        return "—"
    if isinstance(x, float) and math.isnan(x):
        return "nan"
    return f"{float(x):.2%}"


def short(value: Any, limit: int = 60) -> str:
    """A configuration value in one short line: 0.1, "cosine", [40 values], cut with … past `limit`."""
    if isinstance(value, float):
        text = f"{value:.6g}"
    elif isinstance(value, list) and len(value) > 6 and all(isinstance(v, (int, float)) for v in value):
        text = f"[{len(value)} values]"
    else:
        text = json.dumps(value, default=str) if not isinstance(value, str) else value
    return text if len(text) <= limit else text[:limit - 1] + "…"
