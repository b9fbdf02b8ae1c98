"""Tensor-by-tensor comparison metrics and pass/fail thresholds.

Everything here works on plain numpy arrays and knows nothing of PyTorch or
MindSpore. `ref` is always the reference side (the Hugging Face model), `got`
the converted one. Inputs of any float dtype are accepted -- float32, float16
and bfloat16 (MindSpore's `mindspore.common.np_dtype.bfloat16`, or any numpy
extension dtype that casts to float64) -- and upcast to float64 before any
arithmetic, a chunk at a time so that a 150k-vocabulary logits tensor or an
embedding gradient does not need several float64 copies of itself at once.

Rules (all documented values are module constants):

* NaN / Inf. Each element is classed as finite, NaN, +Inf or -Inf, and each
  side's counts and first few positions are recorded (`nan_ref`, `inf_got`,
  `nonfinite_ref_at`, ...). Any NaN or Inf, on either side, fails the entry
  on its own (`judge`), even where both sides hold it at the same positions:
  a converted model that computes NaN is broken whatever the reference does,
  and agreement on NaN says nothing about the numbers. `nonfinite_match`
  still says whether the two sides agree on the class at every position.
  All value metrics (max_abs, max_rel, mean_abs, cosine) are computed over
  the positions that are finite on *both* sides (`finite_compared` of
  `numel`); with no such position they are NaN -- never a 0 / 1 that reads
  as perfect agreement. Positions that are the same non-finite value on both
  sides count as agreeing in the `within_*` shares.

* Zero-safe relative error. ``rel = |ref - got| / max(|ref|, floor)`` with
  ``floor = max(REL_FLOOR_FRACTION * mean|ref|, REL_FLOOR_MIN)``: an element
  smaller than 1/1000 of the tensor's mean magnitude is measured against that
  floor instead of its own (near-zero) size, so a 1e-9 wobble around an exact
  zero does not read as an infinite relative error. `max_rel` is the largest
  such ratio; ``within_1e-3`` / ``within_5e-3`` are the shares of all elements
  with ``rel <= tol``, i.e. ``|ref - got| <= tol * max(|ref|, floor)`` (a
  relative tolerance with an absolute floor of ``tol * floor``) -- the same
  rule as max_rel, so the figures agree with each other.

* Cosine similarity, in float64, of the flattened tensors (finite positions).
  Two all-zero tensors have cosine 1; an all-zero tensor against a non-zero
  one has cosine 0.

* Shape mismatch is not an exception: the result carries ``error`` and is
  judged as failed.

Thresholds: see `Bounds` and `Thresholds`; `judge` applies them.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import numpy as np

from migrate.errors import MigrateError

__all__ = [
    "NONFINITE_POSITIONS",
    "REL_FLOOR_FRACTION",
    "REL_FLOOR_MIN",
    "WITHIN_TOLERANCES",
    "KINDS",
    "Bounds",
    "Thresholds",
    "canonical_dtype",
    "tensor_metrics",
    "logits_metrics",
    "generation_metrics",
    "token_rows",
    "judge",
    "nonfinite_count",
    "nonfinite_side",
    "nonfinite_text",
    "fmt_cosine",
    "fmt_num",
]

NONFINITE_POSITIONS = 5     # positions of NaN / Inf recorded per side (flat order)
REL_FLOOR_FRACTION = 1e-3   # floor of the relative-error denominator, as a share of mean|ref|
REL_FLOOR_MIN = 1e-30       # absolute floor, so an all-zero reference still divides safely
WITHIN_TOLERANCES = (1e-3, 5e-3)  # reported as "within_1e-3", "within_5e-3"
CHUNK_ELEMENTS = 1 << 22    # elements upcast to float64 at a time (32 MiB per array)

KINDS = ("hidden", "logits", "loss", "grad", "param_after_step", "generation")

_FINITE, _NAN, _POSINF, _NEGINF = 0, 1, 2, 3


# --------------------------------------------------------------------------- inputs

def _as_array(x: Any, side: str) -> np.ndarray:
    arr = np.asarray(x)
    kind = arr.dtype.kind
    if kind in "fiub":
        return arr
    if kind == "c":
        raise TypeError(f"{side}: complex tensors are not supported")
    # Extension float dtypes (bfloat16 from MindSpore / ml_dtypes) have kind 'V';
    # accept anything that casts to float64.
    try:
        arr.reshape(-1)[:1].astype(np.float64)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{side}: cannot compare arrays of dtype {arr.dtype}") from exc
    return arr


def _chunks(n: int, size: int = CHUNK_ELEMENTS):
    for start in range(0, n, size):
        yield start, min(n, start + size)


def _classify(x: np.ndarray) -> np.ndarray:
    cls = np.zeros(x.shape, dtype=np.int8)
    cls[np.isnan(x)] = _NAN
    cls[np.isposinf(x)] = _POSINF
    cls[np.isneginf(x)] = _NEGINF
    return cls


def _shape_error(ref: np.ndarray, got: np.ndarray) -> dict:
    return {
        "error": f"shape mismatch: ref {tuple(ref.shape)} vs got {tuple(got.shape)}",
        "shape_ref": list(ref.shape),
        "shape_got": list(got.shape),
        "dtype_ref": str(ref.dtype),
        "dtype_got": str(got.dtype),
    }


# --------------------------------------------------------------------------- metrics

def tensor_metrics(ref: Any, got: Any) -> dict:
    """Compare two arrays element by element (see the module docstring for the rules).

    Returns a JSON-friendly dict (python floats / ints / lists):
    ``shape, numel, dtype_ref, dtype_got, max_abs, max_abs_index, max_rel,
    mean_abs, cosine, within_1e-3, within_5e-3, ref_max_abs, got_max_abs,
    ref_mean_abs, rel_floor, finite_compared, nan_ref, nan_got, inf_ref,
    inf_got, nonfinite_ref_at, nonfinite_got_at, nonfinite_mismatches,
    nonfinite_match``; ``nonfinite_*_at`` are the first `NONFINITE_POSITIONS`
    indices (flat order, unravelled) holding NaN or Inf on that side. On a
    shape mismatch it returns
    ``error, shape_ref, shape_got, dtype_ref, dtype_got`` instead.
    """
    ref = _as_array(ref, "ref")
    got = _as_array(got, "got")
    if ref.shape != got.shape:
        return _shape_error(ref, got)

    a_flat = ref.reshape(-1)
    b_flat = got.reshape(-1)
    n = int(a_flat.size)

    # Pass 1: non-finite bookkeeping and reference scale.
    nan_ref = nan_got = inf_ref = inf_got = 0
    at_ref: list[int] = []
    at_got: list[int] = []
    mismatches = 0
    same_nonfinite = 0
    n_finite = 0
    sum_abs_ref = 0.0
    ref_max = 0.0
    got_max = 0.0
    for lo, hi in _chunks(n):
        a = a_flat[lo:hi].astype(np.float64)
        b = b_flat[lo:hi].astype(np.float64)
        fin_a, fin_b = np.isfinite(a), np.isfinite(b)
        if fin_a.all() and fin_b.all():
            fa, fb = np.abs(a), np.abs(b)
        else:
            ca, cb = _classify(a), _classify(b)
            nan_ref += int(np.count_nonzero(ca == _NAN))
            nan_got += int(np.count_nonzero(cb == _NAN))
            inf_ref += int(np.count_nonzero(ca >= _POSINF))
            inf_got += int(np.count_nonzero(cb >= _POSINF))
            mismatches += int(np.count_nonzero(ca != cb))
            for at, fin in ((at_ref, fin_a), (at_got, fin_b)):
                if len(at) < NONFINITE_POSITIONS:
                    at.extend(lo + int(i) for i in np.flatnonzero(~fin)[:NONFINITE_POSITIONS - len(at)])
            same_nonfinite += int(np.count_nonzero((ca == cb) & (ca != _FINITE)))
            both = fin_a & fin_b
            fa, fb = np.abs(a[both]), np.abs(b[both])
        n_finite += int(fa.size)
        if fa.size:
            sum_abs_ref += float(fa.sum())
            ref_max = max(ref_max, float(fa.max()))
            got_max = max(got_max, float(fb.max()))

    ref_mean = sum_abs_ref / n_finite if n_finite else 0.0
    floor = max(REL_FLOOR_FRACTION * ref_mean, REL_FLOOR_MIN)

    # Pass 2: differences.
    max_abs = 0.0
    max_abs_at = -1
    max_rel = 0.0
    sum_abs_diff = 0.0
    within = [0 for _ in WITHIN_TOLERANCES]
    dot = na2 = nb2 = 0.0
    with np.errstate(invalid="ignore", over="ignore"):
        for lo, hi in _chunks(n):
            a = a_flat[lo:hi].astype(np.float64)
            b = b_flat[lo:hi].astype(np.float64)
            both = np.isfinite(a) & np.isfinite(b)
            if both.all():
                idx, fa, fb = None, a, b
            elif both.any():
                idx = np.flatnonzero(both)
                fa, fb = a[idx], b[idx]
            else:
                continue
            d = np.abs(fa - fb)
            k = int(np.argmax(d))
            if d[k] > max_abs or max_abs_at < 0:
                max_abs = float(d[k])
                max_abs_at = lo + (k if idx is None else int(idx[k]))
            sum_abs_diff += float(d.sum())
            rel = d / np.maximum(np.abs(fa), floor)
            max_rel = max(max_rel, float(rel.max()))
            for i, tol in enumerate(WITHIN_TOLERANCES):
                within[i] += int(np.count_nonzero(rel <= tol))
            dot += float(np.dot(fa, fb))
            na2 += float(np.dot(fa, fa))
            nb2 += float(np.dot(fb, fb))

    if n and not n_finite:
        cosine = math.nan   # nothing finite to compare: no direction, and no agreement either
    elif na2 == 0.0 and nb2 == 0.0:
        cosine = 1.0
    elif na2 == 0.0 or nb2 == 0.0:
        cosine = 0.0
    else:
        denom = na2 * nb2   # sqrt(x * x) == x exactly, so identical tensors give exactly 1
        denom = math.sqrt(denom) if math.isfinite(denom) and denom > 0 else math.sqrt(na2) * math.sqrt(nb2)
        cosine = dot / denom
        cosine = float(min(1.0, max(-1.0, cosine)))

    unmeasured = bool(n) and not n_finite   # every position non-finite on one side at least

    def where(flat: int) -> list[int]:
        return [int(i) for i in np.unravel_index(flat, ref.shape)]

    out: dict[str, Any] = {
        "shape": list(ref.shape),
        "numel": n,
        "dtype_ref": str(ref.dtype),
        "dtype_got": str(got.dtype),
        "max_abs": math.nan if unmeasured else max_abs,
        "max_abs_index": where(max_abs_at) if max_abs_at >= 0 else None,
        "max_rel": math.nan if unmeasured else max_rel,
        "mean_abs": math.nan if unmeasured else (sum_abs_diff / n_finite if n_finite else 0.0),
        "cosine": cosine,
    }
    for i, tol in enumerate(WITHIN_TOLERANCES):
        out[f"within_{tol:.0e}".replace("e-0", "e-")] = (
            (within[i] + same_nonfinite) / n if n else 1.0
        )
    out.update({
        "ref_max_abs": ref_max,
        "got_max_abs": got_max,
        "ref_mean_abs": ref_mean,
        "rel_floor": floor,
        "finite_compared": n_finite,
        "nan_ref": nan_ref,
        "nan_got": nan_got,
        "inf_ref": inf_ref,
        "inf_got": inf_got,
        "nonfinite_ref_at": [where(i) for i in at_ref],
        "nonfinite_got_at": [where(i) for i in at_got],
        "nonfinite_mismatches": mismatches,
        "nonfinite_match": mismatches == 0,
    })
    return out


def _log_softmax(x: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax in float64; -inf entries stay -inf."""
    m = np.max(x, axis=-1, keepdims=True)
    z = x - m
    return z - np.log(np.sum(np.exp(z), axis=-1, keepdims=True))


