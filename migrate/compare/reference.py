"""Where the first-step bounds take their scale from: the golden's own rounding, measured.

The fixed fp32 first-step bound (1e-6) was calibrated on 2-layer random models; on a 30-layer
model (SmolLM2-135M) correct runs differ by 1.8-2.8e-6 at step 1, because torch's own fp32
loss is already that far from exact arithmetic. So golden/train_torch.py measures step 1
against a float64 twin of itself (`fp64_reference`, run.yaml ``reference``) and writes the
figures into its step-1 record; compare then takes each bound's scale from the run itself:

    first                 max(tol.first, K x loss noise)
    drift level           at least the loss noise (`drift.drift_check`)
    grad_max / grad_mean  max(tol.grad_*, K x grad-norm noise)

The loss noise is max(loss_fp64_rel_diff, loss_fp64_seq_err): the plain difference can be lucky
(errors of opposite sign cancel), the mean over sequences of each sequence's |error| cannot, and
bounds it. The grad-norm noise is max(grad_norm_fp64_rel_diff, grad_norm_fp64_tensor_err), the
same construction tensor by tensor. Per token (``loss_fp64_token_err``, logged too) the bound is
looser where tokens round independently: 7.6e-3 against a plain 1.9e-4 in bf16 on SmolLM2-135M,
which would widen MindFormers' 5e-3 first-step bound six-fold; per sequence it is 1.0e-3. K =
``Tolerances.reference_k`` (4; see `rules` for the measurement): the MindSpore loss is no closer
to exact than torch's, so two correct sides differ by up to about twice the golden's error, and
K leaves a factor 2 above that.

Without a reference (a foreign log, an older golden log, ``reference: off``, a twin that did not
fit) the fp32 first bound scales with depth instead -- tol.first x max(1, L / 4), L the decoder
layers recorded in effective_hparams.json (``live_shared``, golden's file first) -- and says it
is the fallback; without either it stays fixed. ``reference_k = 0`` keeps every bound fixed, and
a bound the caller sets (``tolerances={"first": ...}``, ``--tol-first``) is kept as set.
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from migrate.compare.metrics_log import Run
from migrate.compare.tolerances import Tolerances
from migrate.errors import MigrateError
from migrate.jsonsafe import load_json
from migrate.judge import fmt_figure

__all__ = ["REFERENCE_FIELDS", "DEPTH_UNIT", "SCALED", "FirstStepScale", "read_reference", "recorded_layers",
           "first_step_scale", "scaled_bounds"]

# the step-1 fields golden/train_torch.py writes (`fp64_reference`)
REFERENCE_FIELDS = ("loss_fp64", "loss_fp64_rel_diff", "loss_fp64_seq_err", "loss_fp64_token_err",
                    "grad_norm_fp64", "grad_norm_fp64_rel_diff", "grad_norm_fp64_tensor_err")
_REQUIRED = ("loss_fp64_rel_diff", "loss_fp64_seq_err")
SCALED = ("first", "grad_max", "grad_mean")   # the bounds a scale raises; one given explicitly stays as given
DEPTH_UNIT = 4   # decoder layers the fixed fp32 first bound holds for (the tests' 2-layer, the demo's 4-layer models)
_TWIN = "the golden's own error vs its float64 twin"


@dataclass
class FirstStepScale:
    """What scales this comparison's first-step bounds, and the bounds it gives: ``source`` is
    "fp64" (the golden's reference), "depth" (the fallback), "fixed" (neither), or "off"
    (``reference_k = 0``). ``floor`` is the configured first bound, ``first`` / ``grad_max`` /
    ``grad_mean`` the scaled ones (before a foreign log's printed precision is added);
    ``given`` the ones the caller set explicitly, kept as set."""

    source: str
    k: float
    floor: float
    first: float
    grad_max: float
    grad_mean: float
    reference: dict | None = None      # the golden's REFERENCE_FIELDS at step 1, where logged
    num_layers: int | None = None      # decoder layers recorded in effective_hparams.json
    why: str = ""                      # why there is no reference
    given: list[str] = field(default_factory=list)

    @property
    def loss_noise(self) -> float | None:
        """The golden's own first-step loss error: the plain difference or the per-sequence bound."""
        return _larger(self.reference, "loss_fp64_rel_diff", "loss_fp64_seq_err")

    @property
    def grad_noise(self) -> float | None:
        """The golden's own step-1 grad-norm error: the plain difference or the per-tensor bound."""
        return _larger(self.reference, "grad_norm_fp64_rel_diff", "grad_norm_fp64_tensor_err")

    def first_source(self) -> str:
        """Where the first-step bound comes from, in words."""
        if "first" in self.given:
            return "bound as given" + (f"; {_TWIN} is {fmt_figure(self.loss_noise)}" if self.source == "fp64" else "")
        if self.source == "fp64":
            if self.first > self.floor:
                return f"bound {self.k:g} x {_TWIN} ({fmt_figure(self.loss_noise)})"
            return f"bound {fmt_figure(self.floor)}, above {self.k:g} x {_TWIN} ({fmt_figure(self.loss_noise)})"
        if self.source == "depth":
            return (f"depth-scaled fallback bound {fmt_figure(self.floor)} x max(1, {self.num_layers}/{DEPTH_UNIT} "
                    f"layers); no float64 reference: {self.why}")
        if self.source == "off":
            return "fixed bound (reference_k 0)"
        if self.num_layers is not None:  # low precision: MindFormers' acceptance bound, not a rounding calibration
            return f"fixed bound, depth-free in low precision; no float64 reference ({self.why})"
        return f"fixed bound; no float64 reference ({self.why}) and no layer count recorded"

    def grad_source(self) -> str:
        """Where the grad-norm bounds take their scale from ("" where they are the fixed ones)."""
        if self.grad_noise is None:
            return ""
        return f"noise column: {_TWIN} at step 1 ({fmt_figure(self.grad_noise)}); bound at least {self.k:g} x that"

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "loss_noise": self.loss_noise, "grad_noise": self.grad_noise}


def read_reference(golden: Run, step: int) -> dict | None:
    """The golden's float64 reference fields of ``step`` (its first paired step), None where its
    log has none there: another format, an older golden, ``reference: off``."""
    if golden.format != "metrics":
        return None
    where = int(np.searchsorted(golden.steps, step))
    if where >= len(golden.steps) or golden.steps[where] != step:
        return None
    lineno, record = int(golden.lines[where]), None
    try:
        with open(golden.path, encoding="utf-8") as fh:
            record = next((json.loads(line) for i, line in enumerate(fh, 1) if i == lineno), None)
    except (OSError, ValueError):  # the log changed since it was read
        return None
    if not isinstance(record, dict) or not all(key in record for key in _REQUIRED):
        return None
    out = {}
    for key in REFERENCE_FIELDS:
        value = record.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value >= 0):
            raise MigrateError(f"{golden.path}:{lineno}: {key!r} must be a finite number >= 0, got {value!r}")
        out[key] = float(value)
    return out if all(key in out for key in _REQUIRED) else None


