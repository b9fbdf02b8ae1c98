"""Judging one compared tensor: its metrics held to its `Bounds`, as the judge's `Check`s.

`tensor_checks` makes one `migrate.judge.Check` per bound that applies, most fundamental
first: shape (or other) error, NaN/Inf, cosine, max abs, share within 5‰, top-1, KL,
generation match. `judge` is their `Verdict` as ``(passed, reason)``, the reason every failing
check joined by "; ". Any NaN or Inf element, on either side, fails by itself, worded by
`nonfinite_text` (also used by the report's NaN/Inf section).
"""
from __future__ import annotations

import math
from typing import Any, Mapping

from migrate.judge.thresholds import OFF_FLOOR, Thresholds
from migrate.judge import Check, Verdict, fmt_cosine, fmt_num, fmt_share

__all__ = ["tensor_checks", "judge", "nonfinite_count", "nonfinite_side", "nonfinite_text", "nonfinite_summary"]


def _bad(x: Any) -> bool:
    return isinstance(x, float) and math.isnan(x)


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

def _noise_limit(fixed: float | None, k: float | None, own: Any) -> tuple[float | None, bool]:
    """(limit, from_noise): the larger of the fixed bound and k x the reference's own figure."""
    if k is None or own is None or _bad(own):
        return fixed, False
    widened = k * float(own)
    if fixed is None or widened > fixed:
        return widened, True
    return fixed, False


def _noise_words(k: float, own: float, what: str = "error") -> str:
    return f"{k:g} × the reference's own {what} vs float64 {fmt_num(own)}"


def tensor_checks(metrics: Mapping[str, Any], kind: str, thresholds: Thresholds | str) -> list[Check]:
    """One Check per bound of ``thresholds.bounds(kind)`` whose metric is in `metrics`.

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

    mab = metrics.get("max_abs")
    ref_peak = float(metrics.get("ref_max_abs") or 0.0)
    fixed_bound = b.max_abs_bound(ref_peak) if mab is not None else None
    bound, by_noise = _noise_limit(fixed_bound, b.widens("max_abs"), noise.get("max_abs")) if mab is not None \
        else (None, False)

    cos = metrics.get("cosine")
    if b.cosine is not None and cos is not None:
        peak = max(ref_peak, float(metrics.get("got_max_abs") or 0.0))
        zero = bound is not None and peak <= bound
        own = noise.get("cosine")
        gap, cos_by_noise = _noise_limit(1.0 - b.cosine, b.widens("cosine"), None if own is None else 1.0 - own)
        limit = 1.0 - gap
        failed = _bad(cos) or (not zero and cos < limit)
        text = f"cosine {fmt_cosine(cos)} < {fmt_cosine(limit)}"
        if cos_by_noise:
            text += f" (1 - cosine over {_noise_words(b.noise, 1.0 - own, 'distance')})"
        checks.append(Check("cosine", "cosine", value=cos, limit=limit,
                            passed=None if zero and not failed else not failed,
                            detail=text if failed else
                            ("zero within the max-abs bound: no direction to compare" if zero else "")))

    if bound is not None:
        failed = _bad(mab) or mab > bound
        text = f"max_abs {fmt_num(mab)} > {fmt_num(bound)}"
        if by_noise:
            text += f" = {_noise_words(b.noise, noise['max_abs'])}"
        elif b.max_abs_rel is not None and (b.max_abs is None or bound > b.max_abs):
            text += f" = {b.max_abs_rel:g} × max|ref| {ref_peak:.3g}"
        checks.append(Check("max_abs", "max abs", value=mab, limit=bound, passed=not failed,
                            detail=text if failed else ""))

    within = metrics.get("within_5e-3")
    if b.within is not None and within is not None:
        own_off = noise.get("off")
        if b.off_noise is not None and own_off is not None and not _bad(own_off):
            off = 1.0 - within
            limit = max(b.off_noise * own_off, OFF_FLOOR)
            failed = _bad(off) or off > limit
            checks.append(Check("within", "share off by 5‰, over the reference's own", value=off, limit=limit,
                                passed=not failed, detail=(
                                    f"off by 5‰ {off:.1%} > {limit:.1%} = {b.off_noise:g} × the reference's own "
                                    f"share off its float64 twin {own_off:.1%}") if failed else ""))
        else:
            failed = _bad(within) or within < b.within
            checks.append(Check("within", "share within 5‰", value=within, limit=b.within, passed=not failed,
                                detail=f"within 5‰ {within:.1%} < {b.within:.0%}" if failed else ""))

    top1 = metrics.get("top1")
    if b.top1 is not None and top1 is not None:
        ties = metrics.get("top1_ties")
        if ties is not None and b.widens("top1") is not None:
            decisive = metrics.get("top1_decisive")
            positions = int(metrics.get("positions") or 0) - int(ties)
            failed = decisive is not None and (_bad(decisive) or decisive < b.top1)
            checks.append(Check("top1", "top-1 agreement off near ties", value=decisive, limit=b.top1,
                                passed=None if decisive is None else not failed, detail=(
                                    f"top1 {fmt_share(decisive)} < {fmt_share(b.top1)} over {positions} decisive "
                                    f"positions ({ties} near ties within "
                                    f"{fmt_num(metrics.get('top1_tie_margin'))})") if failed else
                                ("every position is a near tie" if decisive is None else "")))
        else:
            failed = _bad(top1) or top1 < b.top1
            checks.append(Check("top1", "top-1 agreement", value=top1, limit=b.top1, passed=not failed,
                                detail=f"top1 {fmt_share(top1)} < {fmt_share(b.top1)}" if failed else ""))

    kl = metrics.get("kl")
    if b.kl is not None and kl is not None:
        limit, kl_by_noise = _noise_limit(b.kl, b.widens("kl"), noise.get("kl"))
        failed = _bad(kl) or kl > limit
        text = f"kl {fmt_num(kl)} > {fmt_num(limit, 0) if not kl_by_noise else fmt_num(limit)}"
        if kl_by_noise:
            text += f" = {_noise_words(b.noise, noise['kl'], 'KL')}"
        checks.append(Check("kl", "mean KL", value=kl, limit=limit, passed=not failed, detail=text if failed else ""))

    share = metrics.get("match_share")
    if b.match is not None and share is not None:
        failed = share < b.match
        checks.append(Check("match", "generation matching prefix", value=share, limit=b.match, passed=not failed,
                            step=metrics.get("first_diff_step") if failed else None, detail=(
                                f"generation differs at step {metrics.get('first_diff_step')} of "
                                f"{metrics.get('steps')} (matching prefix {share:.0%} < {b.match:.0%})")
                            if failed else ""))
    return checks


def judge(metrics: Mapping[str, Any], kind: str, thresholds: Thresholds | str) -> tuple[bool, str | None]:
    """Apply ``thresholds.bounds(kind)`` to a metrics dict: ``(passed, reason)``.

    The reason is None when passed, otherwise every failing check, most fundamental first,
    joined by "; " -- e.g.
    ``"cosine 0.93 < 0.99999; max_abs 3.10e-01 > 2.66e-05 = 1e-05 × max|ref| 2.66"``.
    """
    verdict = Verdict(tensor_checks(metrics, kind, thresholds))
    return verdict.passed, verdict.reasons()
