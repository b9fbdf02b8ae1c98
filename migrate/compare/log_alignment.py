"""Making a foreign log comparable with the other run, step by step, before the rules judge.

* **Averaged losses** (Megatron-LM's and HF Trainer's loss at step s is the mean over the steps
  since the previous log line; `LogFormat.loss_averaged`): the other side's loss at s becomes its
  mean over the same steps (its fp16-skipped steps left out, as Megatron leaves them out), which
  needs every step of the window on that side. Two averaged logs must log the same windows.
  Anything else is refused in one line: the two losses would not measure the same thing.
* **Next step's lr** (Megatron-LM prints the lr its scheduler set for the next iteration): in a
  log of every step each printed lr moves to the step it belongs to (the first step's is unknown);
  in a sparse log the other side's lr is taken from its next step instead.
* **Sparse logs** (a foreign log with a log interval > 1): only the steps both sides log are judged; the
  other side's steps inside the sparse log's span are left out, with a note. No step in common is
  refused (`compare_runs`).
* **Printed resolution** (`log_formats.printed_resolution`): each bound a rounded value enters
  grows by that value's relative resolution (``first`` by the first step's, ``max``/``grad_max``/
  ``lr`` by the largest, ``mean``/``grad_mean`` by the mean), and the drift rule's level by the
  median one; a note gives the figures. |ms - golden_printed| <= |ms - golden| + resolution, so a
  correct run cannot fail on rounding it did not make.
* **Post-clip norm**: no foreign format logs the norm after clipping. When the golden's producer
  clips as torch does (max_norm / (norm + 1e-6)) and the MindSpore side logs its post-clip norm,
  the golden's is torch's formula applied to the golden's own pre-clip norm (its printed rounding
  moves the result by < 1e-9), with max_norm from the runs' effective_hparams.json; fp32 only, as
  in low precision torch's measured norm departs from the formula by as much as a missing epsilon.
"""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np

from migrate.compare.foreign_files import TB_DIALECTS
from migrate.compare.log_formats import LogFormat
from migrate.compare.metrics_log import Run
from migrate.compare.readers import FORMATS
from migrate.compare.tolerances import Tolerances
from migrate.errors import MigrateError
from migrate.jsonsafe import load_json
from migrate.judge import fmt_figure

__all__ = ["describe", "align_runs", "first_window", "mask_unlogged", "resolution_bounds", "torch_clip_golden",
           "format_of"]

_TORCH_CLIP_EPS = 1e-6


def format_of(run: Run) -> LogFormat:
    if run.format.startswith("tensorboard:"):
        return TB_DIALECTS[run.format.split(":", 1)[1]][0]
    return FORMATS[run.format]


def describe(run: Run, label: str) -> str | None:
    """One note naming a foreign log's format and what it logs (None for metrics.jsonl)."""
    if run.format == "metrics":
        return None
    fmt = format_of(run)
    gaps = np.diff(run.steps)
    interval = f", every {int(np.median(gaps))} steps" if len(gaps) and gaps.max() > 1 else ""
    fields = [c for c in ("loss", "lr", "grad_norm", "loss_scale", "skipped", "grad_norm_clipped")
              if (getattr(run, c) is not None and not np.isnan(np.asarray(getattr(run, c), float)).all())]
    return (f"{label} read as {fmt.title} ({run.path}; {fmt.source}): {len(run)} steps{interval}; "
            f"columns {', '.join(fields)}" + ("; its loss averages the steps since the previous entry"
                                             if fmt.loss_averaged else ""))


def _subset(run: Run, keep: np.ndarray) -> Run:
    """The run at the steps where ``keep``."""
    changes = {}
    for f in dataclasses.fields(run):
        v = getattr(run, f.name)
        if isinstance(v, np.ndarray) and v.shape[:1] == run.steps.shape:
            changes[f.name] = v[keep]
    changes["resolution"] = {k: v[keep] for k, v in run.resolution.items()}
    return dataclasses.replace(run, **changes)


def _windows(run: Run) -> np.ndarray:
    return run.loss_window if run.loss_window is not None else np.ones(len(run), np.int64)


def _average_over(avg: Run, dense: Run, labels: tuple[str, str], notes: list[str]) -> Run:
    """``dense``'s loss at each of ``avg``'s steps, averaged over ``avg``'s window ending there."""
    a_label, d_label = labels
    index = {int(s): i for i, s in enumerate(dense.steps)}
    loss = dense.loss.copy()
    skipped = dense.skipped if dense.skipped is not None else np.zeros(len(dense), bool)
    averaged = 0
    for step, width in zip(avg.steps, _windows(avg), strict=True):
        step, width = int(step), int(width)
        if width <= 1 or step not in index:
            continue
        window = range(step - width + 1, step + 1)
        missing = [s for s in window if s not in index]
        if missing:
            raise MigrateError(
                f"{a_label}'s loss at step {step} is the mean of steps {window.start}..{step} "
                f"({format_of(avg).title}); {d_label} does not log step {missing[0]}: log every step on the "
                f"{d_label} side, or the same interval on both")
        rows = [index[s] for s in window if not skipped[index[s]]]
        loss[index[step]] = float(np.mean(dense.loss[rows])) if rows else math.nan
        averaged += 1
    if averaged:
        notes.append(f"{a_label} logs the loss averaged over the steps since its previous entry (log interval "
                     f"{int(np.median(_windows(avg)))}): {d_label}'s loss is averaged over the same steps "
                     f"at {averaged} paired steps before comparing")
    return dataclasses.replace(dense, loss=loss)