def recorded_layers(files: list[Path | None]) -> int | None:
    """Decoder layers recorded in the first of ``files`` (effective_hparams.json) that has them:
    ``live_shared.linear_compute_dtypes.decoder_layers`` holds one entry per layer on both sides."""
    for path in files:
        if path is None:
            continue
        try:
            data = load_json(Path(path))
            layers = data["live_shared"]["linear_compute_dtypes"]["decoder_layers"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if isinstance(layers, list) and layers:
            return len(layers)
    return None


def first_step_scale(golden: Run, first_step: int, hparams: Any, tol: Tolerances,
                     given: tuple[str, ...] = ()) -> FirstStepScale:
    """The bounds from the golden's reference at the first paired step, else from the layer count;
    the bounds in ``given`` (set explicitly by the caller) stay as ``tol`` has them."""
    scale = _scale(golden, first_step, hparams, tol)
    kept = [key for key in SCALED if key in given]
    return dataclasses.replace(scale, given=kept, **{key: getattr(tol, key) for key in kept}) if kept else scale


def _scale(golden: Run, first_step: int, hparams: Any, tol: Tolerances) -> FirstStepScale:
    k, base = tol.reference_k, dict(floor=tol.first, first=tol.first, grad_max=tol.grad_max, grad_mean=tol.grad_mean)
    if k == 0:
        return FirstStepScale("off", k, **base)
    files = [] if hparams is None else [hparams.golden_file, hparams.ms_file]
    reference = read_reference(golden, first_step)
    if reference is not None:
        scale = FirstStepScale("fp64", k, **base, reference=reference)
        loss, grad = scale.loss_noise, scale.grad_noise
        raised = {key: _at_least(getattr(tol, key), k, loss if key == "first" else grad) for key in SCALED}
        return dataclasses.replace(scale, **raised)
    why = _why_no_reference(golden, files[0] if files else None)
    layers = recorded_layers(files)
    if layers is None or tol.low_precision:  # the low-precision bounds are MindFormers' acceptance, depth-free
        return FirstStepScale("fixed", k, **base, num_layers=layers, why=why)
    return FirstStepScale("depth", k, **{**base, "first": tol.first * max(1.0, layers / DEPTH_UNIT)},
                          num_layers=layers, why=why)


def scaled_bounds(tol: Tolerances, scale: FirstStepScale, notes: list[str]) -> Tolerances:
    """``tol`` with the first-step and grad-norm bounds of ``scale``, said in a note."""
    if scale.source == "fp64":
        ref = scale.reference
        grad = ""
        if scale.grad_noise is not None:
            grad = (f"; its step-1 grad norm is {fmt_figure(scale.grad_noise)} off float64 (rel diff "
                    f"{fmt_figure(ref.get('grad_norm_fp64_rel_diff'))}, per tensor "
                    f"{fmt_figure(ref.get('grad_norm_fp64_tensor_err'))}): grad-norm bounds "
                    f"{fmt_figure(scale.grad_max)} / {fmt_figure(scale.grad_mean)}")
        first = (f"first-step bound {fmt_figure(scale.first)} as given ({_TWIN} is" if "first" in scale.given else
                 f"first-step bound {fmt_figure(scale.first)} = max({fmt_figure(scale.floor)}, {scale.k:g} x {_TWIN}")
        drift = "; the drift level is at least that error" if tol.drift is not None else ""
        notes.append(f"{first} {fmt_figure(scale.loss_noise)}: loss rel diff {fmt_figure(ref['loss_fp64_rel_diff'])}"
                     f", per sequence {fmt_figure(ref['loss_fp64_seq_err'])}){drift}{grad}")
    elif scale.source == "depth" and "first" not in scale.given:
        notes.append(f"first-step bound {fmt_figure(scale.first)}: the depth-scaled fallback {fmt_figure(scale.floor)}"
                     f" x max(1, {scale.num_layers}/{DEPTH_UNIT} layers); no float64 reference: {scale.why}")
    changes = {key: getattr(scale, key) for key in ("first", "grad_max", "grad_mean")
               if getattr(scale, key) != getattr(tol, key)}
    return dataclasses.replace(tol, **changes) if changes else tol


def _why_no_reference(golden: Run, golden_hparams: Path | None) -> str:
    """Why the golden's log has no float64 reference, as far as its files tell."""
    if golden.format != "metrics":
        return f"the golden log is {golden.format}"
    try:
        asked = load_json(Path(golden_hparams))["config"].get("reference")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        asked = None
    if asked == "off":
        return "the golden ran with reference: off"
    if asked in ("auto", "fp64"):
        return "the golden skipped it (dropout on, or a twin too large; its log says which)"
    return "a golden log without it (older than the reference, or not golden/train_torch.py's)"


def _larger(figures: dict | None, *keys: str) -> float | None:
    values = [figures[key] for key in keys if figures and figures.get(key) is not None]
    return max(values) if values else None


def _at_least(bound: float, k: float, noise: float | None) -> float:
    return bound if noise is None or not math.isfinite(k * noise) else max(bound, k * noise)
