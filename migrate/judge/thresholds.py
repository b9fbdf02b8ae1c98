"""Per-dtype pass criteria of `migrate diff`: the `Bounds` each kind of compared tensor is held to.

`Bounds`' fields, their defaults, which kinds a kind-less override reaches and the values it
may take are not written here: each bound is declared once in `judge.bounds`, beside its
check, and this module builds the dataclass and the tables from those declarations.
`Thresholds.for_dtype("bf16")` gives the defaults; `with_overrides` (the ``--max-abs``,
``--cosine``, ``--top1``, ``--kl`` flags) and `with_cli_overrides` (``--threshold
KIND.NAME=VALUE``) replace some, checked by `migrate.judge.tolerances`. `judge.checks` applies
them to a metrics dict.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from migrate.dtype_names import canonical_dtype
from migrate.errors import MigrateError
from migrate.judge.bounds import KINDS, METRICS, OFF_FLOOR
from migrate.judge.tolerances import Range, parse_spec, validated

__all__ = ["KINDS", "OFF_FLOOR", "Bounds", "Thresholds", "fallback_factor"]


class _BoundsRules:
    """What every `Bounds` does, whatever bounds are declared."""

    def max_abs_bound(self, ref_max_abs: float) -> float | None:
        """max(max_abs, max_abs_rel x max|ref|): an absolute bound for tensors of unit scale that
        grows with the tensor's peak magnitude, so it stays a fixed number of ulps of the peak.
        With one of the two None only the other applies; None when neither is set."""
        if self.max_abs is None and self.max_abs_rel is None:
            return None
        parts = []
        if self.max_abs is not None:
            parts.append(self.max_abs)
        if self.max_abs_rel is not None and math.isfinite(ref_max_abs):
            parts.append(self.max_abs_rel * ref_max_abs)
        return max(parts) if parts else 0.0

    def widens(self, name: str) -> float | None:
        """K for bound `name` ("max_abs", "cosine", "kl", "top1"), or None when the noise
        reference does not widen it (no factor, or the user set that bound)."""
        return None if name in self.fixed else self.noise

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["fixed"] = sorted(self.fixed)
        return d


_BOUNDS_DOC = """Pass criteria for one kind of entry at one dtype, one field per bound declared in
`judge.bounds` (its ``doc`` says what each holds). None = not checked; a bound whose metric is
absent from the metrics dict is not applied. ``fixed``: the bounds the user set, which the noise
reference does not widen."""

Bounds = dataclasses.make_dataclass(
    "Bounds", [(name, "float | None", dataclasses.field(default=None)) for name in METRICS]
    + [("fixed", "frozenset", dataclasses.field(default=frozenset()))],
    bases=(_BoundsRules,), frozen=True, namespace={"__doc__": _BOUNDS_DOC, "__module__": __name__})

# Per dtype and kind, from the declarations' defaults.
_DEFAULTS: dict[str, dict[str, Bounds]] = {
    dt: {kind: Bounds(**{name: spec.defaults.get(dt, {}).get(kind) for name, spec in METRICS.items()})
         for kind in KINDS}
    for dt in ("fp32", "fp16", "bf16")
}
# Kinds a kind-less override reaches (a kind-specific override reaches its kind).
_APPLIES_TO = {name: spec.reaches for name, spec in METRICS.items()}
# Values an override may take ("threshold cosine must lie in [-1, 1]").
_ALLOWED: dict[str, Range] = {name: spec.allowed for name, spec in METRICS.items()}
# Bounds the noise reference widens unless the user set them.
_WIDENED = frozenset(name for name, spec in METRICS.items() if spec.widened)


@dataclass(frozen=True)
class Thresholds:
    """Per-kind `Bounds` for one dtype ('fp32', 'bf16' or 'fp16').

    ``Thresholds("bf16")`` gives the defaults; any kind passed explicitly
    replaces its default. Use `with_overrides` / `with_cli_overrides` for
    user-supplied values.
    """

    dtype: str = "fp32"
    hidden: Bounds | None = None
    logits: Bounds | None = None
    loss: Bounds | None = None
    grad: Bounds | None = None
    param_after_step: Bounds | None = None
    generation: Bounds | None = None
    state: Bounds | None = None     # a training state's tensors (`migrate.state_diff`)
    counter: Bounds | None = None   # a training state's counts, held equal

    def __post_init__(self):
        dt = canonical_dtype(self.dtype)
        object.__setattr__(self, "dtype", dt)
        for kind in KINDS:
            value = getattr(self, kind)
            if value is None:
                object.__setattr__(self, kind, _DEFAULTS[dt][kind])
            elif isinstance(value, Mapping):
                object.__setattr__(self, kind, Bounds(**value))

    @classmethod
    def for_dtype(cls, dtype: Any) -> Thresholds:
        return cls(dtype)

    def bounds(self, kind: str) -> Bounds:
        if kind not in KINDS:
            raise ValueError(f"unknown entry kind {kind!r}; expected one of {', '.join(KINDS)}")
        return getattr(self, kind)

    def with_overrides(self, kind: str | None = None, **values: float | None) -> Thresholds:
        """A copy with some bounds replaced (values that are None are left alone).

        ``kind=None`` applies each value to every kind it makes sense for
        (top1 / kl: logits and generation; match: generation; cosine: all but
        loss; max_abs: all). Semantics, for CLI flags:

        * giving ``max_abs`` without ``max_abs_rel`` makes the bound purely
          absolute (the default peak-relative part is dropped): an explicit
          ``--max-abs 1e-4`` means exactly max abs <= 1e-4;
        * ``math.inf`` for max_abs / kl, -1 for cosine, 0 for top1 / match
          disable a check.
        """
        if kind is not None and kind not in KINDS:
            raise MigrateError(f"unknown entry kind {kind!r}; expected one of {', '.join(KINDS)}")
        given = validated("threshold", values, _ALLOWED)
        if not given:
            return self
        if "max_abs" in given and "max_abs_rel" not in given:
            given["max_abs_rel"] = None
        changes = {}
        for k in KINDS:
            if kind is not None and k != kind:
                continue
            fields = {
                f: v for f, v in given.items()
                if kind is not None or k in _APPLIES_TO[f]
            }
            if fields:
                current = getattr(self, k)
                fixed = current.fixed | {f for f in fields if f in _WIDENED}
                if "max_abs" in fixed or "max_abs_rel" in fixed:
                    fixed |= {"max_abs", "max_abs_rel"}
                changes[k] = dataclasses.replace(current, fixed=frozenset(fixed), **fields)
        return dataclasses.replace(self, **changes)

    def scaled(self, factor: float) -> Thresholds:
        """The documented fallback where no noise reference was measured: every max-abs bound
        (absolute and peak-relative) times `factor` (`fallback_factor`), user-set ones kept."""
        changes = {}
        for k in KINDS:
            b = getattr(self, k)
            if {"max_abs", "max_abs_rel"} & b.fixed:
                continue
            changes[k] = dataclasses.replace(
                b, max_abs=None if b.max_abs is None else b.max_abs * factor,
                max_abs_rel=None if b.max_abs_rel is None else b.max_abs_rel * factor)
        return dataclasses.replace(self, **changes)

    def with_cli_overrides(self, specs: Iterable[str]) -> Thresholds:
        """Apply ``NAME=VALUE`` or ``KIND.NAME=VALUE`` strings, e.g. ``cosine=0.9999``,
        ``logits.top1=0.98``, ``grad.max-abs=1e-6``. Bad specs are a MigrateError."""
        out = self
        for kind, name, value in map(parse_spec, specs):
            out = out.with_overrides(kind, **{"top1" if name == "top_1" else name: value})
        return out

    def to_dict(self) -> dict:
        return {"dtype": self.dtype, **{k: getattr(self, k).to_dict() for k in KINDS}}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Thresholds:
        def bounds(d: Mapping[str, Any]) -> Bounds:
            d = dict(d)
            d["fixed"] = frozenset(d.get("fixed") or ())
            return Bounds(**d)

        return cls(data.get("dtype", "fp32"), **{k: bounds(data[k]) for k in KINDS if data.get(k) is not None})


# The tiny models the fixed bounds were calibrated on: 2 layers of width 64.
_CALIBRATED_LAYERS, _CALIBRATED_WIDTH = 2, 64


def fallback_factor(num_layers: int | None, hidden: int | None) -> float:
    """How much the fixed max-abs bounds widen for a model of this depth and width when no noise
    reference was measured: sqrt(layers / 2 x width / 64), at least 1. Rounding error of a sum of
    n terms grows like sqrt(n) (width), and each layer feeds the next one's error forward
    (depth); measured on SmolLM2-135M (30 x 576: factor 11.6), the correct conversion needs 1.9
    on hidden states and 1.4 on gradients."""
    depth = max(1.0, (num_layers or _CALIBRATED_LAYERS) / _CALIBRATED_LAYERS)
    width = max(1.0, (hidden or _CALIBRATED_WIDTH) / _CALIBRATED_WIDTH)
    return math.sqrt(depth * width)
