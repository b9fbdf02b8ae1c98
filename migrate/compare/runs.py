"""`compare_runs`: read the golden and MindSpore metrics (and a noise run), pair them by step,
apply every rule of `rules`, `drift` and `clip`, and return the `CompareResult`."""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from migrate.compare.clip import clip_check
from migrate.compare.drift import drift_check
from migrate.compare.effective_hparams import cross_check, recorded_dtype
from migrate.compare.log_alignment import (
    align_runs,
    describe,
    first_window,
    mask_unlogged,
    resolution_bounds,
    torch_clip_golden,
)
from migrate.compare.metrics_log import Run
from migrate.compare.readers import read_run
from migrate.compare.reference import SCALED, first_step_scale, scaled_bounds
from migrate.compare.result import CompareResult
from migrate.compare.rules import (
    agreement_rules,
    band_factor,
    coverage_rule,
    grad_rules,
    hparams_rule,
    loss_rules,
    lr_rule,
    measure_noise,
    noise_notes,
    nonfinite_note,
)
from migrate.compare.stats import at_steps, rel_diff, trailing_mean
from migrate.compare.tolerances import Tolerances
from migrate.dtype_names import canonical_dtype
from migrate.errors import MigrateError

__all__ = ["compare_runs"]


def compare_runs(golden_path: Any, ms_path: Any, noise_path: Any = None, dtype: str | None = None,
                 tolerances: Tolerances | Mapping[str, Any] | None = None, *,
                 allow_prefix: bool = False, hparams: tuple[Any, Any] | None = None) -> CompareResult:
    """Read and compare the golden and MindSpore metrics (and optionally a noise run).

    ``tolerances``: a `Tolerances`, or a mapping of overrides onto the dtype's
    defaults (None values keep the default); the first-step and grad-norm bounds
    not set explicitly take their scale from the golden's own step-1 rounding
    (`reference`). ``hparams``: the two runs'
    effective_hparams.json (golden's first); by default the files beside the
    two metrics.jsonl, and the cross-check is skipped, saying so, where one is
    missing. ``dtype`` picks the default bounds; None: the precision the runs' effective_hparams.json
    record (`recorded_dtype`), else fp32. Raises `MigrateError` on bad input.
    """
    golden = read_run(golden_path, "golden")
    ms = read_run(ms_path, "MindSpore")
    checked = cross_check(golden.path, ms.path, hparams)
    recorded = recorded_dtype(checked) if dtype is None else None
    dt = canonical_dtype(dtype or recorded or "fp32")
    tol = Tolerances.for_dtype(dt)
    given: tuple[str, ...] = ()   # bounds set explicitly: the run's own scale does not move them
    if isinstance(tolerances, Tolerances):
        given = tuple(k for k in SCALED if getattr(tolerances, k) != getattr(tol, k))
        tol = dataclasses.replace(tolerances, dtype=dt)
    elif tolerances is not None:
        given = tuple(k for k, v in dict(tolerances).items() if v is not None)
        tol = tol.with_overrides(**dict(tolerances))
    noise = read_run(noise_path, "noise") if noise_path is not None else None
    notes = [n for n in (describe(golden, "golden"), describe(ms, "MindSpore")) if n]
    if recorded is not None and dt != "fp32":  # fp32, the default, goes without saying
        notes.append(f"tolerances for {dt}, the precision the runs record (--dtype to choose)")
    golden, ms = align_runs(golden, ms, notes)  # foreign logs: averaged losses, sparse steps

    res = _paired(golden, ms, noise, tol, allow_prefix)
    res.notes[:0] = notes
    res.formats = {"golden": golden.format, "ms": ms.format}
    mask_unlogged(res, golden, ms)
    res.hparams = checked
    res.reference = first_step_scale(golden, int(res.steps[0]), res.hparams, tol, given)  # the golden's own rounding
    tol = scaled_bounds(tol, res.reference, res.notes)
    res.tolerances, drift_floor = resolution_bounds(
        golden, ms, res.steps, {"loss": res.loss_golden, "lr": res.lr_golden, "grad_norm": res.grad_golden},
        tol, res.notes)
    tol = res.tolerances
    golden = torch_clip_golden(golden, ms, res.hparams, tol.dtype, res.notes)
    checks = [hparams_rule(res.hparams, res)]
    checks += coverage_rule(golden, ms, res)
    checks += agreement_rules(golden, ms, res)
    nonfinite_note(res)
    if noise is not None:
        measure_noise(noise, res)
    k = band_factor(res, noise is not None)
    checks += loss_rules(res, k)
    drift = drift_check(res.steps, res.loss_golden, res.loss_ms, tol, res, floor=drift_floor,
                        noise=res.reference.loss_noise or 0.0)
    if drift is not None:
        checks.append(drift)
    checks.append(lr_rule(res))
    checks += grad_rules(res, k)
    clip = clip_check(golden, ms, noise, res.steps, tol, res)
    if clip is not None:
        checks.append(clip)

    for c in checks:  # a disabled bound (inf) is reported, not judged
        if c.limit is not None and isinstance(c.limit, float) and math.isinf(c.limit):
            c.passed, c.step = None, None
    width = first_window(golden, ms, int(res.steps[0]))
    for c in checks:  # a foreign log's first loss may average several steps: no first-step figure then
        if c.key == "lr" and np.isnan(res.lr_rel).all():
            c.passed, c.step, c.detail = None, None, "not judged: no step has an lr on both sides"
        if c.key == "first" and width > 1:
            c.passed, c.step = None, None
            c.detail = (f"not judged: the first paired loss (step {int(res.steps[0])}) averages {width} steps, "
                        "so it is not one forward pass on the converted weights")
            res.fail_steps["first"] = []
    res.checks = checks
    if noise is not None:
        noise_notes(res)
    return res


