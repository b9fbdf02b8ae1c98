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
from collections.abc import Sequence
from typing import Any

import numpy as np

from migrate.judge import pair_kernel
from migrate.judge.bounds import METRICS

__all__ = [
    "NONFINITE_POSITIONS",
    "REL_FLOOR_FRACTION",
    "REL_FLOOR_MIN",
    "WITHIN_TOLERANCES",
    "tensor_metrics",
    "tensor_metrics_among",
    "logits_metrics",
    "generation_metrics",
    "token_rows",
]

NONFINITE_POSITIONS = 5     # positions of NaN / Inf recorded per side (flat order)
REL_FLOOR_FRACTION = 1e-3   # floor of the relative-error denominator, as a share of mean|ref|
REL_FLOOR_MIN = 1e-30       # absolute floor, so an all-zero reference still divides safely
WITHIN_TOLERANCES = (1e-3, 5e-3)  # reported as "within_1e-3", "within_5e-3"
# Elements upcast to float64 at a time: 256 KiB per array, so a chunk's four float64 scratch buffers and
# the two source slices stay in a 2 MiB L2 while a dozen operations read them. Measured, three calls on
# 16 M elements: 0.42 s at 2**15, 0.45 s at 2**16, 0.51 s at 2**18; and chunks of 2**22 (32 MiB, above
# glibc's largest mmap threshold) were fresh mappings first-touched page by page on every use (4.4x slower
# per operation than 2 MiB ones).
CHUNK_ELEMENTS = 1 << 15

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

class _Sums:
    """What one pass over a tensor pair accumulates, chunk by chunk, all in float64 (see
    `tensor_metrics`). `floor` None: the relative figures are not measured."""

    def __init__(self, floor: float | None):
        self.floor = floor
        self.nan_ref = self.nan_got = self.inf_ref = self.inf_got = 0
        self.at_ref: list[int] = []
        self.at_got: list[int] = []
        self.mismatches = self.same_nonfinite = self.n_finite = 0
        self.ref_max = self.got_max = 0.0
        self.max_abs, self.max_abs_at, self.max_rel = 0.0, -1, 0.0
        self.sum_abs_diff = self.sum_sq_diff = 0.0
        self.within = [0 for _ in WITHIN_TOLERANCES]
        self.dot = self.na2 = self.nb2 = 0.0

    def finite_chunk(self, a: np.ndarray, b: np.ndarray, lo: int, na2: float, nb2: float, d: np.ndarray,
                     t: np.ndarray) -> None:
        """A chunk finite on both sides (float64 `a`, `b`), with `d` and `t` as scratch of its size:
        every figure from the two chunks and two scratch buffers, nothing allocated."""
        self.n_finite += a.size
        self.na2 += na2
        self.nb2 += nb2
        self.dot += float(np.dot(a, b))
        np.subtract(a, b, out=d)
        np.abs(d, out=d)
        k = int(np.argmax(d))
        if d[k] > self.max_abs or self.max_abs_at < 0:
            self.max_abs, self.max_abs_at = float(d[k]), lo + k
        self.sum_abs_diff += float(d.sum())
        self.sum_sq_diff += float(np.dot(d, d))
        np.abs(a, out=t)
        self.ref_max = max(self.ref_max, float(t.max()))
        self.got_max = max(self.got_max, float(b.max()), -float(b.min()))
        if self.floor is not None:
            np.maximum(t, self.floor, out=t)
            np.divide(d, t, out=t)
            self.max_rel = max(self.max_rel, float(t.max()))
            for i, tol in enumerate(WITHIN_TOLERANCES):
                self.within[i] += int(np.count_nonzero(t <= tol))

    def nonfinite_chunk(self, a: np.ndarray, b: np.ndarray, lo: int) -> None:
        """A chunk holding NaN or Inf on either side: each element classed, the values measured over
        the positions finite on both."""
        fin_a, fin_b = np.isfinite(a), np.isfinite(b)
        ca, cb = _classify(a), _classify(b)
        self.nan_ref += int(np.count_nonzero(ca == _NAN))
        self.nan_got += int(np.count_nonzero(cb == _NAN))
        self.inf_ref += int(np.count_nonzero(ca >= _POSINF))
        self.inf_got += int(np.count_nonzero(cb >= _POSINF))
        self.mismatches += int(np.count_nonzero(ca != cb))
        for at, fin in ((self.at_ref, fin_a), (self.at_got, fin_b)):
            if len(at) < NONFINITE_POSITIONS:
                at.extend(lo + int(i) for i in np.flatnonzero(~fin)[:NONFINITE_POSITIONS - len(at)])
        self.same_nonfinite += int(np.count_nonzero((ca == cb) & (ca != _FINITE)))
        idx = np.flatnonzero(fin_a & fin_b)
        if not idx.size:
            return
        fa, fb = a[idx], b[idx]
        self.n_finite += int(idx.size)
        self.ref_max = max(self.ref_max, float(np.abs(fa).max()))
        self.got_max = max(self.got_max, float(np.abs(fb).max()))
        d = np.abs(fa - fb)
        k = int(np.argmax(d))
        if d[k] > self.max_abs or self.max_abs_at < 0:
            self.max_abs, self.max_abs_at = float(d[k]), lo + int(idx[k])
        self.sum_abs_diff += float(d.sum())
        self.sum_sq_diff += float(np.dot(d, d))
        if self.floor is not None:
            rel = d / np.maximum(np.abs(fa), self.floor)
            self.max_rel = max(self.max_rel, float(rel.max()))
            for i, tol in enumerate(WITHIN_TOLERANCES):
                self.within[i] += int(np.count_nonzero(rel <= tol))
        self.dot += float(np.dot(fa, fb))
        self.na2 += float(np.dot(fa, fa))
        self.nb2 += float(np.dot(fb, fb))