def _next_lr(run: Run) -> Run:
    """The run with each step's lr replaced by the next step's (NaN where that step is not logged)."""
    index = {int(s): i for i, s in enumerate(run.steps)}
    lr = np.array([run.lr[index[int(s) + 1]] if int(s) + 1 in index else np.nan for s in run.steps])
    return dataclasses.replace(run, lr=lr)


def _prev_lr(run: Run) -> Run:
    """The run with each step's lr taken from the previous step's line (NaN for the first)."""
    return dataclasses.replace(run, lr=np.concatenate([[np.nan], run.lr[:-1]]))


def _is_sparse(run: Run) -> bool:
    """A foreign log that does not log every step (a hole in metrics.jsonl stays a steps-rule failure)."""
    return run.format != "metrics" and len(run) > 0 and (int(run.steps[0]) > 1 or
                                                          (len(run) > 1 and np.diff(run.steps).max() > 1))


def first_window(golden: Run, ms: Run, step: int) -> int:
    """How many steps the loss compared at ``step`` averages (1 for a step's own loss)."""
    widths = [int(_windows(r)[np.searchsorted(r.steps, step)]) for r in (golden, ms) if step in r.steps]
    return max(widths, default=1)


def align_runs(golden: Run, ms: Run, notes: list[str]) -> tuple[Run, Run]:
    """The two runs made comparable: lr of the same step, averaged losses matched, sparse logs paired
    on their steps."""
    runs = {"golden": golden, "MindSpore": ms}
    for a_label, d_label in (("golden", "MindSpore"), ("MindSpore", "golden")):
        a, d = runs[a_label], runs[d_label]
        if not format_of(a).lr_of_next_step or format_of(d).lr_of_next_step:
            continue
        if len(a) > 1 and np.diff(a.steps).max() == 1:   # every step logged: each lr goes to its own step
            runs[a_label] = _prev_lr(a)
            notes.append(f"{a_label} ({format_of(a).title}) prints the next step's lr (its scheduler steps "
                         "before the log line): each is compared at the step it belongs to; step "
                         f"{int(a.steps[0])}'s is not in the log")
        else:
            runs[d_label] = _next_lr(d)
            notes.append(f"{a_label} ({format_of(a).title}) prints the next step's lr at its logged steps (its "
                         f"scheduler steps before the log line): compared there with {d_label}'s lr of the next "
                         "step")
    for a_label, d_label in (("golden", "MindSpore"), ("MindSpore", "golden")):
        a, d = runs[a_label], runs[d_label]
        if not (_windows(a) > 1).any():
            continue
        if (_windows(d) > 1).any():
            common = np.intersect1d(a.steps, d.steps)
            wa = dict(zip(a.steps.tolist(), _windows(a).tolist(), strict=True))
            wd = dict(zip(d.steps.tolist(), _windows(d).tolist(), strict=True))
            bad = [int(s) for s in common if wa[int(s)] != wd[int(s)]]
            if bad:
                raise MigrateError(f"both logs average the loss, over different steps (at step {bad[0]}: golden "
                                   f"{(wa if a_label == 'golden' else wd)[bad[0]]} steps, MindSpore "
                                   f"{(wd if a_label == 'golden' else wa)[bad[0]]}): log the same interval on both")
            continue
        runs[d_label] = _average_over(a, d, (a_label, d_label), notes)
    sparse = {label: _is_sparse(run) for label, run in (("golden", golden), ("MindSpore", ms))}
    if all(sparse.values()):
        common = np.intersect1d(runs["golden"].steps, runs["MindSpore"].steps)
        for label in runs:
            runs[label] = _subset(runs[label], np.isin(runs[label].steps, common))
        notes.append(f"both logs skip steps: judged at the {len(common)} steps both have")
    for s_label, o_label in (("golden", "MindSpore"), ("MindSpore", "golden")):
        if not sparse[s_label] or sparse[o_label]:
            continue
        sparse_run, other = runs[s_label], runs[o_label]
        drop = (other.steps <= sparse_run.steps[-1]) & ~np.isin(other.steps, sparse_run.steps)
        if drop.any():
            runs[o_label] = _subset(other, ~drop)
            notes.append(f"{s_label} logs every {int(np.median(np.diff(sparse_run.steps)))} steps: judged at the "
                         f"steps both logs have; {int(drop.sum())} {o_label} steps up to its last left out")
    return runs["golden"], runs["MindSpore"]


