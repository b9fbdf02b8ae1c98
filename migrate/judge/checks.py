"""Judging one compared tensor: its metrics held to its `Bounds`, as the judge's `Check`s.

`tensor_checks` makes one `migrate.judge.Check` per bound that applies, most fundamental
first: shape (or other) error, NaN/Inf, then each bound declared in `judge.bounds` in its
rank (cosine, max abs, share within 5‰, top-1, KL, generation match). `judge` is their
`Verdict` as ``(passed, reason)``, the reason every failing check joined by "; ". Any NaN or
Inf element, on either side, fails by itself, worded by `nonfinite_text` (also used by the
report's NaN/Inf section).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from migrate.judge.bounds import METRICS
from migrate.judge.thresholds import Thresholds
from migrate.judge.verdict import Check, Verdict

__all__ = ["tensor_checks", "judge", "nonfinite_count", "nonfinite_side", "nonfinite_text", "nonfinite_summary"]


# --------------------------------------------------------------------------- NaN / Inf wording

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


def nonfinite_summary(nf: Mapping[str, Any], ref_label: str, got_label: str) -> str:
    """The verdict line's words for a report's first NaN/Inf tensor (``summary.nonfinite``):
    "NaN in MindSpore from layer 0 · mlp output (MindSpore: 3072 NaN of 3072 at [0, 0, 0], …)"."""
    parts, kinds = [], set()
    for s, label in (("ref", ref_label), ("got", got_label)):
        d = nf[s]
        if not (d["nan"] or d["inf"]):
            continue
        kinds |= {k for k in ("nan", "inf") if d[k]}
        counts = ", ".join(t for t in (d["nan"] and f"{d['nan']} NaN", d["inf"] and f"{d['inf']} Inf") if t)
        if nf.get("numel") is not None:
            counts += f" of {nf['numel']}"
        at = [list(i) for i in d["at"] if i]   # [] is the position of a scalar
        where = ", ".join(str(i) for i in at[:3]) + (", …" if at and d["nan"] + d["inf"] > min(3, len(at)) else "")
        parts.append((label, f"{label}: {counts}" + (f" at {where}" if where else "")))
    word = "NaN/Inf" if kinds == {"nan", "inf"} else ("NaN" if kinds == {"nan"} else "Inf")
    labels = " and ".join(label for label, _ in parts)
    return f"{word} in {labels} from {nf['location']} ({' | '.join(t for _, t in parts)})"


# --------------------------------------------------------------------------- checks

_ORDER = sorted((spec for spec in METRICS.values() if spec.check is not None), key=lambda spec: spec.rank)


def tensor_checks(metrics: Mapping[str, Any], kind: str, thresholds: Thresholds | str) -> list[Check]:
    """One Check per bound of ``thresholds.bounds(kind)`` whose metric is in `metrics`, after the
    comparison's own error and the NaN/Inf count; each bound's check is its declaration's in
    `judge.bounds`, in their ``rank`` order.

    A bound that is None, or a metric that is absent or None (not measured), makes no check;
    a NaN metric fails. The cosine of a tensor that is zero at the max-abs bound (both peaks
    within it) is not judged: it has no direction to compare. With ``metrics["noise"]`` (the
    reference's own error vs its float64 twin, `judge.noise`) each bound is widened to
    K x that where larger, and in low precision the share off by 5‰ is held to W x the
    reference's own (`Bounds`).
    """
    if not isinstance(thresholds, Thresholds):
        thresholds = Thresholds(thresholds)
    b = thresholds.bounds(kind)
    if metrics.get("error"):
        return [Check("error", "comparison", passed=False, detail=str(metrics["error"]))]
    n_bad = nonfinite_count(metrics)
    checks = [Check("finite", "NaN/Inf elements, both sides", value=n_bad, limit=0, passed=not n_bad,
                    detail=nonfinite_text(metrics) if n_bad else "")]
    noise = metrics.get("noise") or {}
    for spec in _ORDER:
        check = spec.check(metrics, b, noise)
        if check is not None:
            checks.append(check)
    return checks


def judge(metrics: Mapping[str, Any], kind: str, thresholds: Thresholds | str) -> tuple[bool, str | None]:
    """Apply ``thresholds.bounds(kind)`` to a metrics dict: ``(passed, reason)``.

    The reason is None when passed, otherwise every failing check, most fundamental first,
    joined by "; " -- e.g.
    ``"cosine 0.93 < 0.99999; max_abs 3.10e-01 > 2.66e-05 = 1e-05 × max|ref| 2.66"``.
    """
    verdict = Verdict(tensor_checks(metrics, kind, thresholds))
    return verdict.passed, verdict.reasons()
