"""Two training states judged tensor by tensor with `migrate diff`'s judge, in backward order.

    report = diff_states("runs/golden/checkpoint-40", "runs/ms/checkpoints/checkpoint-40")
    report.exit_code   # 0 every part within its bound, 1 not (the first one named), bad input: MigrateError

Both sides are put under HF's names (`hf_names`); the model config comes from whichever side records
one (HF config.json, or model.yaml with the keymap a MindSpore trainer's checkpoint records) or from
``model`` (a converted folder) for two MindFormers files. The bounds are `judge.bounds`' kinds
``state`` (tensors, the learning rate) and ``counter`` (step counts, loss scale, generator positions:
held equal); with a noise run (a third state, `noise`) each tensor's bound widens to K x that run's own
difference from the first side, as `migrate diff`'s float64 twin widens a model's.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from migrate.checkpoints.input_folder import InputFolder
from migrate.errors import MigrateError
from migrate.judge import fmt_num
from migrate.judge.noise import noise_figures
from migrate.judge.report import Report
from migrate.judge.report.model import FIXED, NOISE_RUN
from migrate.judge.thresholds import Thresholds
from migrate.keymap import recorded_keymap
from migrate.safeyaml import load_yaml
from migrate.state_diff.detect import reader
from migrate.state_diff.hf_names import (
    covering_plan,
    plan_for_model_yaml,
    plans_for_hf_config,
    recorded,
    state_in_hf_names,
)
from migrate.state_diff.order import PARTS, backward_order
from migrate.state_diff.state import COUNTERS, LR, STEP, TrainingState


def diff_states(ref: str, got: str, *, noise: str | None = None, thresholds=None, keymap: str | None = None,
                model: str | None = None) -> Report:
    """`thresholds`: Thresholds, or a function of the runs' dtype (as `probe.diff_any`); `keymap`: a family
    or YAML naming the HF side's keymap (default: from config.json); `model`: a converted folder whose
    model.yaml describes two MindFormers files."""
    specs = [ref, got] + ([noise] if noise else [])
    states = [reader(s)(Path(s)) for s in specs]
    plan = _plan(states, keymap, model)
    for state in states:
        state_in_hf_names(state, plan).check_complete()
    a, b = states[0], states[1]
    _same_parameters(a, b)
    if noise:
        _same_parameters(a, states[2])
    dtype = _dtype(states)
    thresholds = thresholds(dtype) if callable(thresholds) else (thresholds or Thresholds.for_dtype(dtype))
    steps = " vs ".join(_num(s.counters[STEP]) if STEP in s.counters else "?" for s in (a, b))
    report = Report(dtype=dtype, inputs=f"training states at step {steps}", ref_dir=ref, got_dir=got,
                    ref_label=_label(a, b, "A"), got_label=_label(b, a, "B"), thresholds=thresholds,
                    extra={"sides": f"{a.format} vs {b.format}",
                           "names": _names_text(plan),
                           "order": "backward: counters, lr, then the LM head and the last layers first"},
                    reference=_reference(noise, dtype, thresholds))
    _add_scalars(report, a, b)
    for name in backward_order(a.params):
        for part in PARTS:
            x, y = _part(a, part, name), _part(b, part, name)
            figures = {**noise_figures(x, _part(states[2], part, name)), "against": "the noise run"} if noise else None
            report.add(f"{part} {name}", x, y, kind="state", block=name, noise=figures)
    return report.finalize()


def _plan(states: list[TrainingState], keymap: str | None, model: str | None):
    """The conversion plan that names every MindSpore side: a trainer checkpoint's model.yaml, the HF
    side's config.json (trying each keymap target), or --model's model.yaml."""
    ms = [s for s in states if s.names == "ms"]
    if not ms:
        return None
    with_yaml = next((s for s in states if s.names == "ms" and s.config), None)
    if model is not None:
        fields = load_yaml(InputFolder(model, "model folder").member("model.yaml", "model.yaml"), "model config")
        if not isinstance(fields, dict):
            raise MigrateError(f"{Path(model) / 'model.yaml'} is not a mapping")
        plans = [plan_for_model_yaml(fields, keymap or recorded_keymap(model))]
    elif with_yaml is not None:
        plans = [plan_for_model_yaml(with_yaml.config, keymap or recorded(with_yaml))]
    else:
        hf = next((s for s in states if s.names == "hf"), None)
        if hf is None:
            raise MigrateError("neither side records a model config: give --model DIR (the converted folder "
                               "whose model.yaml describes the MindFormers checkpoints)")
        plans = plans_for_hf_config(hf.config, keymap)
    plan = covering_plan(plans, ms[0].params, str(ms[0].path))
    for s in ms[1:]:
        covering_plan([plan], s.params, str(s.path))
    return plan


def _names_text(plan) -> str:
    if plan is None:
        return "HF names on both sides"
    target = f" (target {plan.keymap.target_name})" if plan.keymap.target_name else ""
    return f"HF names through keymap {plan.keymap.name}{target}"


def _same_parameters(a: TrainingState, b: TrainingState) -> None:
    only_a, only_b = sorted(set(a.params) - set(b.params)), sorted(set(b.params) - set(a.params))
    if only_a or only_b:
        side, name = (a, only_a[0]) if only_a else (b, only_b[0])
        other = b if side is a else a
        raise MigrateError(f"{side.path} holds {name} (and {len(only_a) + len(only_b) - 1} more differences) that "
                           f"{other.path} does not: not states of the same model")


def _dtype(states: list[TrainingState]) -> str:
    recorded_ = {s.dtype for s in states if s.dtype}
    if len(recorded_) > 1:
        raise MigrateError(f"the runs trained in different precisions ({', '.join(sorted(recorded_))})")
    return recorded_.pop() if recorded_ else "fp32"


def _label(state: TrainingState, other: TrainingState, letter: str) -> str:
    return state.format if state.format != other.format else f"{state.format} {letter}"


def _reference(noise: str | None, dtype: str, thresholds: Thresholds) -> dict:
    if noise:
        k = thresholds.bounds("state").noise
        return {"source": NOISE_RUN, "of": noise,
                "text": f"noise run: {noise}; each tensor's bound is the larger of the fixed one and "
                        f"{k:g} × the noise run's own difference from the first side"}
    b = thresholds.bounds("state")
    held = ([f"max abs ≤ {b.max_abs_rel:g} × each tensor's peak"] if b.max_abs_rel is not None else []) + \
        ([f"||B - A|| / ||A|| ≤ {b.rel_l2:g}"] if b.rel_l2 is not None else []) + \
        ([f"cosine ≥ {b.cosine:g}"] if b.cosine is not None else [])
    return {"source": FIXED, "text": f"no noise run: fixed bounds, {', '.join(held)} (docs/diff.md, \"Diffing two "
                                     "training states\"); a noise run (--noise) measures what rounding alone does"}


def _part(state: TrainingState, part: str, name: str) -> np.ndarray:
    return state.params[name] if part == "param" else state.moments(part)[name]


def _add_scalars(report: Report, a: TrainingState, b: TrainingState) -> None:
    """Counters held equal, then the learning rate, then the generator positions both record."""
    for key in COUNTERS:
        if key in a.counters and key in b.counters:
            x, y = a.counters[key], b.counters[key]
            report.add_metrics(key, _counter_metrics(np.array([x]), np.array([y]), _num(x), _num(y)), kind="counter")
    if a.lr is not None and b.lr is not None:
        report.add(LR, np.array(a.lr, np.float64), np.array(b.lr, np.float64), kind="state", block=LR)
    for gen in sorted(set(a.rng) & set(b.rng)):
        x, y = a.rng[gen], b.rng[gen]
        text = "{} generator at position {}".format
        report.add_metrics(f"{gen} generator", _counter_metrics(x, y, text(gen, x[-1]), text(gen, y[-1])),
                           kind="counter")


def _counter_metrics(x: np.ndarray, y: np.ndarray, x_text: str, y_text: str) -> dict:
    same_shape = x.shape == y.shape
    unequal = int(np.count_nonzero(x != y)) if same_shape else max(x.size, y.size)
    diff = float(np.max(np.abs(x.astype(np.float64) - y))) if same_shape and x.size else float("nan")
    return {"unequal": unequal, "numel": int(x.size), "max_abs": diff, "ref_text": x_text, "got_text": y_text}


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else fmt_num(value)