def mask_unlogged(res, golden: Run, ms: Run) -> None:
    """A foreign log's lr / grad norm missing at a step (not logged there, or the next step's lr past
    the other run's end) is left out of the lr and grad rules rather than counted as a difference;
    metrics.jsonl never lacks an lr, and its null grad_norm (an overflow) stays a difference."""
    for run, lr, grad in ((golden, res.lr_golden, res.grad_golden), (ms, res.lr_ms, res.grad_ms)):
        res.lr_rel[np.isnan(lr)] = np.nan
        if run.format != "metrics":
            res.grad_rel[np.isnan(grad)] = np.nan


def _rel_resolution(golden: Run, ms: Run, steps: np.ndarray, column: str, ref: np.ndarray) -> np.ndarray | None:
    parts = []
    for run in (golden, ms):
        r = run.resolution.get(column)
        if r is not None:
            parts.append(np.asarray(r)[np.searchsorted(run.steps, steps)])
    if not parts:
        return None
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = sum(parts) / np.abs(ref)
    return np.where(np.isfinite(rel), rel, np.nan)


def resolution_bounds(golden: Run, ms: Run, steps: np.ndarray, ref: dict[str, np.ndarray], tol: Tolerances,
                      notes: list[str]) -> tuple[Tolerances, float]:
    """``tol`` with each bound grown by the relative resolution of the printed values it judges, and
    the drift rule's floor (0 where both logs are full precision)."""
    changes, said, drift_floor = {}, [], 0.0
    loss = _rel_resolution(golden, ms, steps, "loss", ref["loss"])
    if loss is not None and np.isfinite(loss).any():
        changes.update(first=tol.first + float(np.nan_to_num(loss[0])), max=tol.max + float(np.nanmax(loss)),
                       mean=tol.mean + float(np.nanmean(loss)))
        drift_floor = float(np.nanmedian(loss))
        said.append(f"loss {fmt_figure(float(np.nanmedian(loss)))}")
    lr = _rel_resolution(golden, ms, steps, "lr", ref["lr"])
    if lr is not None and np.isfinite(lr).any():
        changes["lr"] = tol.lr + float(np.nanmax(lr))
        said.append(f"lr {fmt_figure(float(np.nanmax(lr)))}")
    grad = _rel_resolution(golden, ms, steps, "grad_norm", ref["grad_norm"])
    if grad is not None and np.isfinite(grad).any():
        changes.update(grad_max=tol.grad_max + float(np.nanmax(grad)),
                       grad_mean=tol.grad_mean + float(np.nanmean(grad)))
        said.append(f"grad norm {fmt_figure(float(np.nanmax(grad)))}")
    if not changes:
        return tol, 0.0
    widened = dataclasses.replace(tol, **changes)
    grown = ", ".join(f"{k} {fmt_figure(getattr(tol, k))} -> {fmt_figure(v)}" for k, v in changes.items())
    notes.append(f"printed precision of the logs (relative, typical): {'; '.join(said)}: bounds grown by it "
                 f"({grown})")
    return widened, drift_floor


def _max_norm(hparams) -> float | None:
    if hparams is None:
        return None
    if hparams.golden_max_norm:
        return hparams.golden_max_norm
    if hparams.ms_file is None:
        return None
    try:
        data = load_json(Path(hparams.ms_file))
        value = data["clipping"]["max_grad_norm"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else None


def torch_clip_golden(golden: Run, ms: Run, hparams, dtype: str, notes: list[str]) -> Run:
    """The golden with torch's post-clip norm where its log lacks one (see the module docstring)."""
    if golden.grad_norm_clipped is not None or ms.grad_norm_clipped is None or golden.format == "metrics":
        return golden
    fmt = format_of(golden)
    why = None
    max_norm = _max_norm(hparams)
    if not fmt.torch_clip:
        why = f"{fmt.title} does not clip as torch does"
    elif dtype != "fp32":
        why = f"in {dtype} torch's own post-clip norm departs from its formula by as much as a missing epsilon"
    elif max_norm is None:
        why = "no max_grad_norm recorded (effective_hparams.json beside either log, or --hparams)"
    if why:
        notes.append(f"clip rule not judged: the golden log ({fmt.title}) has no post-clip grad norm and {why}")
        return golden
    n = golden.grad_norm
    with np.errstate(invalid="ignore"):
        clipped = np.where(n + _TORCH_CLIP_EPS > max_norm, max_norm * n / (n + _TORCH_CLIP_EPS), n)
    notes.append(f"the golden log ({fmt.title}) has no post-clip grad norm: the clip rule uses torch's "
                 f"max_norm · n / (n + 1e-6) on its pre-clip norm n (max_norm {max_norm:g})")
    return dataclasses.replace(golden, grad_norm_clipped=clipped)
