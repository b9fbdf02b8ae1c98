"""Per-dtype pass criteria of `migrate diff`: the `Bounds` each kind of compared tensor is held to.

`Thresholds.for_dtype("bf16")` gives the defaults below; `with_overrides` (the ``--max-abs``,
``--cosine``, ``--top1``, ``--kl`` flags) and `with_cli_overrides` (``--threshold
KIND.NAME=VALUE``) replace some, checked by `migrate.judge.tolerances`. `align.checks` applies
them to a metrics dict.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from migrate.errors import MigrateError
from migrate.judge.tolerances import AT_LEAST_0, Range, parse_spec, validated
from migrate.dtype_names import canonical_dtype

__all__ = ["KINDS", "Bounds", "Thresholds"]

KINDS = ("hidden", "logits", "loss", "grad", "param_after_step", "generation")


@dataclass(frozen=True)
class Bounds:
    """Pass criteria for one kind of entry at one dtype. None = not checked.

    * ``max_abs`` / ``max_abs_rel``: max|ref - got| must not exceed
      ``max(max_abs, max_abs_rel * max|ref|)`` -- an absolute bound for tensors
      of unit scale that grows with the tensor's peak magnitude, so it stays a
      fixed number of ulps of the peak. With one of the two None only the
      other applies.
    * ``cosine``: cosine >= bound. Not checked when both sides' peak magnitude
      is within ``max_abs`` (the tensor is zero at that tolerance and has no
      direction to compare).
    * ``top1``: share of positions with the same argmax >= bound (logits).
    * ``kl``: mean KL(softmax(ref) || softmax(got)) <= bound (logits).
    * ``match``: greedy generation; the share of steps before the first
      differing token >= bound (1.0: identical generations).
    * ``within``: share of elements within 5‰ relative error (the zero-safe
      rule of `tensor_metrics`) >= bound. In low precision this catches a
      systematic one-ulp drift -- an op computed in bf16 that HF computes in
      fp32 -- which leaves the cosine near 1 but moves half of the elements.
    A bound whose metric is absent from the metrics dict is not applied.
    """

    max_abs: float | None = None
    max_abs_rel: float | None = None
    cosine: float | None = None
    top1: float | None = None
    kl: float | None = None
    match: float | None = None
    within: float | None = None

    def max_abs_bound(self, ref_max_abs: float) -> float | None:
        if self.max_abs is None and self.max_abs_rel is None:
            return None
        parts = []
        if self.max_abs is not None:
            parts.append(self.max_abs)
        if self.max_abs_rel is not None and math.isfinite(ref_max_abs):
            parts.append(self.max_abs_rel * ref_max_abs)
        return max(parts) if parts else 0.0

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _b(**kw) -> Bounds:
    return Bounds(**kw)


# Defaults. Reference points from the field: Hugging Face's cross-framework tests
# use max abs <= 1e-5 on outputs (fp32, tiny models); msprobe flags cosine < 0.99.
# fp32: 1e-5 "in units of max(1, max|ref|)" and cosine >= 1 - 1e-5 everywhere;
#       gradients are judged relative to their peak (1e-4 * max|ref|, floor 1e-7)
#       because gradients of small models are often ~1e-3, where an absolute 1e-5
#       would allow a 1 % error. Greedy generation must be identical.
# bf16: no max-abs bound on tensors (8 mantissa bits: one ulp at 4.0 is 0.03);
#       cosine >= 0.999, top-1 >= 0.99, KL <= 1e-2; gradients cosine >= 0.99;
#       hidden states and logits: >= 90 % of elements within 5‰ (one bf16 ulp
#       is 0.4-0.8 %), which a correct port meets and a missing fp32 upcast breaks.
# fp16: in between (10 mantissa bits).
# In bf16 / fp16 free-running generation is reported but not judged: one near-tie
# flip changes every later token, so it measures luck more than correctness; the
# teacher-forced top-1 / KL on the logits are the judged signal there.
_DEFAULTS: dict[str, dict[str, Bounds]] = {
    "fp32": {
        "hidden": _b(max_abs=1e-5, max_abs_rel=1e-5, cosine=0.99999),
        "logits": _b(max_abs=1e-5, max_abs_rel=1e-5, cosine=0.99999, top1=0.999, kl=1e-7),
        "loss": _b(max_abs=1e-5, max_abs_rel=1e-5),
        "grad": _b(max_abs=1e-7, max_abs_rel=1e-4, cosine=0.99999),
        "param_after_step": _b(max_abs=1e-5, max_abs_rel=1e-5, cosine=0.99999),
        "generation": _b(max_abs=1e-5, max_abs_rel=1e-5, cosine=0.99999, top1=0.999, kl=1e-7,
                         match=1.0),
    },
    "fp16": {
        "hidden": _b(max_abs=1e-2, max_abs_rel=1e-2, cosine=0.9999, within=0.9),
        "logits": _b(max_abs=1e-2, max_abs_rel=1e-2, cosine=0.9999, top1=0.995, kl=1e-3, within=0.9),
        "loss": _b(max_abs=1e-3, max_abs_rel=1e-3),
        "grad": _b(cosine=0.999),
        "param_after_step": _b(cosine=0.9999),
        "generation": _b(max_abs=1e-2, max_abs_rel=1e-2, cosine=0.9999, top1=0.995, kl=1e-3),
    },
    "bf16": {
        "hidden": _b(cosine=0.999, within=0.9),
        "logits": _b(cosine=0.999, top1=0.99, kl=1e-2, within=0.9),
        "loss": _b(max_abs=1e-2, max_abs_rel=1e-2),
        "grad": _b(cosine=0.99),
        "param_after_step": _b(cosine=0.999),
        "generation": _b(cosine=0.999, top1=0.99, kl=1e-2),
    },
}

# Kinds a kind-less override reaches (a kind-specific override reaches its kind).
_APPLIES_TO = {
    "max_abs": KINDS,
    "max_abs_rel": KINDS,
    "cosine": ("hidden", "logits", "grad", "param_after_step", "generation"),
    "top1": ("logits", "generation"),
    "kl": ("logits", "generation"),
    "match": ("generation",),
    "within": ("hidden", "logits", "param_after_step", "generation"),
}


# Values an override may take ("threshold cosine must lie in [-1, 1]").
_ALLOWED: dict[str, Range] = {
    "max_abs": AT_LEAST_0, "max_abs_rel": AT_LEAST_0, "cosine": (-1.0, 1.0), "top1": (0.0, 1.0),
    "kl": AT_LEAST_0, "match": (0.0, 1.0), "within": (0.0, 1.0),
}


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
    def for_dtype(cls, dtype: Any) -> "Thresholds":
        return cls(dtype)

    def bounds(self, kind: str) -> Bounds:
        if kind not in KINDS:
            raise ValueError(f"unknown entry kind {kind!r}; expected one of {', '.join(KINDS)}")
        return getattr(self, kind)

    def with_overrides(self, kind: str | None = None, **values: float | None) -> "Thresholds":
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
                changes[k] = dataclasses.replace(getattr(self, k), **fields)
        return dataclasses.replace(self, **changes)

    def with_cli_overrides(self, specs: Iterable[str]) -> "Thresholds":
        """Apply ``NAME=VALUE`` or ``KIND.NAME=VALUE`` strings, e.g. ``cosine=0.9999``,
        ``logits.top1=0.98``, ``grad.max-abs=1e-6``. Bad specs are a MigrateError."""
        out = self
        for kind, name, value in map(parse_spec, specs):
            out = out.with_overrides(kind, **{"top1" if name == "top_1" else name: value})
        return out

    def to_dict(self) -> dict:
        return {"dtype": self.dtype, **{k: getattr(self, k).to_dict() for k in KINDS}}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Thresholds":
        return cls(data.get("dtype", "fp32"),
                   **{k: Bounds(**data[k]) for k in KINDS if data.get(k) is not None})