def logits_metrics(ref: Any, got: Any) -> dict:
    """`tensor_metrics` plus distribution metrics over the last axis (the vocabulary).

    Every leading index is a position. Added keys:

    * ``kl``: mean over positions of KL(softmax(ref) || softmax(got)), float64,
      via a max-shifted log-softmax; per-position values below 0 (rounding)
      are clipped to 0. ``kl_max`` is the largest per-position value.
    * ``top1``: share of positions whose argmax agrees; ``top1_mismatches`` the
      count and ``top1_first_mismatch`` the index of the first disagreeing
      position (leading dims) or None.
    * ``positions``: how many positions entered these figures. A position whose
      row holds a NaN or +Inf on either side (or is all -Inf) is left out --
      those are already counted and judged by the NaN/Inf rule.

    With no usable position, ``kl`` and ``top1`` are None (not measured).
    """
    ref = _as_array(ref, "ref")
    got = _as_array(got, "got")
    out = tensor_metrics(ref, got)
    if "error" in out:
        out.update({"kl": None, "kl_max": None, "top1": None, "positions": 0})
        return out
    if ref.ndim == 0:
        out.update({"error": "logits need a vocabulary axis (got a 0-d array)",
                    "kl": None, "kl_max": None, "top1": None, "positions": 0})
        return out

    vocab = ref.shape[-1]
    lead = ref.shape[:-1]
    rows = int(np.prod(lead, dtype=np.int64)) if lead else 1
    a_rows = ref.reshape(rows, vocab)
    b_rows = got.reshape(rows, vocab)

    kl_sum = 0.0
    kl_max = 0.0
    agree = 0
    used = 0
    first_mismatch = None
    if vocab:
        step = max(1, CHUNK_ELEMENTS // vocab)
        with np.errstate(all="ignore"):
            for lo in range(0, rows, step):
                a = a_rows[lo:lo + step].astype(np.float64)
                b = b_rows[lo:lo + step].astype(np.float64)
                bad = (np.isnan(a) | np.isposinf(a)).any(-1) | (np.isnan(b) | np.isposinf(b)).any(-1)
                bad |= np.isneginf(a).all(-1) | np.isneginf(b).all(-1)
                good = np.flatnonzero(~bad)
                if not good.size:
                    continue
                a, b = a[good], b[good]
                la, lb = _log_softmax(a), _log_softmax(b)
                p = np.exp(la)
                terms = np.where(p > 0, p * (la - lb), 0.0)
                kl_rows = np.maximum(terms.sum(-1), 0.0)
                kl_sum += float(kl_rows.sum())
                kl_max = max(kl_max, float(kl_rows.max()))
                same = np.argmax(a, -1) == np.argmax(b, -1)
                agree += int(np.count_nonzero(same))
                used += int(good.size)
                if first_mismatch is None and not same.all():
                    r = lo + int(good[int(np.argmin(same))])
                    first_mismatch = [int(i) for i in np.unravel_index(r, lead)] if lead else []

    out.update({
        "kl": kl_sum / used if used else None,
        "kl_max": kl_max if used else None,
        "top1": agree / used if used else None,
        "top1_mismatches": used - agree,
        "top1_first_mismatch": first_mismatch,
        "positions": used,
    })
    return out


def token_rows(tokens: Any) -> list[list[int]]:
    """Token ids as a list of rows: 1-d -> one row, 2-d (batch, steps) or ragged lists -> rows."""
    if isinstance(tokens, (list, tuple)) and tokens and all(
        isinstance(r, (list, tuple, np.ndarray)) for r in tokens
    ):
        return [[int(t) for t in np.asarray(r).reshape(-1)] for r in tokens]
    arr = np.asarray(tokens)
    if arr.ndim == 0:
        return [[int(arr)]]
    if arr.ndim == 1:
        return [[int(t) for t in arr]]
    if arr.ndim == 2:
        return [[int(t) for t in row] for row in arr]
    raise TypeError(f"generated tokens must be 1-d or 2-d, got shape {arr.shape}")


def generation_metrics(ref_tokens: Any, got_tokens: Any) -> dict:
    """Compare two greedy generations token by token.

    Tokens are 1-d (one sequence) or 2-d (batch, steps). A step differs when
    any row differs at it, or when one side has stopped (shorter row) and the
    other has not. Returns ``steps`` (the longer length), ``first_diff_step``
    (0-based, None when identical), ``matching_prefix`` (steps before the first
    difference), ``match_share`` (= matching_prefix / steps, 1.0 when both are
    empty), ``ref_token`` / ``got_token`` at the first difference (row 0 of
    the differing rows; None past a row's end) and ``diff_row``.
    """
    ra, rb = token_rows(ref_tokens), token_rows(got_tokens)
    rows = max(len(ra), len(rb))
    steps = max([len(r) for r in ra + rb], default=0)
    first = None
    diff_row = None
    for t in range(steps):
        for r in range(rows):
            x = ra[r][t] if r < len(ra) and t < len(ra[r]) else None
            y = rb[r][t] if r < len(rb) and t < len(rb[r]) else None
            if x != y:
                first, diff_row = t, r
                break
        if first is not None:
            break
    prefix = steps if first is None else first

    def at(rows_, r, t):
        return rows_[r][t] if r < len(rows_) and t < len(rows_[r]) else None

    return {
        "steps": steps,
        "rows": rows,
        "first_diff_step": first,
        "matching_prefix": prefix,
        "match_share": prefix / steps if steps else 1.0,
        "diff_row": diff_row,
        "ref_token": at(ra, diff_row, first) if first is not None else None,
        "got_token": at(rb, diff_row, first) if first is not None else None,
    }


# --------------------------------------------------------------------------- thresholds

def canonical_dtype(dtype: Any) -> str:
    """'fp32' / 'bf16' / 'fp16' for the usual spellings (numpy dtypes, 'torch.bfloat16',
    'mindspore.float16', 'float32', 'half', ...). Anything else is a MigrateError."""
    if isinstance(dtype, str):
        name = dtype
    elif isinstance(dtype, np.dtype) or (isinstance(dtype, type) and issubclass(dtype, np.generic)):
        name = np.dtype(dtype).name
    else:
        name = str(dtype)
    key = name.strip().lower().rsplit(".", 1)[-1]
    aliases = {
        "fp32": "fp32", "float32": "fp32", "f32": "fp32", "float": "fp32", "single": "fp32",
        "bf16": "bf16", "bfloat16": "bf16",
        "fp16": "fp16", "float16": "fp16", "f16": "fp16", "half": "fp16",
    }
    if key not in aliases:
        raise MigrateError(f"unknown dtype {dtype!r} for thresholds: expected fp32, bf16 or fp16")
    return aliases[key]


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

_BOUND_FIELDS = tuple(f.name for f in dataclasses.fields(Bounds))
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


def _check_override(name: str, value: float) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise MigrateError(f"threshold {name}: {value!r} is not a number") from None
    if math.isnan(v):
        raise MigrateError(f"threshold {name}: NaN is not a valid bound")
    if name == "cosine" and not -1.0 <= v <= 1.0:
        raise MigrateError(f"threshold cosine must lie in [-1, 1], got {v}")
    if name in ("top1", "match", "within") and not 0.0 <= v <= 1.0:
        raise MigrateError(f"threshold {name} must lie in [0, 1], got {v}")
    if name in ("max_abs", "max_abs_rel", "kl") and v < 0:
        raise MigrateError(f"threshold {name} must be >= 0, got {v}")
    return v


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
        unknown = set(values) - set(_BOUND_FIELDS)
        if unknown:
            raise MigrateError(
                f"unknown threshold {', '.join(sorted(unknown))}; expected {', '.join(_BOUND_FIELDS)}"
            )
        if kind is not None and kind not in KINDS:
            raise MigrateError(f"unknown entry kind {kind!r}; expected one of {', '.join(KINDS)}")
        given = {k: _check_override(k, v) for k, v in values.items() if v is not None}
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
        for spec in specs:
            key, sep, value = str(spec).partition("=")
            if not sep or not key.strip() or not value.strip():
                raise MigrateError(f"threshold override {spec!r}: expected NAME=VALUE or KIND.NAME=VALUE")
            kind, _, name = key.strip().rpartition(".")
            name = name.replace("-", "_")
            kind = kind.replace("-", "_") or None
            if name == "top_1":
                name = "top1"
            out = out.with_overrides(kind, **{name: value.strip()})
        return out

    def to_dict(self) -> dict:
        return {"dtype": self.dtype, **{k: getattr(self, k).to_dict() for k in KINDS}}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Thresholds":
        return cls(data.get("dtype", "fp32"),
                   **{k: Bounds(**data[k]) for k in KINDS if data.get(k) is not None})


# --------------------------------------------------------------------------- judging

def fmt_num(x: Any, digits: int = 2) -> str:
    """Compact scientific formatting: 3.2e-04, 0, nan, inf, — for None."""
    if x is None:
        return "—"
    if isinstance(x, bool):
        return str(x)
    if isinstance(x, int):
        return str(x)
    x = float(x)
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if x == 0:
        return "0"
    return f"{x:.{digits}e}"


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


def _fmt_share(x: float) -> str:
    return f"{x:.4g}"


def _bad(x: Any) -> bool:
    return isinstance(x, float) and math.isnan(x)


def nonfinite_count(metrics: Mapping[str, Any]) -> int:
    """NaN and Inf elements on both sides together (0 for metrics without the counts)."""
    return sum(int(metrics.get(k) or 0) for k in ("nan_ref", "inf_ref", "nan_got", "inf_got"))


def _positions(at: Any, limit: int, count: int) -> str:
    """The first `limit` positions, with "…" when the side holds more than are shown."""
    at = list(at or [])
    text = ", ".join(str(list(i)) for i in at[:limit])
    return text + (", …" if text and count > min(limit, len(at)) else "")


def nonfinite_side(metrics: Mapping[str, Any], side: str, positions: int = 3) -> str:
    """One side's ("ref" / "got") NaN / Inf: "finite", or "3 NaN, 1 Inf of 40 at [0, 2], [1, 0], …"."""
    nan, inf = int(metrics.get(f"nan_{side}") or 0), int(metrics.get(f"inf_{side}") or 0)
    if not nan and not inf:
        return "finite"
    counts = ", ".join(t for t in (nan and f"{nan} NaN", inf and f"{inf} Inf") if t)
    of = f" of {metrics['numel']}" if metrics.get("numel") is not None else ""
    at = _positions([i for i in metrics.get(f"nonfinite_{side}_at") or [] if i], positions, nan + inf)  # []: scalar
    return f"{counts}{of}" + (f" at {at}" if at else "")


def nonfinite_text(metrics: Mapping[str, Any], ref_label: str = "ref", got_label: str = "got",
                   positions: int = 3) -> str:
    """"NaN/Inf at 3 positions on one side (ref: finite | got: 3 NaN of 10 at [2], [5], [7])".

    Counts and first positions per side; whether the sides agree on the positions.
    Never contains "; " (the separator of `judge`'s reasons)."""
    mism = metrics.get("nonfinite_mismatches")
    match = metrics.get("nonfinite_match")
    if match is False:
        head = f"NaN/Inf positions differ at {mism if mism is not None else '?'} positions"
    else:
        head = "NaN/Inf at the same positions on both sides" if match else "NaN/Inf"
    return (f"{head} ({ref_label}: {nonfinite_side(metrics, 'ref', positions)} | "
            f"{got_label}: {nonfinite_side(metrics, 'got', positions)})")


def judge(metrics: Mapping[str, Any], kind: str, thresholds: Thresholds | str) -> tuple[bool, str | None]:
    """Apply ``thresholds.bounds(kind)`` to a metrics dict.

    Returns ``(passed, reason)``; reason is None when passed, otherwise every
    failing check, most fundamental first, joined by "; " -- e.g.
    ``"cosine 0.93 < 0.99999; max_abs 3.10e-01 > 2.66e-05 = 1e-05 × max|ref| 2.66"``.
    Order: shape/other error, NaN/Inf, cosine, max_abs, top1, kl, match.
    Any NaN or Inf element, on either side, fails by itself (`nonfinite_text`).
    A metric that is None (not measured) is skipped; a NaN metric fails.
    """
    if not isinstance(thresholds, Thresholds):
        thresholds = Thresholds(thresholds)
    b = thresholds.bounds(kind)
    if metrics.get("error"):
        return False, str(metrics["error"])
    fails: list[str] = []
    if nonfinite_count(metrics):
        fails.append(nonfinite_text(metrics))

    cos = metrics.get("cosine")
    if b.cosine is not None and cos is not None:
        peak = max(float(metrics.get("ref_max_abs") or 0.0), float(metrics.get("got_max_abs") or 0.0))
        zero = b.max_abs is not None and peak <= b.max_abs
        if _bad(cos) or (not zero and cos < b.cosine):
            fails.append(f"cosine {fmt_cosine(cos)} < {fmt_cosine(b.cosine)}")

    mab = metrics.get("max_abs")
    if mab is not None:
        ref_peak = float(metrics.get("ref_max_abs") or 0.0)
        bound = b.max_abs_bound(ref_peak)
        if bound is not None and (_bad(mab) or mab > bound):
            text = f"max_abs {fmt_num(mab)} > {fmt_num(bound)}"
            if b.max_abs_rel is not None and (b.max_abs is None or bound > b.max_abs):
                text += f" = {b.max_abs_rel:g} × max|ref| {ref_peak:.3g}"
            fails.append(text)

    within = metrics.get("within_5e-3")
    if b.within is not None and within is not None and (_bad(within) or within < b.within):
        fails.append(f"within 5‰ {within:.1%} < {b.within:.0%}")

    top1 = metrics.get("top1")
    if b.top1 is not None and top1 is not None and (_bad(top1) or top1 < b.top1):
        fails.append(f"top1 {_fmt_share(top1)} < {_fmt_share(b.top1)}")

    kl = metrics.get("kl")
    if b.kl is not None and kl is not None and (_bad(kl) or kl > b.kl):
        fails.append(f"kl {fmt_num(kl)} > {fmt_num(b.kl, 0)}")

    share = metrics.get("match_share")
    if b.match is not None and share is not None and share < b.match:
        fails.append(
            f"generation differs at step {metrics.get('first_diff_step')} of {metrics.get('steps')} "
            f"(matching prefix {share:.0%} < {b.match:.0%})"
        )
    return (not fails), ("; ".join(fails) if fails else None)
