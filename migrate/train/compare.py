"""Compare two training runs' metrics.jsonl: the golden PyTorch run and the MindSpore run.

    result = compare_runs("golden/metrics.jsonl", "ms/metrics.jsonl",
                          noise_path="golden-seed2/metrics.jsonl", dtype="bf16",
                          tolerances={"mean": 5e-3})      # overrides; None keeps a default
    print_summary(result, console)                      # rich table + verdict line
    write_plot(result, "compare.png"); write_json(result, "compare.json")
    sys.exit(result.exit_code)                          # 0 within tolerance, 1 drift

A path may be the metrics.jsonl file or the run folder holding it.

Input
-----
One JSON object per line, as ``golden/train_torch.py`` writes them: ``step``
(int >= 1), ``loss`` (number, or null when non-finite), ``lr`` (finite
number), ``grad_norm`` (number or null); optional ``grad_norm_clipped`` (the
total norm measured on the gradients after clipping; number or null),
``tokens``, ``time``, and in fp16 ``skipped`` (bool) and ``loss_scale``. Blank lines are ignored. A missing
or unreadable file, a line that is not a JSON object, a missing required key,
a value of the wrong type and a step logged twice are `MigrateError`s naming
``file:line`` (the CLI exits 2). So is a pair of runs with no step in common.

Pairing
-------
Runs are paired by ``step``. Steps logged by one run only are listed and are a
failure ("steps"), except with ``allow_prefix=True`` when the shorter run is a
prefix of the longer one -- one side simply stopped early (or is still
running) and every step up to its last is present on both sides; a step
missing in the middle is always a failure. All judgements use the paired
steps only.

Per step (golden is the baseline; rel = |ms - golden| / |golden|)
---------
loss abs and rel diff, lr rel diff, grad_norm rel diff. A value null on one
side only counts as an infinite difference; null on both sides (both
overflowed) is agreement and is left out of means and maxima. grad_norm of
steps skipped on both sides is left out. ``skipped`` flags must agree step by
step, and so must ``loss_scale`` and ``tokens`` where both logs have them
(``tokens`` differing means the two runs did not see the same batches).

Rules (each names the first step out of tolerance)
-----
``first``  loss rel diff at the first paired step  (one forward pass on the
           same converted weights and the same batch);
``max``    per-step loss rel diff, every step;
``mean``   mean loss rel diff over the run; its first step is the one where
           the running mean first exceeds the bound;
``lr``     per-step lr rel diff (both sides evaluate the same HF formula in
           Python floats, so fp32 and low precision alike get 1e-12; a side
           that logs a float32 tensor's value needs ``lr=1e-7``);
``grad_mean`` / ``grad_max``  grad_norm rel diff, mean (running) and per step;
``band``   bf16 / fp16 with a noise run only -- see below;
``drift``  fp32 only: the loss rel diff must not stay on one side of the golden,
           beyond ``drift`` x its first steps' level, for ``drift_window``
           steps in a row (`_drift_check`);
``clip``   when both logs have grad_norm_clipped -- see below;
``hparams`` the two runs' effective_hparams.json (beside each metrics.jsonl,
           or ``hparams=(golden_file, ms_file)``): any knob both record that
           differs fails, named with both values (`hparams_check`); without
           both files the check is skipped and a note says so.

Defaults (`Tolerances.for_dtype`)::

              first   mean   max    lr      grad_mean grad_max band_k window band_floor      clip  drift
    fp32      1e-6    1e-4   1e-3   1e-12   1e-3      1e-2     -      20     -               2e-7  10 (10 steps)
    bf16      5e-3    1e-2   5e-2   1e-12   5e-2      2.5e-1   2      20     2**-8 (3.9e-3)  2e-7  -
    fp16      5e-3    1e-2   5e-2   1e-12   5e-2      2.5e-1   2      20     2**-11 (4.9e-4) 2e-7  -

fp32 is judged on fixed bounds, much tighter than MindFormers' since both
frameworks compute the same fp32 graph: the first step is one forward pass
(~1e-7 apart), and drift then grows only slowly at fine-tuning learning
rates. The fixed mean bound (1e-4) is still ~300x what correct runs reach
(3e-7), loose enough to pass weight decay 0 against 0.1 over 40 steps (mean
2.4e-5); the ``drift`` rule closes that gap from the curve's shape: correct
runs stay at their first-step level (or wander with random sign), a
one-sided fault moves the loss one way, steadily. bf16 / fp16 take
MindFormers' acceptance bounds -- first-step loss within 0.5 %, mean loss
within 1 % of the baseline -- plus a coarse 5 % per-step guard.

Noise run (``noise_path``): the golden run again with another data / dropout
seed, or with the same seed (it then measures nondeterminism: zero for CPU
fp32). Its own figures against the golden (first, mean, max loss rel diff,
grad mean / max) are reported next to MindSpore's; a bound tighter than the
baseline's own noise is flagged in the notes (MindFormers: compare the
baseline with itself first to learn its noise). In bf16 / fp16 it also sets
the band rule:

    r_t = |ms_t - golden_t| / |golden_t|,   n_t = |noise_t - golden_t| / |golden_t|
    R_t = mean of r over the ``window`` paired steps ending at t   (trailing)
    N_t = mean of n over the 4 x ``window`` paired steps centred on t
    pass at t  iff  R_t <= max(band_k x N_t, band_floor)

judged at every step with a full trailing window (a run shorter than the
window is judged once, at its last step, over all of it). The noise band is
averaged over a wider, centred window because it is the reference: a noisy
short-window estimate of it would fail a MindSpore run that is itself just
another noise sample (on i.i.d. noise, k = 2 with these windows fails such a
run ~0.1 % of the time; a systematic offset of 3x the noise always fails).
``band_floor`` is the dtype's unit roundoff, so a zero band (a deterministic
rerun) never demands more than one rounding unit. With a noise run the
low-precision ``max``, ``grad_mean`` and ``grad_max`` bounds widen to
band_k x the noise run's own figure where that is larger; ``first``, ``mean``
and ``lr`` stay fixed. In fp32 the noise run is reported and plotted but
does not change the verdict. Without one, bf16 / fp16 fall back to the fixed
bounds above.

Which seed to vary: a noise run with another data seed reads other batches,
so n_t also holds the batch-to-batch spread of the loss, which MindSpore --
reading the golden's batches -- does not have. The band is then generous,
never tight: measured on a tiny Llama over 200 bf16 steps
(tests/test_bf16_band.py), golden vs data seed 6 averages 2.6e-2 per step,
MindSpore vs golden 2.2e-4 (worst window at 0.7 % of its allowance), and
AdamW without bias correction reaches 330 %. Differencing window-smoothed
curves instead would shrink that band ~3.5x, but with k = 2 it fails a
MindSpore run that is itself another sample (dropout on) most of the time
in simulation, so the windowed mean of |r| stays.

Clip rule: where clip_grad_norm_ acts, the post-clip norm is max_norm *
norm / (norm + 1e-6), nearly independent of the gradients, so both sides
agree to a few fp32 ulps in every dtype (the gradients are fp32 master
gradients). At the steps both sides clipped, with pre-clip norms within 1 %
of each other, s_t = (ms_t - golden_t) / golden_t of grad_norm_clipped; the
rule bounds |mean of s_t|. Rounding averages out (measured: 1.6e-8 over 96
clipped fp32 steps, 7.7e-9 over 85 bf16 ones), while a clip coefficient
without torch's +1e-6 shifts every clipped step by +1e-6 / norm (8.3e-7
there) -- a fault AdamW hides from the loss curve, since it is invariant to
the gradient's scale. Over few clipped steps the bound widens to 3 standard
errors of that mean (single steps differ by up to ~1e-6: the demo's 12 clipped
steps averaged 1.7e-7). The noise run's figure is reported, never used to
widen this bound. The rule is judged only where the epsilon is measurable:
its shift (mean 1e-6 / norm) must be 4x the golden's own norm rounding, read
from the golden's log against torch's own clip formula, and the bound is at
least twice that rounding (`_golden_clip_rounding`).
In bf16 / fp16 runs of a 1M-parameter model that rounding (0.5-3.5e-6) is as
large as the shift, and a correct run failed the rule; such runs now report
the rule as not judged, with a note, instead of failing it.

Override any bound with ``tolerances={"first": ..., "mean": ..., "max": ...,
"lr": ..., "grad_mean": ..., "grad_max": ..., "band_k": ..., "window": ...,
"band_floor": ..., "clip": ..., "drift": ..., "drift_window": ...}`` (None keeps the
default, ``math.inf`` disables a check)
or pass a `Tolerances`.

Output: `print_summary` (rich table, one row per rule: MindSpore's figure,
the noise run's, the bound, the first step out; then notes and a verdict line
naming the first step and metric out of tolerance), `write_plot` (PNG: loss
curves, per-step |ms - golden| rel diff with the noise band shaded, lr;
failing steps marked) and `write_json` / ``to_dict()`` (strict JSON,
non-finite floats as "nan" / "inf"). Files are written atomically.
"""
from __future__ import annotations

