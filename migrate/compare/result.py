"""The outcome of `compare_runs`: the paired curves, the rules' checks, the verdict, compare.json."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from migrate.compare.tolerances import Tolerances
from migrate.jsonsafe import jsonable
from migrate.judge import Check, Verdict, fmt_figure

__all__ = ["SCHEMA_VERSION", "CHECK_ORDER", "CompareResult"]

SCHEMA_VERSION = 1
# Rule order: the tie-break for "first out of tolerance" at the same step.
CHECK_ORDER = ("hparams", "steps", "tokens", "skipped", "loss_scale", "first", "max", "band", "mean", "drift",
               "lr", "grad_max", "grad_mean", "clip")


@dataclass
class CompareResult:
    golden_path: Path
    ms_path: Path
    noise_path: Path | None
    dtype: str
    tolerances: Tolerances
    allow_prefix: bool
    steps: np.ndarray                       # paired steps
    loss_golden: np.ndarray
    loss_ms: np.ndarray
    loss_abs: np.ndarray
    loss_rel: np.ndarray
    lr_golden: np.ndarray
    lr_ms: np.ndarray
    lr_rel: np.ndarray
    grad_golden: np.ndarray
    grad_ms: np.ndarray
    grad_rel: np.ndarray
    skipped_golden: np.ndarray
    skipped_ms: np.ndarray
    loss_window: np.ndarray                 # R_t: trailing window mean of loss_rel
    loss_noise: np.ndarray | None = None    # noise run's loss at the paired steps (NaN where absent)
    noise_rel: np.ndarray | None = None     # n_t
    noise_band: np.ndarray | None = None    # N_t: centred window mean of n_t
    band_limit: np.ndarray | None = None    # max(k N_t, floor) where judged, NaN elsewhere
    only_golden: list[int] = field(default_factory=list)
    only_ms: list[int] = field(default_factory=list)
    golden_steps: int = 0
    ms_steps: int = 0
    noise_steps: int = 0
    checks: list[Check] = field(default_factory=list)
    noise_figures: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    fail_steps: dict = field(default_factory=dict)  # check key -> sorted list of failing steps
    clip_golden: np.ndarray | None = None   # grad_norm_clipped, where both logs have it
    clip_ms: np.ndarray | None = None
    clip_signed: np.ndarray | None = None   # (ms - golden) / golden at steps both sides clipped, NaN elsewhere
    loss_signed: np.ndarray | None = None   # (ms - golden) / |golden| of the loss, NaN where not both finite
    drift_sustained: np.ndarray | None = None  # per step: how far s stayed beyond 0, same sign, over the window
    drift_limit: float | None = None        # drift x the first steps' level, where the drift rule applies
    hparams: Any = None                     # effective_hparams.HparamsCheck: the effective_hparams.json cross-check
    formats: dict = field(default_factory=dict)  # side -> log format read (log_formats.FORMATS key)
    reference: Any = None                   # reference.FirstStepScale: where the first-step bounds' scale came from

    # ----------------------------------------------------------------- verdict
    @property
    def verdict(self) -> Verdict:
        return Verdict(self.checks, CHECK_ORDER)

    @property
    def judged(self) -> list[Check]:
        return self.verdict.judged

    @property
    def failed(self) -> list[Check]:
        return self.verdict.failed

    @property
    def passed(self) -> bool:
        return self.verdict.passed

    @property
    def exit_code(self) -> int:
        return self.verdict.exit_code

    @property
    def first_failure(self) -> Check | None:
        return self.verdict.first_failure

    def check(self, key: str) -> Check | None:
        return self.verdict.check(key)

    def verdict_text(self) -> str:
        """"PASS · 50 paired steps within fp32 tolerance (…) · 24 hyperparameters agree", or "FAIL ·
        " with the hyperparameters that differ (the cause, named before its symptoms) and the
        first step out of tolerance on the curves."""
        n = len(self.steps)
        span = f"{n} paired step{'s' if n != 1 else ''}"
        verdict = self.verdict
        if verdict.passed:
            loss_mean = self.check("mean")
            hp = None if self.hparams is None else ("hyperparameters not cross-checked" if self.hparams.skipped
                                                    else f"{len(self.hparams.rows)} hyperparameters agree")
            return verdict.line(f"{span} within {self.dtype} tolerance"
                                + (f" (mean loss rel diff {fmt_figure(loss_mean.value)})" if loss_mean else ""), hp)
        hp = self.check("hparams")
        parts = [hp.reason()] if hp is not None and hp.passed is False else []
        curve = Verdict([c for c in verdict.failed if c.key != "hparams"], CHECK_ORDER)
        first = curve.first_failure
        if first is not None:
            where = f"step {first.step}" if first.step is not None else "the run"
            others = [c for c in curve.checks if c is not first]
            tail = ""
            if others:
                tail = "; also " + ", ".join(
                    f"{c.key}" + (f" from step {c.step}" if c.step is not None else "") for c in others)
            parts.append(f"first out of tolerance at {where}: {first.reason()}{tail}")
        return verdict.line(*parts)

    # ----------------------------------------------------------------- JSON
    def to_dict(self) -> dict:
        per_step = {
            "step": self.steps, "loss_golden": self.loss_golden, "loss_ms": self.loss_ms,
            "loss_abs": self.loss_abs, "loss_rel": self.loss_rel, "loss_window": self.loss_window,
            "lr_golden": self.lr_golden, "lr_ms": self.lr_ms, "lr_rel": self.lr_rel,
            "grad_norm_golden": self.grad_golden, "grad_norm_ms": self.grad_ms, "grad_norm_rel": self.grad_rel,
            "skipped_golden": self.skipped_golden, "skipped_ms": self.skipped_ms,
        }
        if self.clip_signed is not None:
            per_step.update(grad_norm_clipped_golden=self.clip_golden, grad_norm_clipped_ms=self.clip_ms,
                            grad_norm_clipped_signed_rel=self.clip_signed)
        if self.noise_rel is not None:
            per_step.update(loss_noise=self.loss_noise, noise_rel=self.noise_rel, noise_band=self.noise_band,
                            band_limit=self.band_limit)
        if self.drift_sustained is not None:
            per_step.update(loss_signed_rel=self.loss_signed, drift_sustained=self.drift_sustained)
        first = self.first_failure
        return jsonable({
            "schema_version": SCHEMA_VERSION,
            "tool": "migrate compare",
            "runs": {"golden": str(self.golden_path), "ms": str(self.ms_path),
                     "noise": str(self.noise_path) if self.noise_path else None,
                     "golden_steps": self.golden_steps, "ms_steps": self.ms_steps,
                     "noise_steps": self.noise_steps if self.noise_path else None,
                     "paired_steps": len(self.steps), "only_golden": self.only_golden, "only_ms": self.only_ms,
                     "allow_prefix": self.allow_prefix, "formats": self.formats},
            "dtype": self.dtype,
            "tolerances": self.tolerances.to_dict(),
            "summary": {
                "passed": self.passed,
                "verdict": self.verdict_text(),
                "first_failure": None if first is None else {"check": first.key, "step": first.step,
                                                             "reason": first.reason()},
                "figures": {c.key: c.value for c in self.checks},
            },
            "checks": [c.to_dict() for c in self.checks],
            "noise": self.noise_figures or None,
            "hparams": None if self.hparams is None else self.hparams.to_dict(),
            "reference": None if self.reference is None else self.reference.to_dict(),
            "notes": self.notes,
            "fail_steps": self.fail_steps,
            "per_step": per_step,
        })
