"""Per-dtype pass criteria of `migrate diff`: the `Bounds` each kind of compared tensor is held to.

`Thresholds.for_dtype("bf16")` gives the defaults below; `with_overrides` (the ``--max-abs``,
``--cosine``, ``--top1``, ``--kl`` flags) and `with_cli_overrides` (``--threshold
KIND.NAME=VALUE``) replace some, checked by `migrate.judge.tolerances`. `judge.checks` applies
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

__all__ = ["KINDS", "OFF_FLOOR", "Bounds", "Thresholds", "fallback_factor"]

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

    With a noise reference (`judge.noise`: the metrics carry ``noise``, the reference
    side's own error against its float64 twin on the same inputs) two more apply:

    * ``noise``: K. The max-abs bound, the cosine distance (1 - cosine) and the KL bound
      each become the larger of their fixed value above and K x the reference's own figure,
      and top-1 disagreements within 2 K x the reference's RMS logit error are near ties,
      not judged. The fixed values stay as floors: where torch happens to be exact (an
      embedding lookup) or a model is small, they decide as before.
    * ``off_noise``: W, low precision only. The share of elements off by more than 5‰
      between the two sides must be at most W x the share by which the reference is off
      its float64 twin (at least `OFF_FLOOR`), replacing the fixed ``within`` share: a port
      that rounds where HF rounds agrees with HF far better than HF agrees with exact
      arithmetic; one that rounds elsewhere (a norm without the fp32 upcast) is an
      independent low-precision computation and lands outside.
    """

    max_abs: float | None = None
    max_abs_rel: float | None = None
    cosine: float | None = None
    top1: float | None = None
    kl: float | None = None
    match: float | None = None
    within: float | None = None
    noise: float | None = None
    off_noise: float | None = None
    fixed: frozenset = frozenset()   # bounds the user set: the noise reference does not widen them

    def max_abs_bound(self, ref_max_abs: float) -> float | None:
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


def _b(**kw) -> Bounds:
    return Bounds(**kw)


# The share of elements off by more than 5‰ a tensor may reach whatever its reference's own
# share (an embedding lookup is exact in any precision on both sides: a few flips are allowed).
OFF_FLOOR = 0.01

# Noise factors, measured on SmolLM2-135M (30 layers, real weights; docs/DESIGN.md "Noise
# reference"): the MindSpore-HF difference over HF's own error vs float64 reached 2.8 on
# hidden states, 1.0 on logits and 2.0 on the loss in fp32, 1.9 in bf16; 11.6 on gradients
# and 13.5 on parameters after one AdamW step (MindSpore's CPU kernels reduce over tokens in
# another order than torch's). The faults worth finding sit at 100x and beyond.
_K_FORWARD, _K_BACKWARD = 8.0, 32.0
_W = 1.25

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
_F, _B = dict(noise=_K_FORWARD), dict(noise=_K_BACKWARD)
_LOW = dict(noise=_K_FORWARD, off_noise=_W)
_DEFAULTS: dict[str, dict[str, Bounds]] = {
    "fp32": {
        "hidden": _b(max_abs=1e-5, max_abs_rel=1e-5, cosine=0.99999, **_F),
        "logits": _b(max_abs=1e-5, max_abs_rel=1e-5, cosine=0.99999, top1=0.999, kl=1e-7, **_F),
        "loss": _b(max_abs=1e-5, max_abs_rel=1e-5, **_F),
        "grad": _b(max_abs=1e-7, max_abs_rel=1e-4, cosine=0.99999, **_B),
        "param_after_step": _b(max_abs=1e-5, max_abs_rel=1e-5, cosine=0.99999, **_B),
        "generation": _b(max_abs=1e-5, max_abs_rel=1e-5, cosine=0.99999, top1=0.999, kl=1e-7,
                         match=1.0, **_F),
    },
    "fp16": {
        "hidden": _b(max_abs=1e-2, max_abs_rel=1e-2, cosine=0.9999, within=0.9, **_LOW),
        "logits": _b(max_abs=1e-2, max_abs_rel=1e-2, cosine=0.9999, top1=0.995, kl=1e-3, within=0.9, **_LOW),
        "loss": _b(max_abs=1e-3, max_abs_rel=1e-3, **_F),
        "grad": _b(cosine=0.999, **_B),
        "param_after_step": _b(cosine=0.9999, **_B),
        "generation": _b(max_abs=1e-2, max_abs_rel=1e-2, cosine=0.9999, top1=0.995, kl=1e-3, **_F),
    },
    "bf16": {
        "hidden": _b(cosine=0.999, within=0.9, **_LOW),
        "logits": _b(cosine=0.999, top1=0.99, kl=1e-2, within=0.9, **_LOW),
        "loss": _b(max_abs=1e-2, max_abs_rel=1e-2, **_F),
        "grad": _b(cosine=0.99, **_B),
        "param_after_step": _b(cosine=0.999, **_B),
        "generation": _b(cosine=0.999, top1=0.99, kl=1e-2, **_F),
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
    "noise": KINDS,
    "off_noise": ("hidden", "logits", "param_after_step", "generation"),
}


# Values an override may take ("threshold cosine must lie in [-1, 1]").
_ALLOWED: dict[str, Range] = {
    "max_abs": AT_LEAST_0, "max_abs_rel": AT_LEAST_0, "cosine": (-1.0, 1.0), "top1": (0.0, 1.0),
    "kl": AT_LEAST_0, "match": (0.0, 1.0), "within": (0.0, 1.0), "noise": AT_LEAST_0, "off_noise": AT_LEAST_0,
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
                current = getattr(self, k)
                fixed = current.fixed | {f for f in fields if f in ("max_abs", "max_abs_rel", "cosine", "top1", "kl")}
                if "max_abs" in fixed or "max_abs_rel" in fixed:
                    fixed |= {"max_abs", "max_abs_rel"}
                changes[k] = dataclasses.replace(current, fixed=frozenset(fixed), **fields)
        return dataclasses.replace(self, **changes)

    def scaled(self, factor: float) -> "Thresholds":
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