import dataclasses
import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from migrate.checkpoints.atomic import atomic_write_bytes, atomic_write_text
from migrate.jsonsafe import jsonable as _jsonable
from migrate.errors import MigrateError
from migrate.train.config import DTYPES
from migrate.train.hparams_check import HparamsCheck, cross_check
from migrate.train.hparams_check import short as _short

__all__ = [
    "SCHEMA_VERSION",
    "Tolerances",
    "Run",
    "Check",
    "CompareResult",
    "read_metrics",
    "compare_runs",
    "print_summary",
    "render_plot",
    "write_plot",
    "write_json",
]

SCHEMA_VERSION = 1
REQUIRED_KEYS = ("step", "loss", "lr", "grad_norm")
_UNIT_ROUNDOFF = {"bf16": 2.0 ** -8, "fp16": 2.0 ** -11}
_NOISE_WINDOW_FACTOR = 4
_CLIP_PRE_AGREE = 1e-2  # the clip rule judges steps whose pre-clip norms agree this well
_TORCH_CLIP_EPS = 1e-6  # clip_grad_norm_'s coefficient: max_norm / (norm + 1e-6)
_CLIP_MEASURABLE = 4.0  # judge the clip epsilon where its shift is this many times the golden's norm rounding


# --------------------------------------------------------------------------- tolerances

@dataclass(frozen=True)
class Tolerances:
    """Bounds for one dtype; see the module docstring for each rule.

    Relative bounds are >= 0 (``math.inf`` disables a check); ``band_k`` > 0;
    ``window`` an int >= 1; ``band_floor`` >= 0. ``band_k`` / ``band_floor``
    are None in fp32, where no band rule applies; ``drift`` (a factor over the
    first steps' level, see `_drift_check`) is None in bf16 / fp16, where the
    band rule judges drift against the golden's own noise.
    """

    dtype: str = "fp32"
    first: float = 1e-6
    mean: float = 1e-4
    max: float = 1e-3
    lr: float = 1e-12
    grad_mean: float = 1e-3
    grad_max: float = 1e-2
    band_k: float | None = None
    window: int = 20
    band_floor: float | None = None
    clip: float = 2e-7
    drift: float | None = 10.0
    drift_window: int = 10

    @classmethod
    def for_dtype(cls, dtype: str) -> "Tolerances":
        dt = canonical_dtype(dtype)
        if dt == "fp32":
            return cls("fp32")
        return cls(dt, first=5e-3, mean=1e-2, max=5e-2, lr=1e-12, grad_mean=5e-2, grad_max=0.25,
                   band_k=2.0, window=20, band_floor=_UNIT_ROUNDOFF[dt], clip=2e-7, drift=None)

    @property
    def low_precision(self) -> bool:
        return self.dtype in ("bf16", "fp16")

    def with_overrides(self, **values: Any) -> "Tolerances":
        """A copy with the given bounds replaced; None values are ignored."""
        names = {f.name for f in dataclasses.fields(self)} - {"dtype"}
        unknown = set(values) - names
        if unknown:
            raise MigrateError(f"unknown tolerance {', '.join(sorted(unknown))}; "
                               f"expected one of {', '.join(sorted(names))}")
        given = {}
        for name, value in values.items():
            if value is None:
                continue
            try:
                v = float(value)
            except (TypeError, ValueError):
                raise MigrateError(f"tolerance {name}: {value!r} is not a number") from None
            if math.isnan(v) or v < 0:
                raise MigrateError(f"tolerance {name} must be a number >= 0, got {value!r}")
            if name in ("window", "drift_window"):
                if not (math.isfinite(v) and v >= 1 and v == int(v)):
                    raise MigrateError(f"tolerance {name} must be a whole number of steps >= 1, got {value!r}")
                v = int(v)
            if name == "band_k" and v == 0:
                raise MigrateError("tolerance band_k must be > 0 (use inf to disable the band rule)")
            given[name] = v
        return dataclasses.replace(self, **given) if given else self

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def canonical_dtype(dtype: Any) -> str:
    key = str(dtype).lower()
    if key not in DTYPES:
        raise MigrateError(f"unknown dtype {dtype!r}; expected fp32, bf16 or fp16")
    return DTYPES[key]


# --------------------------------------------------------------------------- reading

@dataclass
class Run:
    """One metrics.jsonl, sorted by step. Non-finite / null values are NaN."""

    path: Path
    steps: np.ndarray
    loss: np.ndarray
    lr: np.ndarray
    grad_norm: np.ndarray
    tokens: np.ndarray | None
    time: np.ndarray | None
    skipped: np.ndarray | None
    loss_scale: np.ndarray | None
    lines: np.ndarray  # 1-based line number of each step
    grad_norm_clipped: np.ndarray | None = None  # total norm after clipping, where logged

    def __len__(self) -> int:
        return len(self.steps)

    def span(self) -> str:
        return f"steps {int(self.steps[0])}..{int(self.steps[-1])}" if len(self) else "no steps"


def _resolve(path: Any, role: str) -> Path:
    if path is None:
        raise MigrateError(f"no {role} metrics file given")
    p = Path(path)
    if p.is_dir():
        if (p / "metrics.jsonl").is_file():
            return p / "metrics.jsonl"
        raise MigrateError(f"{p}: a folder without metrics.jsonl ({role} run)")
    if not p.exists():
        raise MigrateError(f"{p}: no such file ({role} metrics)")
    return p


def _number(rec: dict, key: str, where: str, *, nullable: bool, optional: bool = False) -> float:
    if key not in rec:
        if optional:
            return math.nan
        raise MigrateError(f"{where}: missing key {key!r}")
    v = rec[key]
    if v is None:
        if nullable or optional:
            return math.nan
        raise MigrateError(f"{where}: {key!r} is null; expected a number")
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise MigrateError(f"{where}: {key!r} must be a number{' or null' if nullable else ''}, got {v!r}")
    v = float(v)
    if not nullable and not optional and not math.isfinite(v):
        raise MigrateError(f"{where}: {key!r} must be finite, got {v!r}")
    return v