def _ref_scale(a_flat: np.ndarray, b_flat: np.ndarray, n: int) -> float:
    """mean |ref| over the positions finite on both sides: the relative figures' floor needs it
    before their pass. A chunk whose float64 sums are finite holds no NaN/Inf (a float32 tensor
    cannot overflow them; where a float64 one does, the chunk is masked like one that holds NaN)."""
    total, count = 0.0, 0
    with np.errstate(over="ignore", invalid="ignore"):
        for lo, hi in _chunks(n):
            a, b = a_flat[lo:hi], b_flat[lo:hi]
            s = float(np.abs(a).sum(dtype=np.float64))
            if math.isfinite(s) and math.isfinite(float(b.sum(dtype=np.float64))):
                total, count = total + s, count + hi - lo
                continue
            a = a.astype(np.float64)
            both = np.isfinite(a) & np.isfinite(b.astype(np.float64))
            total, count = total + float(np.abs(a[both]).sum()), count + int(np.count_nonzero(both))
    return total / count if count else 0.0


def tensor_metrics(ref: Any, got: Any, relative: bool = True) -> dict:
    """Compare two arrays element by element (see the module docstring for the rules).

    Returns a JSON-friendly dict (python floats / ints / lists):
    ``shape, numel, dtype_ref, dtype_got, max_abs, max_abs_index, max_rel,
    mean_abs, rms (root mean square of the difference), cosine, within_1e-3, within_5e-3, ref_max_abs, got_max_abs,
    ref_mean_abs, rel_floor, finite_compared, nan_ref, nan_got, inf_ref,
    inf_got, nonfinite_ref_at, nonfinite_got_at, nonfinite_mismatches,
    nonfinite_match``, and ``rel_l2`` (||got - ref|| / ||ref||, None where ref is all zero) for float
    arrays; ``nonfinite_*_at`` are the first `NONFINITE_POSITIONS`
    indices (flat order, unravelled) holding NaN or Inf on that side. On a
    shape mismatch it returns
    ``error, shape_ref, shape_got, dtype_ref, dtype_got`` instead.

    `relative` False leaves out the relative figures (``max_rel``, ``within_*``, ``ref_mean_abs``,
    ``rel_floor``), which need the reference's scale first: one pass over the arrays instead of two
    (`noise.error_figures` reads none of them).

    Each chunk is upcast once into float64 scratch buffers of `CHUNK_ELEMENTS` and every figure
    taken from them there. Profiled on a 254 M-parameter model's `diff --grads` (its gradients and
    parameters after the step, 942 pairs, under the same load): 58 s for the earlier two passes of
    32 MiB chunks plus a whole-tensor ``rel_l2`` (each whole-tensor temporary a fresh allocation,
    first-touched page by page), 19 s for this one with `tensor_metrics_among`. Float32 / float64
    arrays now go through pair_sums.cc (`pair_kernel`): the same sums in one compiled pass per pair,
    chunks in parallel and merged in order; this numpy path stays for other dtypes and where the
    kernel cannot be had.
    """
    ref = _as_array(ref, "ref")
    got = _as_array(got, "got")
    if ref.shape != got.shape:
        return _shape_error(ref, got)
    return _measure((ref, got), ((0, 1, relative),))[0]


