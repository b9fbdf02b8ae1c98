"""The noise reference: how far the reference side's own numbers sit from exact arithmetic.

Fixed tolerances are right for the model they were calibrated on and wrong for a deeper one:
thirty fp32 layers summed in two frameworks' orders round apart by more than two layers do
(SmolLM2-135M: 1.9x the fixed bound on hidden states, 15x on parameters after one AdamW
step, at cosine 1-1e-9). So `migrate diff` runs the reference model a second time in
float64 -- its *twin*, built from the very weights the reference side computes with (rounded
to the run's dtype first, so bf16 weight rounding is not counted as noise) -- on the same
inputs, and measures for every judged tensor how far the reference itself is from it:

    noise = figures(exact=twin, got=reference)

`thresholds.Bounds` then widens each bound to K x the reference's own figure and, in low
precision, holds the share of elements off by 5‰ to W x the reference's own share
(`checks.tensor_checks`). Where the twin is not measured (statistics dumps from two
machines, a model too large for a float64 copy, ``--reference none``) the fixed bounds scale
with depth and width instead (`thresholds.fallback_factor`), and the report says which.

Everything here is numpy: the twins themselves live with their sides (`hf_side`, `probe`).
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from migrate.dtype_names import PRECISIONS
from migrate.judge.metrics import logits_metrics, tensor_metrics

__all__ = ["TWIN", "noise_figures", "noise_of", "error_figures", "error_of", "error_ratio", "tie_margin"]

TWIN = "float64 twin"   # how reports name the reference's reference
_FIGURES = ("max_abs", "rms", "cosine", "rel_l2")


def noise_figures(ref: Any, exact: Any, logits: bool = False) -> dict:
    """The reference side's own error against its float64 twin, as `checks` reads it:
    max_abs, rms, cosine, off (share of elements off by more than 5‰), and for logits kl and
    top1 (the reference's argmax agreement with the twin's)."""
    return noise_of(logits_metrics(exact, ref) if logits else tensor_metrics(exact, ref), logits)


def noise_of(m: Mapping[str, Any], logits: bool = False) -> dict:
    """`noise_figures` from the metrics of (twin, reference) already measured."""
    if m.get("error"):
        return {"error": m["error"]}
    out = {k: m.get(k) for k in _FIGURES}
    out["off"] = 1.0 - m["within_5e-3"]
    if logits:
        out["kl"], out["top1"] = m.get("kl"), m.get("top1")
    return out


def error_figures(got: Any, exact: Any) -> dict:
    """The other side's own error against the same twin (live runs only: a dump keeps no twin). None
    of its figures is relative: one pass over the arrays (`tensor_metrics(relative=False)`)."""
    return error_of(tensor_metrics(exact, got, relative=False))


def error_of(m: Mapping[str, Any]) -> dict:
    """`error_figures` from the metrics of (twin, other side) already measured."""
    return {} if m.get("error") else {k: m.get(k) for k in _FIGURES}


def error_ratio(metrics: Mapping[str, Any]) -> float | None:
    """The other side's RMS error vs float64 over the reference's own ("MindSpore's error is
    1.3x torch's"), or None without both."""
    own, other = (metrics.get("noise") or {}).get("rms"), (metrics.get("got_error") or {}).get("rms")
    if own is None or other is None or not math.isfinite(own) or not math.isfinite(other):
        return None
    if own == 0:
        return None if other == 0 else math.inf
    return other / own


def tie_margin(noise: Mapping[str, Any], k: float | None, dtype: str = "fp32",
               peak: float | None = None) -> float | None:
    """How close two logits of one position may be for either to be the right argmax: each can
    be off by about K x the reference's RMS logit error, so a swap needs a gap under twice that.

    In low precision that overstates it, as it does for the share rule: a port rounding where HF
    rounds shares HF's error, so only logits equal to two units in the last place at the peak
    logit are a tie there (on SmolLM2 in bf16, 2K x RMS was 6.7, above 87 % of the positions'
    top-two gaps; the three real disagreements had gaps of 0, 0 and one ulp)."""
    rms = noise.get("rms")
    if k is None or rms is None or not math.isfinite(rms):
        return None
    margin = 2.0 * k * float(rms)
    precision = PRECISIONS.get(dtype)
    if precision is not None and precision.low and peak is not None and math.isfinite(peak) and peak > 0:
        ulp = 2.0 ** math.floor(math.log2(peak)) * 2.0 * precision.unit_roundoff
        margin = min(margin, 2.0 * ulp)
    return margin
