"""Statistics mode: what a dump keeps of a tensor too big to keep, and how two such
summaries are compared.

Per tensor: min / max / mean / L2 norm over its finite elements, NaN and Inf counts, the
element count and a checksum (sha256 of its float32 bytes, C order), all in float64.
Comparing two summaries cannot give a cosine or a max abs, but it can give a *lower bound*
of the max abs difference: for tensors a, b of n elements,
|min a - min b|, |max a - max b|, |mean a - mean b| and |‖a‖ - ‖b‖| / √n are each at most
max|a - b|. So `stats_metrics` reports that bound as ``max_abs`` (flagged
``max_abs_is_lower_bound``): a tensor it fails certainly fails the full-tensor bound too.
Equal checksums mean identical tensors, and the bound is then exactly 0.

Those four statistics barely move when a fault permutes values (q and k swapped leave the
attention output's min, max, mean and norm within 1e-5). So each summary also keeps a
*sketch*: the tensor projected on `SKETCH` fixed random ±1 vectors (the same on every
machine: seeded by position). For d = a - b, ‖sketch(a) - sketch(b)‖² / SKETCH estimates
‖d‖² (Johnson-Lindenstrauss), hence the RMS of d, which max|d| is at least; divided by
`SKETCH_MARGIN` it stays below the true RMS except with probability under 1e-6 (χ² with 64
degrees of freedom), so it is a lower bound of the max abs too.
"""
from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

STAT_KEYS = ("min", "max", "mean", "l2")
CHUNK = 1 << 14  # elements upcast to float64 and projected at a time (an 8 MiB sign matrix)
SKETCH = 64
SKETCH_MARGIN = 1.5


def tensor_stats(array: np.ndarray) -> dict:
    """The summary statistics mode keeps of one tensor (JSON-friendly)."""
    flat = np.ascontiguousarray(array, dtype=np.float32).reshape(-1)
    n = int(flat.size)
    lo, hi, total, sq = math.inf, -math.inf, 0.0, 0.0
    nan = inf = finite = 0
    digest = hashlib.sha256()
    sketch = np.zeros(SKETCH)
    for start in range(0, n, CHUNK):
        part = flat[start:start + CHUNK]
        digest.update(part.tobytes())
        x = part.astype(np.float64)
        ok = np.isfinite(x)
        sketch += _signs(start, x.size) @ np.where(ok, x, 0.0)
        nan += int(np.count_nonzero(np.isnan(x)))
        inf += int(np.count_nonzero(np.isinf(x)))
        if not ok.all():
            x = x[ok]
        finite += int(x.size)
        if x.size:
            lo, hi = min(lo, float(x.min())), max(hi, float(x.max()))
            total += float(x.sum())
            sq += float(np.dot(x, x))
    return {
        "shape": list(array.shape), "numel": n,
        "min": lo if finite else math.nan, "max": hi if finite else math.nan,
        "mean": total / finite if finite else math.nan, "l2": math.sqrt(sq),
        "nan": nan, "inf": inf, "checksum": digest.hexdigest()[:32], "sketch": sketch.tolist(),
    }


@functools.lru_cache(maxsize=4)
def _signs(start: int, size: int) -> np.ndarray:
    """The ±1 projection of elements start..start+size: seeded by position, so every machine
    and both sides draw the same (cached: most tensors share their first chunks)."""
    bits = np.random.default_rng([7, start]).integers(0, 2, (SKETCH, size), dtype=np.int8)
    return 2.0 * bits - 1.0


def _rel(a: float, b: float, scale: float) -> float:
    if a == b:
        return 0.0
    return abs(a - b) / max(abs(a), scale, 1e-30)


def stats_metrics(ref: Mapping[str, Any], got: Mapping[str, Any]) -> dict:
    """Metrics of two summaries, in `judge.metrics.tensor_metrics`' keys where they have a
    meaning (``max_abs`` as the lower bound above, ``ref_max_abs``, NaN/Inf counts) and the
    statistics' relative differences (``rel_min`` … ``rel_l2``, ``stats_max_rel``) besides.
    Cosine, max rel and the within-shares need the full tensors: absent (not judged)."""
    if list(ref["shape"]) != list(got["shape"]):
        return {"error": f"shape mismatch: ref {tuple(ref['shape'])} vs got {tuple(got['shape'])}",
                "shape_ref": list(ref["shape"]), "shape_got": list(got["shape"])}
    n = max(int(ref["numel"]), 1)
    identical = ref["checksum"] == got["checksum"]
    scale = max(abs(ref["min"]), abs(ref["max"])) if math.isfinite(ref["min"]) else 1.0
    out: dict[str, Any] = {"shape": list(ref["shape"]), "numel": int(ref["numel"]), "statistics": True,
                           "identical": identical, "max_abs_is_lower_bound": not identical}
    bounds, rels = [], []
    for key in STAT_KEYS:
        a, b = float(ref[key]), float(got[key])
        if not (math.isfinite(a) and math.isfinite(b)):
            out[f"rel_{key}"] = math.nan if a != b or math.isnan(a) else 0.0
            continue
        diff = abs(a - b) / (math.sqrt(n) if key == "l2" else 1.0)
        bounds.append(diff)
        rels.append(_rel(a, b, 1e-3 * scale))
        out[f"rel_{key}"] = rels[-1]
    if ref.get("sketch") and got.get("sketch"):
        delta = np.asarray(ref["sketch"]) - np.asarray(got["sketch"])
        rms = math.sqrt(float(delta @ delta) / len(delta) / n)
        out["rms_diff_estimate"] = rms
        bounds.append(rms / SKETCH_MARGIN)
    nonfinite = any(int(s[k]) for s in (ref, got) for k in ("nan", "inf"))
    unmeasured = not bounds
    out["max_abs"] = 0.0 if identical and not nonfinite else (math.nan if unmeasured else max(bounds))
    out["stats_max_rel"] = 0.0 if identical else (max(rels) if rels else math.nan)
    if int(ref["numel"]) == 1 and bounds:  # a scalar (the loss): its statistics are the value itself
        a, b = float(ref["mean"]), float(got["mean"])
        out.update(max_abs=abs(a - b), max_rel=abs(a - b) / max(abs(a), 1e-30), max_abs_is_lower_bound=False)
    out["ref_max_abs"] = scale if math.isfinite(ref["min"]) else 0.0
    out["got_max_abs"] = max(abs(got["min"]), abs(got["max"])) if math.isfinite(got["min"]) else 0.0
    out.update({"nan_ref": int(ref["nan"]), "inf_ref": int(ref["inf"]), "nan_got": int(got["nan"]),
                "inf_got": int(got["inf"]), "nonfinite_ref_at": [], "nonfinite_got_at": [],
                "finite_compared": None})
    return out