def tensor_metrics_among(arrays: Sequence[Any], pairs: Sequence[tuple[int, int, bool]]) -> list[dict]:
    """`tensor_metrics(arrays[i], arrays[j], relative)` for each ``(i, j, relative)`` of `pairs`, the
    same figures in one pass over the arrays: each array's chunk is upcast, and its squares summed,
    once for every pair it is in. A live diff's entry compares HF with MindSpore and each of them with
    HF's float64 twin: three pairs among three arrays, each read once instead of twice."""
    arrays = [_as_array(x, "ref" if k == 0 else "got") for k, x in enumerate(arrays)]
    if len({a.shape for a in arrays}) > 1:
        return [tensor_metrics(arrays[i], arrays[j], relative) for i, j, relative in pairs]
    return _measure(arrays, pairs)


def _measure(arrays: Sequence[np.ndarray], pairs: Sequence[tuple[int, int, bool]]) -> list[dict]:
    """The pairs' figures (`tensor_metrics_among`) of arrays of one shape, one chunk at a time."""
    flats = [a.reshape(-1) for a in arrays]
    lib = pair_kernel.library() if pair_kernel.handles(*flats) else None
    if lib is not None:
        return [_kernel_figures(lib, arrays[i], arrays[j], flats[i], flats[j], relative) for i, j, relative in pairs]
    n = int(flats[0].size)
    scales = [_ref_scale(flats[i], flats[j], n) if relative else None for i, j, relative in pairs]
    sums = [_Sums(None if mean is None else max(REL_FLOOR_FRACTION * mean, REL_FLOOR_MIN)) for mean in scales]
    size = min(n, CHUNK_ELEMENTS) if n else 0
    scratch = [np.empty(size, np.float64) for _ in flats]
    d, t = np.empty(size, np.float64), np.empty(size, np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        for lo, hi in _chunks(n):
            m = hi - lo
            chunks = [_float64(f[lo:hi], buf[:m]) for f, buf in zip(flats, scratch, strict=True)]
            squares = [float(np.dot(c, c)) for c in chunks]
            for (i, j, _), acc in zip(pairs, sums, strict=True):
                if math.isfinite(squares[i]) and math.isfinite(squares[j]):   # no NaN/Inf (nor an overflow)
                    acc.finite_chunk(chunks[i], chunks[j], lo, squares[i], squares[j], d[:m], t[:m])
                else:
                    acc.nonfinite_chunk(chunks[i], chunks[j], lo)
    return [_figures(arrays[i], arrays[j], acc, mean) for (i, j, _), acc, mean in zip(pairs, sums, scales, strict=True)]


def _kernel_figures(lib, ref: np.ndarray, got: np.ndarray, a: np.ndarray, b: np.ndarray, relative: bool) -> dict:
    """One pair's figures from pair_sums.cc (the same sums as `_Sums`, summed in another order)."""
    mean = None
    if relative:
        total, count = pair_kernel.abs_total(lib, a, b, CHUNK_ELEMENTS)
        mean = total / count if count else 0.0
    s = _Sums(None if mean is None else max(REL_FLOOR_FRACTION * mean, REL_FLOOR_MIN))
    for name, value in pair_kernel.pair_sums(lib, a, b, CHUNK_ELEMENTS, s.floor, WITHIN_TOLERANCES).items():
        setattr(s, name, value)
    return _figures(ref, got, s, mean)


def _figures(ref: np.ndarray, got: np.ndarray, s: _Sums, ref_mean: float | None) -> dict:
    """`tensor_metrics`' dict from one pair's sums (`ref_mean` None: no relative figures)."""
    n = int(ref.size)
    relative, floor = ref_mean is not None, s.floor
    n_finite = s.n_finite
    if n and not n_finite:
        cosine = math.nan   # nothing finite to compare: no direction, and no agreement either
    elif s.na2 == 0.0 and s.nb2 == 0.0:
        cosine = 1.0
    elif s.na2 == 0.0 or s.nb2 == 0.0:
        cosine = 0.0
    else:
        denom = s.na2 * s.nb2   # sqrt(x * x) == x exactly, so identical tensors give exactly 1
        denom = math.sqrt(denom) if math.isfinite(denom) and denom > 0 else math.sqrt(s.na2) * math.sqrt(s.nb2)
        cosine = float(min(1.0, max(-1.0, s.dot / denom)))

    unmeasured = bool(n) and not n_finite   # every position non-finite on one side at least

    def where(flat: int) -> list[int]:
        return [int(i) for i in np.unravel_index(flat, ref.shape)]

    out: dict[str, Any] = {
        "shape": list(ref.shape),
        "numel": n,
        "dtype_ref": str(ref.dtype),
        "dtype_got": str(got.dtype),
        "max_abs": math.nan if unmeasured else s.max_abs,
        "max_abs_index": where(s.max_abs_at) if s.max_abs_at >= 0 else None,
    }
    if relative:
        out["max_rel"] = math.nan if unmeasured else s.max_rel
    out.update({
        "mean_abs": math.nan if unmeasured else (s.sum_abs_diff / n_finite if n_finite else 0.0),
        "rms": math.nan if unmeasured else (math.sqrt(s.sum_sq_diff / n_finite) if n_finite else 0.0),
        "cosine": cosine,
    })
    if relative:
        for i, tol in enumerate(WITHIN_TOLERANCES):
            out[f"within_{tol:.0e}".replace("e-0", "e-")] = (s.within[i] + s.same_nonfinite) / n if n else 1.0
    out.update({"ref_max_abs": s.ref_max, "got_max_abs": s.got_max})
    if relative:
        out.update({"ref_mean_abs": ref_mean, "rel_floor": floor})
    out.update({
        "finite_compared": n_finite,
        "nan_ref": s.nan_ref,
        "nan_got": s.nan_got,
        "inf_ref": s.inf_ref,
        "inf_got": s.inf_got,
        "nonfinite_ref_at": [where(i) for i in s.at_ref],
        "nonfinite_got_at": [where(i) for i in s.at_got],
        "nonfinite_mismatches": s.mismatches,
        "nonfinite_match": s.mismatches == 0,
    })
    if _floating(ref) and _floating(got):   # the whole tensor's relative error, over the finite positions
        out["rel_l2"] = math.sqrt(s.sum_sq_diff) / math.sqrt(s.na2) if s.na2 > 0 else None
    for spec in METRICS.values():   # figures of the bounds declared with their own computation
        if spec.compute is not None:
            out.update(spec.compute(ref, got))
    return out


def _float64(chunk: np.ndarray, scratch: np.ndarray) -> np.ndarray:
    """The chunk as float64: itself when it is (a float64 twin's tensor; read only), else upcast into
    `scratch`."""
    if chunk.dtype == np.float64:
        return chunk
    np.copyto(scratch, chunk, casting="unsafe")
    return scratch


def _floating(arr: np.ndarray) -> bool:
    return bool(np.issubdtype(arr.dtype, np.floating))


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
                # Equal rows are 0 exactly: numpy's exp and log may round an element differently by where it
                # lies in memory (SIMD body or scalar tail), so the same row twice could read 1e-16.
                kl_rows = np.where((a == b).all(-1), 0.0, np.maximum(terms.sum(-1), 0.0))
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
