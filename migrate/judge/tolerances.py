"""Overriding bounds: how every user-supplied tolerance is read and validated.

Each client keeps its bounds in a frozen dataclass with per-dtype defaults (`for_dtype`):
`migrate diff`'s `judge.thresholds.Thresholds`, `migrate compare`'s
`compare.tolerances.Tolerances`. Overrides arrive as keyword values (None keeps the
default, ``math.inf`` disables a bound) or, on the command line, as ``NAME=VALUE`` /
``KIND.NAME=VALUE`` strings; both are validated here, so a typo or an out-of-range bound is
one line naming it, never a silently ignored value.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from migrate.errors import MigrateError

__all__ = ["Range", "AT_LEAST_0", "bound_value", "validated", "parse_spec"]

Range = tuple[float | None, float | None]   # (lowest, highest) allowed value; None: unbounded
AT_LEAST_0: Range = (0.0, None)


def bound_value(word: str, name: str, value: Any, allowed: Range = (None, None)) -> float:
    """`value` as a float bound, or a MigrateError that names the ``word name`` ("threshold cosine")."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise MigrateError(f"{word} {name}: {value!r} is not a number") from None
    if math.isnan(v):
        raise MigrateError(f"{word} {name}: NaN is not a valid bound")
    low, high = allowed
    if low is not None and high is not None and not low <= v <= high:
        raise MigrateError(f"{word} {name} must lie in [{low:g}, {high:g}], got {v}")
    if low is not None and v < low:
        raise MigrateError(f"{word} {name} must be >= {low:g}, got {v}")
    return v


def validated(word: str, values: Mapping[str, Any], allowed: Mapping[str, Range]) -> dict[str, float]:
    """The given values (None ones left out) as checked floats; an unknown name is a MigrateError
    listing the known ones."""
    unknown = set(values) - set(allowed)
    if unknown:
        raise MigrateError(f"unknown {word} {', '.join(sorted(unknown))}; expected one of {', '.join(allowed)}")
    return {k: bound_value(word, k, v, allowed[k]) for k, v in values.items() if v is not None}


def parse_spec(spec: str, word: str = "threshold") -> tuple[str | None, str, str]:
    """A command-line override, ``NAME=VALUE`` or ``KIND.NAME=VALUE``, as (kind or None, name,
    value text); dashes read as underscores (``grad.max-abs=1e-6``)."""
    key, sep, value = str(spec).partition("=")
    if not sep or not key.strip() or not value.strip():
        raise MigrateError(f"{word} override {spec!r}: expected NAME=VALUE or KIND.NAME=VALUE")
    kind, _, name = key.strip().rpartition(".")
    return kind.replace("-", "_") or None, name.replace("-", "_"), value.strip()
