"""Tensor-by-tensor comparison metrics: what `migrate diff` measures.

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

* Declared figures. A bound declared in `judge.bounds` with a ``compute(ref, got)`` adds its
  figures to every `tensor_metrics` result (and so to `logits_metrics`'), computed on the two
  arrays as given.

What passes: `judge.bounds` declares each bound with its check, `judge.thresholds` holds the
per-dtype bounds, `judge.checks` applies them.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from migrate.judge.bounds import METRICS

__all__ = [
    "NONFINITE_POSITIONS",
    "REL_FLOOR_FRACTION",
    "REL_FLOOR_MIN",
    "WITHIN_TOLERANCES",
    "tensor_metrics",
    "logits_metrics",
    "generation_metrics",
    "token_rows",
]

NONFINITE_POSITIONS = 5     # positions of NaN / Inf recorded per side (flat order)
REL_FLOOR_FRACTION = 1e-3   # floor of the relative-error denominator, as a share of mean|ref|
REL_FLOOR_MIN = 1e-30       # absolute floor, so an all-zero reference still divides safely
WITHIN_TOLERANCES = (1e-3, 5e-3)  # reported as "within_1e-3", "within_5e-3"
CHUNK_ELEMENTS = 1 << 22    # elements upcast to float64 at a time (32 MiB per array)

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


def _chunks(n: int, size: int | None = None):
    size = size or CHUNK_ELEMENTS  # read at call time, so the chunk size can be changed (tests do)
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
    mean_abs, rms (root mean square of the difference), cosine, within_1e-3, within_5e-3, ref_max_abs, got_max_abs,
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
    sum_sq_diff = 0.0
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
            sum_sq_diff += float(np.dot(d, d))
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
        "rms": math.nan if unmeasured else (math.sqrt(sum_sq_diff / n_finite) if n_finite else 0.0),
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
    for spec in METRICS.values():   # figures of the bounds declared with their own computation
        if spec.compute is not None:
            out.update(spec.compute(ref, got))
    return out


def _log_softmax(x: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax in float64; -inf entries stay -inf."""
    m = np.max(x, axis=-1, keepdims=True)
    z = x - m
    return z - np.log(np.sum(np.exp(z), axis=-1, keepdims=True))


def logits_metrics(ref: Any, got: Any, tie_margin: float | None = None) -> dict:
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

    * ``tie_margin`` (given when a noise reference says how far the reference's own logits may
      be off): a disagreement where the reference's logits of its choice and of the other
      side's choice are within ``tie_margin`` of each other is a near tie -- either answer is
      right at this precision. ``top1_ties`` counts those, ``top1_decisive`` is the agreement
      over the other positions (None when every position is a near tie).

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
    ties = 0
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
                top_a, top_b = np.argmax(a, -1), np.argmax(b, -1)
                same = top_a == top_b
                if tie_margin is not None and not same.all():
                    rows_ = np.arange(len(a))
                    tie = ~same & (a[rows_, top_a] - a[rows_, top_b] <= tie_margin)
                    ties += int(np.count_nonzero(tie))
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
    if tie_margin is not None:
        decisive = used - ties
        out.update({"top1_ties": ties, "top1_tie_margin": float(tie_margin),
                    "top1_decisive": agree / decisive if used and decisive else None})
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