def _paired(golden: Run, ms: Run, noise: Run | None, tol: Tolerances, allow_prefix: bool) -> CompareResult:
    """The two runs at their common steps: losses, lrs and grad norms side by side, with the
    per-step rel diffs and the trailing window mean of the loss's."""
    steps = np.intersect1d(golden.steps, ms.steps)
    only_golden = [int(s) for s in np.setdiff1d(golden.steps, ms.steps)]
    only_ms = [int(s) for s in np.setdiff1d(ms.steps, golden.steps)]
    if not len(steps):
        raise MigrateError(f"no step in common: {golden.path} has {golden.span()}, {ms.path} has {ms.span()}")

    def g(arr, fill=np.nan):
        return at_steps(golden, steps, arr, fill)

    def m(arr, fill=np.nan):
        return at_steps(ms, steps, arr, fill)

    lg, lm = g(golden.loss), m(ms.loss)
    rg, rm = g(golden.lr), m(ms.lr)
    gg, gm = g(golden.grad_norm), m(ms.grad_norm)
    sg = g(golden.skipped, False).astype(bool) if golden.skipped is not None else np.zeros(len(steps), bool)
    sm = m(ms.skipped, False).astype(bool) if ms.skipped is not None else np.zeros(len(steps), bool)
    loss_abs = np.abs(lm - lg)
    loss_rel = rel_diff(lm, lg)
    lr_rel = rel_diff(rm, rg)
    grad_rel = rel_diff(gm, gg)
    grad_rel[sg & sm] = np.nan  # both skipped: the overflowed norm is not a comparison
    loss_window = trailing_mean(loss_rel, tol.window)

    return CompareResult(golden_path=golden.path, ms_path=ms.path, noise_path=noise.path if noise else None,
                         dtype=tol.dtype, tolerances=tol, allow_prefix=allow_prefix, steps=steps,
                         loss_golden=lg, loss_ms=lm, loss_abs=loss_abs, loss_rel=loss_rel,
                         lr_golden=rg, lr_ms=rm, lr_rel=lr_rel, grad_golden=gg, grad_ms=gm, grad_rel=grad_rel,
                         skipped_golden=sg, skipped_ms=sm, loss_window=loss_window,
                         only_golden=only_golden, only_ms=only_ms,
                         golden_steps=len(golden), ms_steps=len(ms), noise_steps=len(noise) if noise else 0)