def read_metrics(path: Any, role: str = "metrics") -> Run:
    """Parse a metrics.jsonl (or a run folder holding one) into a `Run`."""
    p = _resolve(path, role)
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise MigrateError(f"{p}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise MigrateError(f"{p}: cannot read ({e.strerror or e})") from None
    rows: dict[int, tuple] = {}
    seen_line: dict[int, int] = {}
    has = {"tokens": False, "time": False, "skipped": False, "loss_scale": False, "grad_norm_clipped": False}
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{p}:{lineno}"
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise MigrateError(f"{where}: not JSON ({e.msg} at column {e.colno})") from None
        if not isinstance(rec, dict):
            raise MigrateError(f"{where}: expected a JSON object, got {type(rec).__name__}")
        for key in REQUIRED_KEYS:
            if key not in rec:
                raise MigrateError(f"{where}: missing key {key!r} (need {', '.join(REQUIRED_KEYS)})")
        step = rec["step"]
        if (isinstance(step, bool) or not isinstance(step, (int, float)) or not math.isfinite(step)
                or step != int(step) or step < 1):
            raise MigrateError(f"{where}: 'step' must be an integer >= 1, got {step!r}")
        step = int(step)
        if step in seen_line:
            raise MigrateError(f"{where}: step {step} already logged on line {seen_line[step]}")
        seen_line[step] = lineno
        loss = _number(rec, "loss", where, nullable=True)
        lr = _number(rec, "lr", where, nullable=False)
        grad = _number(rec, "grad_norm", where, nullable=True)
        tokens = _number(rec, "tokens", where, nullable=False, optional=True)
        tm = _number(rec, "time", where, nullable=False, optional=True)
        scale = _number(rec, "loss_scale", where, nullable=True, optional=True)
        clipped = _number(rec, "grad_norm_clipped", where, nullable=True, optional=True)
        skipped = rec.get("skipped", False)
        if skipped is None:
            skipped = False
        if not isinstance(skipped, bool):
            raise MigrateError(f"{where}: 'skipped' must be true or false, got {skipped!r}")
        for key in has:
            has[key] = has[key] or key in rec
        rows[step] = (loss, lr, grad, tokens, tm, skipped, scale, lineno, clipped)
    if not rows:
        raise MigrateError(f"{p}: no metrics lines ({role} run)")
    steps = np.array(sorted(rows), dtype=np.int64)
    cols = list(zip(*(rows[s] for s in steps)))

    def col(i, dtype=float):
        return np.array(cols[i], dtype=dtype)

    return Run(path=p, steps=steps, loss=col(0), lr=col(1), grad_norm=col(2),
               tokens=col(3) if has["tokens"] else None, time=col(4) if has["time"] else None,
               skipped=col(5, bool) if has["skipped"] else None,
               loss_scale=col(6) if has["loss_scale"] else None, lines=col(7, np.int64),
               grad_norm_clipped=col(8) if has["grad_norm_clipped"] else None)


# --------------------------------------------------------------------------- numerics

def rel_diff(got: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """|got - ref| / |ref| elementwise; NaN where both are non-finite (agreement),
    inf where only one is, 0 / inf where ref is 0."""
    got = np.asarray(got, dtype=float)
    ref = np.asarray(ref, dtype=float)
    out = np.full(np.broadcast(got, ref).shape, np.nan)
    fg, fr = np.isfinite(got), np.isfinite(ref)
    both = fg & fr
    out[fg != fr] = np.inf
    with np.errstate(divide="ignore", invalid="ignore"):
        diff = np.abs(got - ref)
        rel = np.where(ref != 0, diff / np.abs(ref), np.where(diff == 0, 0.0, np.inf))
    out[both] = rel[both]
    return out


def _trailing_mean(x: np.ndarray, w: int) -> np.ndarray:
    """Mean of the finite-or-inf values among the last w entries (NaN entries skipped)."""
    return _window_mean(x, lambda i, n: (np.maximum(0, i - w + 1), i + 1))


def _centred_mean(x: np.ndarray, w: int) -> np.ndarray:
    half = w // 2
    return _window_mean(x, lambda i, n: (np.maximum(0, i - half), np.minimum(n, i + half + 1)))


def _window_mean(x: np.ndarray, bounds) -> np.ndarray:
    x = np.asarray(x, dtype=float)
    n = len(x)
    if n == 0:
        return x.copy()
    valid = ~np.isnan(x)
    isinf = np.isinf(x)
    vals = np.where(valid & ~isinf, x, 0.0)
    c = np.concatenate([[0.0], np.cumsum(vals)])
    cn = np.concatenate([[0], np.cumsum(valid)])
    ci = np.concatenate([[0], np.cumsum(isinf)])
    i = np.arange(n)
    lo, hi = bounds(i, n)
    cnt = cn[hi] - cn[lo]
    with np.errstate(invalid="ignore", divide="ignore"):
        out = (c[hi] - c[lo]) / cnt
    out[cnt == 0] = np.nan
    out[(ci[hi] - ci[lo]) > 0] = np.inf
    return out


def _running_mean(x: np.ndarray) -> np.ndarray:
    return _window_mean(x, lambda i, n: (np.zeros_like(i), i + 1))


def _nanmax(x: np.ndarray) -> float:
    x = np.asarray(x, dtype=float)
    x = x[~np.isnan(x)]
    return float(x.max()) if x.size else math.nan


def _nanmean(x: np.ndarray) -> float:
    x = np.asarray(x, dtype=float)
    x = x[~np.isnan(x)]
    return float(x.mean()) if x.size else math.nan


# --------------------------------------------------------------------------- result

@dataclass
class Check:
    """One rule. ``passed`` is None when the rule was not judged (no data, disabled)."""

    key: str
    label: str
    value: float | None = None      # MindSpore's figure
    limit: float | None = None      # the bound it was held to
    passed: bool | None = None
    step: int | None = None         # first step out of tolerance
    noise: float | None = None      # the noise run's own figure, when it has one
    detail: str = ""

    def reason(self) -> str:
        if self.detail:
            return self.detail
        return f"{self.label} {_fmt(self.value)} > {_fmt(self.limit)}"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# Rule order: the tie-break for "first out of tolerance" at the same step.
_CHECK_ORDER = ("hparams", "steps", "tokens", "skipped", "loss_scale", "first", "max", "band", "mean", "drift",
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
    hparams: Any = None                     # hparams_check.HparamsCheck: the effective_hparams.json cross-check

    # ----------------------------------------------------------------- verdict
    @property
    def judged(self) -> list[Check]:
        return [c for c in self.checks if c.passed is not None]

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.passed is False]

    @property
    def passed(self) -> bool:
        return not self.failed

    @property
    def exit_code(self) -> int:
        return 0 if self.passed else 1

    @staticmethod
    def _order(c: Check) -> tuple:
        return (c.step if c.step is not None else math.inf,
                _CHECK_ORDER.index(c.key) if c.key in _CHECK_ORDER else 99)

    @property
    def first_failure(self) -> Check | None:
        fails = self.failed
        return min(fails, key=self._order) if fails else None

    def check(self, key: str) -> Check | None:
        for c in self.checks:
            if c.key == key:
                return c
        return None

    def verdict_text(self) -> str:
        n = len(self.steps)
        span = f"{n} paired step{'s' if n != 1 else ''}"
        hp = self.check("hparams")
        if self.passed:
            loss_mean = self.check("mean")
            text = (f"PASS · {span} within {self.dtype} tolerance"
                    + (f" (mean loss rel diff {_fmt(loss_mean.value)})" if loss_mean else ""))
            if self.hparams is not None:
                text += " · " + ("hyperparameters not cross-checked" if self.hparams.skipped
                                 else f"{len(self.hparams.rows)} hyperparameters agree")
            return text
        parts = []
        if hp is not None and hp.passed is False:   # the cause, named before its symptoms
            parts.append(hp.reason())
        curve = [c for c in self.failed if c.key != "hparams"]
        if curve:
            first = min(curve, key=self._order)
            where = f"step {first.step}" if first.step is not None else "the run"
            others = [c for c in curve if c is not first]
            tail = ""
            if others:
                tail = "; also " + ", ".join(
                    f"{c.key}" + (f" from step {c.step}" if c.step is not None else "") for c in others)
            parts.append(f"first out of tolerance at {where}: {first.reason()}{tail}")
        return "FAIL · " + " · ".join(parts)

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
        return _jsonable({
            "schema_version": SCHEMA_VERSION,
            "tool": "migrate compare",
            "runs": {"golden": str(self.golden_path), "ms": str(self.ms_path),
                     "noise": str(self.noise_path) if self.noise_path else None,
                     "golden_steps": self.golden_steps, "ms_steps": self.ms_steps,
                     "noise_steps": self.noise_steps if self.noise_path else None,
                     "paired_steps": len(self.steps), "only_golden": self.only_golden, "only_ms": self.only_ms,
                     "allow_prefix": self.allow_prefix},
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
            "notes": self.notes,
            "fail_steps": self.fail_steps,
            "per_step": per_step,
        })


def _fmt(v: Any) -> str:
    if v is None:
        return "—"
    if isinstance(v, (bool, np.bool_)):
        return str(bool(v))
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    v = float(v)
    if math.isnan(v):
        return "n/a"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    if v == 0:
        return "0"
    return f"{v:.2e}"


# --------------------------------------------------------------------------- comparing

def _align(run: Run, steps: np.ndarray, arr: np.ndarray | None, fill=np.nan) -> np.ndarray:
    """Values of a run's column at the given steps (fill where the run lacks a step or the column)."""
    out = np.full(len(steps), fill, dtype=float if arr is None or arr.dtype != bool else bool)
    if arr is None:
        return out
    idx = np.searchsorted(run.steps, steps)
    idx = np.clip(idx, 0, max(len(run.steps) - 1, 0))
    hit = run.steps[idx] == steps if len(run.steps) else np.zeros(len(steps), bool)
    out[hit] = arr[idx[hit]]
    return out


def _first_over(steps: np.ndarray, values: np.ndarray, limit: float) -> int | None:
    bad = values > limit  # NaN compares False: excluded
    return int(steps[np.argmax(bad)]) if bad.any() else None


def _is_prefix(short: np.ndarray, long: np.ndarray) -> bool:
    return len(short) <= len(long) and np.array_equal(short, long[: len(short)])


def compare_runs(golden_path: Any, ms_path: Any, noise_path: Any = None, dtype: str = "fp32",
                 tolerances: Tolerances | Mapping[str, Any] | None = None, *,
                 allow_prefix: bool = False, hparams: tuple[Any, Any] | None = None) -> CompareResult:
    """Read and compare the golden and MindSpore metrics (and optionally a noise run).

    ``tolerances``: a `Tolerances`, or a mapping of overrides onto the dtype's
    defaults (None values keep the default). ``hparams``: the two runs'
    effective_hparams.json (golden's first); by default the files beside the
    two metrics.jsonl, and the cross-check is skipped, saying so, where one is
    missing. Raises `MigrateError` on bad input.
    """
    dt = canonical_dtype(dtype)
    tol = Tolerances.for_dtype(dt)
    if isinstance(tolerances, Tolerances):
        tol = dataclasses.replace(tolerances, dtype=dt)
    elif tolerances is not None:
        tol = tol.with_overrides(**dict(tolerances))
    golden = read_metrics(golden_path, "golden")
    ms = read_metrics(ms_path, "MindSpore")
    noise = read_metrics(noise_path, "noise") if noise_path is not None else None

    steps = np.intersect1d(golden.steps, ms.steps)
    only_golden = [int(s) for s in np.setdiff1d(golden.steps, ms.steps)]
    only_ms = [int(s) for s in np.setdiff1d(ms.steps, golden.steps)]
    if not len(steps):
        raise MigrateError(f"no step in common: {golden.path} has {golden.span()}, {ms.path} has {ms.span()}")

    def g(arr, fill=np.nan):
        return _align(golden, steps, arr, fill)

    def m(arr, fill=np.nan):
        return _align(ms, steps, arr, fill)

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
    loss_window = _trailing_mean(loss_rel, tol.window)

    res = CompareResult(golden_path=golden.path, ms_path=ms.path, noise_path=noise.path if noise else None,
                        dtype=dt, tolerances=tol, allow_prefix=allow_prefix, steps=steps,
                        loss_golden=lg, loss_ms=lm, loss_abs=loss_abs, loss_rel=loss_rel,
                        lr_golden=rg, lr_ms=rm, lr_rel=lr_rel, grad_golden=gg, grad_ms=gm, grad_rel=grad_rel,
                        skipped_golden=sg, skipped_ms=sm, loss_window=loss_window,
                        only_golden=only_golden, only_ms=only_ms,
                        golden_steps=len(golden), ms_steps=len(ms), noise_steps=len(noise) if noise else 0)
    checks: list[Check] = []
    res.hparams = cross_check(golden.path, ms.path, hparams)
    checks.append(_hparams_check(res.hparams, res))

    def fail_steps(key, mask):
        res.fail_steps[key] = [int(s) for s in steps[mask]]

    # ---- step coverage
    if only_golden or only_ms:
        prefix = _is_prefix(ms.steps, golden.steps) or _is_prefix(golden.steps, ms.steps)
        parts = []
        if only_golden:
            parts.append(f"{len(only_golden)} only in golden ({_ranges(only_golden)})")
        if only_ms:
            parts.append(f"{len(only_ms)} only in MindSpore ({_ranges(only_ms)})")
        ok = allow_prefix and prefix
        hint = "" if ok or not prefix else " (a prefix: allow_prefix / --allow-prefix accepts it)"
        checks.append(Check("steps", "steps logged on one side only", value=len(only_golden) + len(only_ms),
                            limit=0, passed=ok, step=None if ok else min(only_golden + only_ms),
                            detail="steps differ: " + "; ".join(parts) + hint))
        if ok:
            res.notes.append("compared the common prefix only: " + "; ".join(parts))
        res.fail_steps["steps"] = [] if ok else sorted(only_golden + only_ms)

    # ---- tokens / skipped / loss scale: exact agreement
    if golden.tokens is not None and ms.tokens is not None:
        tg, tm = g(golden.tokens), m(ms.tokens)
        bad = (tg != tm) & ~(np.isnan(tg) & np.isnan(tm))
        first = int(steps[np.argmax(bad)]) if bad.any() else None
        checks.append(Check("tokens", "tokens seen", value=int(bad.sum()), limit=0, passed=not bad.any(),
                            step=first, detail="" if not bad.any() else
                            f"tokens differ at step {first} (golden {_fmt_int(tg[np.argmax(bad)])}, "
                            f"MindSpore {_fmt_int(tm[np.argmax(bad)])}): the runs saw different batches"))
        fail_steps("tokens", bad)
    if golden.skipped is not None or ms.skipped is not None or dt == "fp16":
        bad = sg != sm
        first = int(steps[np.argmax(bad)]) if bad.any() else None
        checks.append(Check("skipped", "fp16 skipped-step flags", value=int(bad.sum()), limit=0,
                            passed=not bad.any(), step=first, detail="" if not bad.any() else
                            f"skipped flags differ at {int(bad.sum())} step(s), first {first} "
                            f"(golden {bool(sg[np.argmax(bad)])}, MindSpore {bool(sm[np.argmax(bad)])})"))
        fail_steps("skipped", bad)
        for run, label in ((golden, "golden"), (ms, "MindSpore")):
            if run.skipped is None and dt == "fp16":
                res.notes.append(f"the {label} log has no 'skipped' flags; its steps count as not skipped")
    if golden.loss_scale is not None and ms.loss_scale is not None:
        cg, cm = g(golden.loss_scale), m(ms.loss_scale)
        bad = (cg != cm) & ~(np.isnan(cg) & np.isnan(cm))
        first = int(steps[np.argmax(bad)]) if bad.any() else None
        checks.append(Check("loss_scale", "fp16 loss scale", value=int(bad.sum()), limit=0, passed=not bad.any(),
                            step=first, detail="" if not bad.any() else
                            f"loss scale differs at step {first} (golden {cg[np.argmax(bad)]:g}, "
                            f"MindSpore {cm[np.argmax(bad)]:g})"))
        fail_steps("loss_scale", bad)

    # ---- noise run
    nr = None
    if noise is not None:
        ln = _align(noise, steps, noise.loss)
        covered = np.isin(steps, noise.steps)
        nr = rel_diff(ln, lg)
        nr[~covered] = np.nan
        ngr = rel_diff(_align(noise, steps, noise.grad_norm), gg)
        ngr[~covered] = np.nan
        nlr = rel_diff(_align(noise, steps, noise.lr), rg)
        nlr[~covered] = np.nan
        nband = _centred_mean(nr, _NOISE_WINDOW_FACTOR * tol.window)
        res.loss_noise, res.noise_rel, res.noise_band = ln, nr, nband
        first_cov = np.flatnonzero(covered)
        res.noise_figures = {
            "path": str(noise.path), "steps": len(noise), "covered_steps": int(covered.sum()),
            "first": float(nr[first_cov[0]]) if len(first_cov) else math.nan,
            "mean": _nanmean(nr), "max": _nanmax(nr), "lr_max": _nanmax(nlr),
            "grad_mean": _nanmean(ngr), "grad_max": _nanmax(ngr),
            "band_mean": _nanmean(nband),
        }
        if not covered.all():
            res.notes.append(f"the noise run covers {int(covered.sum())} of {len(steps)} paired steps "
                             f"({noise.span()}); the band is judged only there")
        if covered.any() and np.nanmax(np.where(np.isnan(nr), 0, nr)) == 0:
            res.notes.append("the noise run's loss equals the golden's at every step (a deterministic rerun): "
                             "it measures nondeterminism only"
                             + (f"; the band is just the {dt} floor {_fmt(tol.band_floor)} -- rerun the golden "
                                "with another data or dropout seed to measure real noise" if tol.low_precision
                                else ""))
        if res.noise_figures["lr_max"] > 0 and res.noise_figures["lr_max"] > tol.lr:
            res.notes.append(f"the noise run's lr differs from the golden's (max rel "
                             f"{_fmt(res.noise_figures['lr_max'])}): it was not run with the same schedule")

    nf = res.noise_figures
    k = tol.band_k if tol.low_precision and noise is not None and tol.band_k is not None else None
    if k is not None and math.isinf(k):
        k = None  # band_k = inf disables the band rule (and the widening by the noise run)

    def widened(key_tol: float, noise_key: str) -> float:
        if k is None or not math.isfinite(nf.get(noise_key, math.nan)):
            return key_tol
        return max(key_tol, k * nf[noise_key])

    # ---- loss: first, max, band, mean
    i0 = 0
    v0 = float(loss_rel[i0])
    checks.append(Check("first", "first-step loss rel diff", value=v0, limit=tol.first,
                        passed=not (v0 > tol.first), step=int(steps[i0]) if v0 > tol.first else None,
                        noise=nf.get("first")))
    fail_steps("first", np.arange(len(steps)) == i0 if v0 > tol.first else np.zeros(len(steps), bool))

    lim = widened(tol.max, "max")
    vmax = _nanmax(loss_rel)
    checks.append(Check("max", "max loss rel diff", value=vmax, limit=lim, passed=not (vmax > lim),
                        step=_first_over(steps, loss_rel, lim), noise=nf.get("max")))
    fail_steps("max", loss_rel > lim)

    if k is not None and nr is not None:
        judged = np.zeros(len(steps), bool)
        if len(steps) >= tol.window:
            judged[tol.window - 1:] = True
        else:
            judged[-1] = True
        judged &= ~np.isnan(res.noise_band)
        floor = tol.band_floor or 0.0
        band = np.where(judged, np.maximum(k * res.noise_band, floor), np.nan)
        res.band_limit = band
        over = judged & (loss_window > band)
        worst = np.where(judged, loss_window / np.where(band > 0, band, np.inf), np.nan)
        ratio = _nanmax(worst)
        first = int(steps[np.argmax(over)]) if over.any() else None
        detail = ""
        if first is not None:
            i = int(np.argmax(over))
            detail = (f"loss rel diff over the {tol.window} steps to {first} averages {_fmt(loss_window[i])} "
                      f"> allowed {_fmt(band[i])} (max of {k:g} x noise band {_fmt(res.noise_band[i])}, "
                      f"floor {_fmt(floor)})")
        checks.append(Check("band", "windowed loss rel diff / noise band allowance", value=ratio, limit=1.0,
                            passed=None if not judged.any() else not over.any(), step=first,
                            noise=nf.get("band_mean"), detail=detail))
        fail_steps("band", over)

    vmean = _nanmean(loss_rel)
    run_mean = _running_mean(loss_rel)
    checks.append(Check("mean", "mean loss rel diff", value=vmean, limit=tol.mean, passed=not (vmean > tol.mean),
                        step=_first_over(steps, run_mean, tol.mean) if vmean > tol.mean else None,
                        noise=nf.get("mean")))

    drift = _drift_check(steps, lg, lm, tol, res)
    if drift is not None:
        checks.append(drift)

    # ---- lr
    vlr = _nanmax(lr_rel)
    first = _first_over(steps, lr_rel, tol.lr)
    detail = ""
    if first is not None:
        i = int(np.searchsorted(steps, first))
        detail = (f"lr rel diff {_fmt(lr_rel[i])} > {_fmt(tol.lr)} (golden {rg[i]:.6g}, MindSpore {rm[i]:.6g})"
                  + _lr_hint(rg, rm, i))
    checks.append(Check("lr", "max lr rel diff", value=vlr, limit=tol.lr, passed=first is None, step=first,
                        noise=nf.get("lr_max"), detail=detail))
    fail_steps("lr", lr_rel > tol.lr)

    # ---- grad norm
    lim = widened(tol.grad_max, "grad_max")
    vgmax = _nanmax(grad_rel)
    checks.append(Check("grad_max", "max grad-norm rel diff", value=vgmax, limit=lim,
                        passed=None if math.isnan(vgmax) else not (vgmax > lim),
                        step=_first_over(steps, grad_rel, lim), noise=nf.get("grad_max")))
    fail_steps("grad_max", grad_rel > lim)
    lim = widened(tol.grad_mean, "grad_mean")
    vgmean = _nanmean(grad_rel)
    checks.append(Check("grad_mean", "mean grad-norm rel diff", value=vgmean, limit=lim,
                        passed=None if math.isnan(vgmean) else not (vgmean > lim),
                        step=_first_over(steps, _running_mean(grad_rel), lim) if vgmean > lim else None,
                        noise=nf.get("grad_mean")))

    clip = _clip_check(golden, ms, noise, steps, tol, res)
    if clip is not None:
        checks.append(clip)

    for c in checks:  # a disabled bound (inf) is reported, not judged
        if c.limit is not None and isinstance(c.limit, float) and math.isinf(c.limit):
            c.passed, c.step = None, None
    res.checks = checks

    # ---- notes: bounds tighter than the baseline's own noise
    if noise is not None:
        for key, label, limit in (("first", "first-step", tol.first), ("mean", "mean", tol.mean)):
            v = nf.get(key, math.nan)
            if math.isfinite(v) and v > limit:
                res.notes.append(f"the golden's own noise ({label} loss rel diff {_fmt(v)}) exceeds the "
                                 f"{label} bound {_fmt(limit)}: that bound is tighter than the baseline "
                                 "reproduces itself")
    if dt == "fp32" and noise is not None:
        res.notes.append("fp32: the noise run is reported, not judged (fixed bounds only)")
    return res


def _hparams_check(hp: HparamsCheck, res: CompareResult) -> Check:
    """Any knob both effective_hparams.json record that differs fails the comparison."""
    label = f"effective hyperparameters ({len(hp.rows)} knobs)"
    if hp.skipped:
        res.notes.append(hp.skipped)
        return Check("hparams", label, value=math.nan, limit=0, detail=hp.skipped)
    return Check("hparams", label, value=len(hp.differing), limit=0, passed=hp.passed,
                 detail="" if hp.passed else hp.reason())


_FP32_ULP = 2.0 ** -23   # one fp32 ulp at 1.0: the first steps' level never counts as below it
_DRIFT_EARLY = 3         # paired steps whose loss rel diff sets the level the rest is held to


def _drift_check(steps: np.ndarray, lg: np.ndarray, lm: np.ndarray, tol: Tolerances,
                 res: CompareResult) -> Check | None:
    """The fp32 ``drift`` rule: the loss rel diff must stay at the level of the first steps.

    Correct fp32 runs differ by rounding alone: the signed loss rel diff
    s_t = (ms_t - golden_t) / |golden_t| sits at its first-step value (one
    forward pass on the same weights, ~3e-7) or wanders with random sign once
    the two trajectories part chaotically. A one-sided optimizer fault that the
    per-step bounds do not see (weight decay 0 against 0.1: 2.4e-5 mean, bound
    1e-4) instead pushes s steadily one way. So: with e the median |s| of the
    first `_DRIFT_EARLY` paired steps (at least one fp32 ulp), fail at the first
    step t where s has stayed beyond ``drift`` x e on the same side of the
    golden for ``drift_window`` paired steps in a row (the whole run when it is
    shorter). The figure is the largest such sustained |s|. Measured (tests/
    test_compare_tight.py): correct runs sustain at most ~1.0 e, a decay-only
    fault 100-600 e.
    """
    if tol.drift is None or not len(steps):
        return None
    with np.errstate(divide="ignore", invalid="ignore"):
        signed = np.where(np.isfinite(lg) & np.isfinite(lm) & (lg != 0), (lm - lg) / np.abs(lg), np.nan)
    res.loss_signed = signed
    early = np.abs(signed[:_DRIFT_EARLY])
    early = early[np.isfinite(early)]
    level = max(float(np.median(early)) if early.size else 0.0, _FP32_ULP)
    limit = tol.drift * level
    width = min(tol.drift_window, len(steps))
    s = np.nan_to_num(signed, nan=0.0)  # a step without both losses breaks a one-sided stretch
    sustained = np.full(len(steps), np.nan)
    for end in range(width - 1, len(steps)):
        window = s[end - width + 1:end + 1]
        low, high = float(window.min()), float(window.max())
        sustained[end] = low if low > 0 else (-high if high < 0 else 0.0)
    res.drift_sustained, res.drift_limit = sustained, limit
    value = _nanmax(sustained)
    over = sustained > limit
    res.fail_steps["drift"] = [int(x) for x in steps[over]]
    label = f"loss rel diff sustained over {width} steps (same sign)"
    if math.isinf(limit):
        return Check("drift", label, value=value, limit=limit)
    if not over.any():
        return Check("drift", label, value=value, limit=limit, passed=True)
    i = int(np.argmax(over))
    start = int(steps[i - width + 1])
    side = "above" if signed[i] > 0 else "below"
    peak = float(np.nanmax(np.abs(signed)))
    detail = (f"MindSpore's loss stays {side} the golden's by more than {tol.drift:g} x the first steps' level "
              f"{_fmt(level)} (= {_fmt(limit)}) for {width} steps in a row, steps {start}..{int(steps[i])}, "
              f"and reaches {_fmt(peak)}: a systematic drift (an optimizer knob such as weight decay), "
              "not rounding")
    return Check("drift", label, value=value, limit=limit, passed=False, step=int(steps[i]), detail=detail)


def _clipped_signed_rel(golden: Run, other: Run, steps: np.ndarray) -> np.ndarray | None:
    """(other - golden) / golden of grad_norm_clipped at the steps both runs clipped with pre-clip norms
    within _CLIP_PRE_AGREE of each other (NaN elsewhere)."""
    if golden.grad_norm_clipped is None or other.grad_norm_clipped is None:
        return None
    cg, co = _align(golden, steps, golden.grad_norm_clipped), _align(other, steps, other.grad_norm_clipped)
    pre_g, pre_o = _align(golden, steps, golden.grad_norm), _align(other, steps, other.grad_norm)
    with np.errstate(invalid="ignore"):
        both = (cg < pre_g) & (co < pre_o) & np.isfinite(cg) & np.isfinite(co) & (cg > 0)
        both &= rel_diff(pre_o, pre_g) <= _CLIP_PRE_AGREE
        return np.where(both, (co - cg) / np.where(both, cg, 1.0), np.nan)


def _clip_check(golden: Run, ms: Run, noise: Run | None, steps: np.ndarray, tol: Tolerances,
                res: CompareResult) -> Check | None:
    """The ``clip`` rule: |mean of the signed post-clip norm rel diff| over the steps both sides clipped.

    Where clip_grad_norm_ acts, the post-clip norm is max_norm * norm / (norm + 1e-6): pre-clip norms
    that agree within 1 % move it by under 1e-8 / norm, so the two sides agree to a few fp32 ulps, which
    average out, while a different clip epsilon shifts every clipped step the same way. Steps whose
    pre-clip norms differ more are the grad-norm rules' business and are left out here.
    """
    signed = _clipped_signed_rel(golden, ms, steps)
    if signed is None:
        return None
    res.clip_golden = _align(golden, steps, golden.grad_norm_clipped)
    res.clip_ms = _align(ms, steps, ms.grad_norm_clipped)
    res.clip_signed = signed
    judged = ~np.isnan(signed)
    noise_value = None
    if noise is not None:
        noise_signed = _clipped_signed_rel(golden, noise, steps)
        if noise_signed is not None and (~np.isnan(noise_signed)).any():
            noise_value = abs(_nanmean(noise_signed))  # reported only: another data seed moves it by itself
    if not judged.any():
        return Check("clip", "post-clip grad-norm rel diff, clipped steps", value=math.nan,
                     limit=tol.clip, passed=None, noise=noise_value,
                     detail="no step was clipped on both sides with pre-clip norms within 1 %: "
                            "the rule has nothing to judge")
    value = abs(_nanmean(signed))
    limit = _clip_limit(signed[judged], tol.clip)
    rounding, unmeasurable = _golden_clip_rounding(golden, steps, judged, res)
    if unmeasurable and math.isfinite(tol.clip):
        res.notes.append(unmeasurable)
        return Check("clip", "post-clip grad-norm rel diff, clipped steps", value=value, limit=limit,
                     passed=None, noise=noise_value, detail=unmeasurable)
    # The golden's own rounding, measured: its mean offset (at most its RMS) moves the figure too.
    limit = max(limit, 2.0 * rounding) if math.isfinite(limit) else limit
    passed = not (value > limit)
    step, detail = None, ""
    if not passed:
        running = np.abs(_running_mean(signed))
        step = _first_over(steps[judged], running[judged], limit)
        direction = "larger" if _nanmean(signed) > 0 else "smaller"
        detail = (f"MindSpore's post-clip grad norm is {direction} than the golden's by {_fmt(value)} on average "
                  f"over {int(judged.sum())} clipped steps > {_fmt(limit)}: the clip coefficient differs "
                  "(torch divides max_norm by norm + 1e-6)")
    res.fail_steps["clip"] = [] if passed else [int(x) for x in steps[judged]]
    return Check("clip", "post-clip grad-norm rel diff, clipped steps", value=value,
                 limit=limit, passed=passed, step=step, noise=noise_value, detail=detail)


def _golden_clip_rounding(golden: Run, steps: np.ndarray, judged: np.ndarray,
                          res: CompareResult) -> tuple[float, str | None]:
    """The golden's own post-clip norm rounding (RMS, relative), and why the clip epsilon cannot
    be judged in this run (None when it can).

    A missing epsilon moves the post-clip norm by 1e-6 / n; the golden's own norm rounding moves
    it too. The golden is torch's clip_grad_norm_ by definition, so its rounding is measured on its
    own log: at each judged step, d = post * (n + 1e-6) / (n * max_norm) - 1 is the difference
    between the norm torch measured on the clipped gradients and the one its coefficient implies.
    max_norm is read from the golden's effective_hparams.json when it is there (then a bias counts
    too), else taken as the median of post * (n + 1e-6) / n (then only the spread counts). In fp32
    RMS(d) is ~1e-8; in bf16/fp16 runs of a 1M-parameter model it reached 0.5-3.5e-6 (the golden's
    norm of bf16-valued gradients runs low), as large as the 5e-7-1e-6 it would have to resolve.
    Judged only when the shift is `_CLIP_MEASURABLE` times the rounding; the bound is then at
    least twice the rounding, so a missing epsilon still clears it by 1.5x at the edge."""
    pre = _align(golden, steps, golden.grad_norm)[judged]
    post = _align(golden, steps, golden.grad_norm_clipped)[judged]
    unit = post * (pre + _TORCH_CLIP_EPS) / pre
    recorded = res.hparams.golden_max_norm if res.hparams is not None else None
    max_norm = recorded or float(np.median(unit))
    rounding = float(np.sqrt(np.mean((unit / max_norm - 1.0) ** 2)))
    shift = float(np.mean(_TORCH_CLIP_EPS / pre))
    if shift >= _CLIP_MEASURABLE * rounding:
        return rounding, None
    source = "recorded in the golden's effective_hparams.json" if recorded else "estimated from the log"
    return rounding, (
        f"clip rule not judged: the clip epsilon cannot be measured in this run -- the golden's own post-clip "
        f"norm departs from torch's max_norm · n / (n + 1e-6) (max_norm {max_norm:g}, {source}) by "
        f"{_fmt(rounding)} RMS over {int(judged.sum())} clipped steps, more than 1/{_CLIP_MEASURABLE:g} of the "
        f"{_fmt(shift)} a missing epsilon would add; `migrate hparams` reads the epsilon from the live "
        "objects instead")


def _clip_limit(signed: np.ndarray, bound: float) -> float:
    """`bound`, widened to 3 standard errors of the mean when the clipped steps are few or
    noisy: a norm summed in fp32 over millions of elements moves by up to ~1e-6 per step, and
    the mean of a dozen such steps can pass 2e-7 by chance, where a missing clip epsilon
    shifts every step by 1e-6 / norm."""
    if signed.size < 2 or not math.isfinite(bound):
        return bound
    return max(bound, 3.0 * float(np.std(signed, ddof=1)) / math.sqrt(signed.size))


def _lr_hint(rg: np.ndarray, rm: np.ndarray, i: int) -> str:
    """' -- MindSpore's lr is the golden's of step s+1' when the schedule looks shifted by one step."""
    for shift, word in ((1, "next"), (-1, "previous")):
        j = i + shift
        if 0 <= j < len(rg) and rg[j] != 0 and abs(rm[i] - rg[j]) <= 1e-9 * abs(rg[j]):
            return f"; MindSpore's lr is the golden's {word} step's: the schedule is off by one step"
    return ""


def _fmt_int(v: float) -> str:
    return "n/a" if math.isnan(v) else f"{int(v)}"


def _ranges(steps: list[int], limit: int = 4) -> str:
    spans, start, prev = [], None, None
    for s in steps:
        if start is None:
            start = prev = s
        elif s == prev + 1:
            prev = s
        else:
            spans.append((start, prev))
            start = prev = s
    if start is not None:
        spans.append((start, prev))
    text = ", ".join(f"{a}" if a == b else f"{a}..{b}" for a, b in spans[:limit])
    return text + (f", … ({len(spans) - limit} more)" if len(spans) > limit else "")


# --------------------------------------------------------------------------- terminal

def print_summary(result: CompareResult, console: Any = None) -> None:
    """A rich table, one row per rule, then notes and the verdict line."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = console or Console()
    r = result
    head = (f"{r.golden_path} (golden) vs {r.ms_path} (MindSpore) · {r.dtype} · "
            f"{len(r.steps)} paired steps ({r.golden_steps} golden, {r.ms_steps} MindSpore)")
    if r.noise_path is not None:
        head += f" · noise run {r.noise_path} ({r.noise_steps} steps)"
    console.print(Text(head, style="bold"))
    table = Table(title_justify="left", pad_edge=False)
    for col, just in (("rule", "left"), ("MindSpore", "right"), ("noise run", "right"), ("bound", "right"),
                      ("first step out", "right"), ("status", "left")):
        table.add_column(col, justify=just, no_wrap=col != "rule")
    first = r.first_failure
    for c in r.checks:
        status = "—" if c.passed is None else ("ok" if c.passed else "FAIL")
        style = None
        if c is first:
            style = "bold white on red"
        elif c.passed is False:
            style = "red"
        elif c.passed is None:
            style = "dim"
        exact = c.key in ("steps", "tokens", "skipped", "loss_scale", "hparams")
        if exact and not math.isfinite(c.value):
            value, status = "—", "skipped"   # the hparams cross-check without both files
        else:
            value = f"{int(c.value)} differ" if exact else _fmt(c.value)
        table.add_row(Text(c.label), Text(value), Text(_fmt(c.noise)), Text(_fmt(c.limit) if not exact else "exact"),
                      Text("" if c.step is None else str(c.step)), Text(status), style=style)
    console.print(table)
    if r.hparams is not None:
        for row in r.hparams.differing:
            console.print(Text(f"hyperparameter differs: {row.knob} · golden {_short(row.golden)} · "
                               f"MindSpore {_short(row.mindspore)}" + (f" · {row.detail}" if row.detail else ""),
                               style="bold red"))
    for note in r.notes:
        console.print(Text("note: " + note, style="yellow"))
    console.print(Text(r.verdict_text(), style="bold green" if r.passed else "bold red"))


# --------------------------------------------------------------------------- plot

_PLOT_FLOOR = 1e-16


def _spans(steps: np.ndarray, mask: np.ndarray) -> list[tuple[float, float]]:
    """Contiguous runs of True as (first step - 0.5, last step + 0.5)."""
    out, start = [], None
    for i, on in enumerate(mask):
        if on and start is None:
            start = i
        if start is not None and (not on or i == len(mask) - 1):
            end = i if on else i - 1
            out.append((float(steps[start]) - 0.5, float(steps[end]) + 0.5))
            start = None
    return out


def render_plot(result: CompareResult) -> bytes:
    """PNG bytes: loss curves (top), per-step loss rel diff with the noise band (middle), lr (bottom)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    r = result
    s = r.steps.astype(float)
    fig = Figure(figsize=(12.0, 9.0), dpi=100)
    FigureCanvasAgg(fig)
    ax1, ax2, ax3 = fig.subplots(3, 1, sharex=True, gridspec_kw={"height_ratios": [3, 2.4, 1.4]})
    first = r.first_failure
    title = f"Golden vs MindSpore · {r.dtype} · {'PASS' if r.passed else 'FAIL'}"
    if first is not None:
        title += f" · first out: {first.key}" + (f" at step {first.step}" if first.step is not None else "")
    if r.hparams is not None and r.hparams.differing:
        title += "\nhyperparameters differ: " + ", ".join(
            f"{row.knob} golden {_short(row.golden, 24)} ≠ MindSpore {_short(row.mindspore, 24)}"
            for row in r.hparams.differing[:3]) + (" …" if len(r.hparams.differing) > 3 else "")
    elif r.hparams is not None and r.hparams.skipped:
        title += " · hyperparameters not cross-checked"
    fig.suptitle(title)

    def failing(*keys):
        return np.isin(r.steps, sorted({s for k in keys for s in r.fail_steps.get(k, [])}))

    step_fail = failing("first", "max", "steps", "tokens", "skipped", "loss_scale")
    band_fail = failing("band")
    lr_fail = failing("lr")
    legend = {"loc": "upper left", "bbox_to_anchor": (1.01, 1.0), "fontsize": 8, "borderaxespad": 0.0}

    # top: loss curves
    ax1.plot(s, r.loss_golden, "-", color="#1f77b4", lw=1.3, label="golden")
    ax1.plot(s, r.loss_ms, "--", color="#ff7f0e", lw=1.3, label="MindSpore")
    if r.loss_noise is not None:
        ax1.plot(s, r.loss_noise, ":", color="#2ca02c", lw=1.1, label="golden, noise run")
    if step_fail.any():
        ax1.plot(s[step_fail], r.loss_ms[step_fail], "x", color="#d62728", ms=6, mew=1.5,
                 label="step out of tolerance")
    for i, (a, b) in enumerate(_spans(r.steps, band_fail)):
        ax1.axvspan(a, b, color="#d62728", alpha=0.08, lw=0, label="outside the noise band" if i == 0 else None)
    ax1.set_ylabel("loss")
    ax1.legend(**legend)
    ax1.grid(True, alpha=0.3)

    # middle: relative loss difference, log scale, bottom set by the data
    series = [r.loss_rel, r.loss_window] + ([r.noise_rel] if r.noise_rel is not None else [])
    pos = np.concatenate([v[np.isfinite(v) & (v > 0)] for v in series])
    bottom = max(float(np.percentile(pos, 5)) / 10.0, _PLOT_FLOOR) if pos.size else 1e-9  # deep dips clip
    bounds = [(r.check("max").limit, "--", "max bound"), (r.check("mean").limit, ":", "mean bound")]
    if r.drift_limit is not None:
        bounds.append((r.drift_limit, "-.", f"drift bound ({r.tolerances.drift:g} × first steps)"))
    bounds = [(v, ls, lab) for v, ls, lab in bounds if v is not None and math.isfinite(v) and v > 0]
    if bounds:
        bottom = min(bottom, min(v for v, _, _ in bounds) / 3.0)  # keep the bound lines in view

    def clip(v):
        v = np.asarray(v, dtype=float)
        return np.where(np.isnan(v), np.nan, np.clip(v, bottom, 1e300))

    if r.noise_band is not None:
        judged = r.band_limit is not None
        upper = r.band_limit if judged else r.noise_band
        label = (f"allowed: max({r.tolerances.band_k:g} × noise band, floor)" if judged
                 else "noise band (window mean; not judged)")
        ax2.fill_between(s, bottom, clip(upper), color="#2ca02c", alpha=0.18, lw=0, label=label)
        ax2.plot(s, clip(r.noise_rel), "-", color="#2ca02c", lw=0.7, alpha=0.7, label="|noise − golden| / golden")
    ax2.plot(s, clip(r.loss_rel), "-", color="#ff7f0e", lw=0.9, label="|MindSpore − golden| / golden")
    ax2.plot(s, clip(r.loss_window), "-", color="#8c564b", lw=1.6,
             label=f"MindSpore, {r.tolerances.window}-step mean")
    for limit, style, label in bounds:
        ax2.axhline(limit, color="#d62728", ls=style, lw=1, label=label)
    if step_fail.any():
        ax2.plot(s[step_fail], clip(r.loss_rel[step_fail]), "x", color="#d62728", ms=6, mew=1.5,
                 label="step out of tolerance")
    if band_fail.any():
        ax2.plot(s[band_fail], clip(r.loss_window[band_fail]), ".", color="#d62728", ms=5,
                 label="window mean outside the band")
    drift_fail = failing("drift")
    if drift_fail.any():
        ax2.plot(s[drift_fail], clip(r.drift_sustained[drift_fail]), "v", color="#9467bd", ms=5,
                 label=f"drifting one way for {min(r.tolerances.drift_window, len(s))} steps")
    ax2.set_yscale("log")
    ax2.set_ylim(bottom=bottom)
    ax2.set_ylabel("loss rel diff")
    ax2.legend(**legend)
    ax2.grid(True, which="major", alpha=0.3)

    # bottom: lr
    ax3.plot(s, r.lr_golden, "-", color="#1f77b4", lw=1.3, label="golden")
    ax3.plot(s, r.lr_ms, "--", color="#ff7f0e", lw=1.3, label="MindSpore")
    if lr_fail.any():
        ax3.plot(s[lr_fail], r.lr_ms[lr_fail], "x", color="#d62728", ms=5, mew=1.2, label="lr out of tolerance")
    ax3.set_ylabel("lr")
    ax3.set_xlabel("step")
    ax3.legend(**legend)
    ax3.grid(True, alpha=0.3)
    ax3.ticklabel_format(axis="y", style="sci", scilimits=(-2, 2))
    fig.subplots_adjust(left=0.07, right=0.76, top=0.93 if "\n" in title else 0.95, bottom=0.06,
                        hspace=0.1)  # tight_layout costs ~0.7 s
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def write_plot(result: CompareResult, path: Any) -> Path:
    """Render the plot and write it atomically (a reader never sees a partial PNG)."""
    return atomic_write_bytes(path, render_plot(result))


def write_json(result: CompareResult, path: Any) -> Path:
    """`CompareResult.to_dict` as strict JSON, written atomically."""
    return atomic_write_text(path, json.dumps(result.to_dict(), indent=2, allow_nan=False) + "\n")
