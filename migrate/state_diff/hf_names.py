"""MindSpore-named tensors under HF's names, through the keymap the conversion used.

Each keymap row maps HF tensors to the model's (a rename, or a fused layout such as QKV groups);
`migrate.transforms` layouts only move elements (never arithmetic), so a moment is carried exactly as
its parameter is: the inverse layout splits adam_v of a fused w_qkv into the q, k and v second moments
torch keeps. A target that renames (mcore) writes other names in the checkpoint; both are looked up.
"""
from __future__ import annotations

import numpy as np

from migrate.errors import MigrateError
from migrate.keymap import Keymap, recorded_keymap, resolve
from migrate.models.conversion_plan import ConversionPlan
from migrate.state_diff.state import MOMENTS, TrainingState


def plan_for_model_yaml(fields: dict, keymap: str | None) -> ConversionPlan:
    """The plan of a MindSpore trainer's checkpoint: its model.yaml and the keymap it records."""
    km = Keymap.load(keymap or "hf_llama").for_model(fields)
    return ConversionPlan(km, fields)


def plans_for_hf_config(hf_config: dict, keymap: str | None = None) -> list[ConversionPlan]:
    """Every layout a checkpoint of this HF model may be in: the keymap's base target, then each named
    target (MindFormers' qkv_concat, mcore, ...)."""
    km = resolve(keymap or "auto", hf_config).for_source(hf_config)
    plans = []
    for target in (None, *km.targets()):
        kt = km.with_target(target)
        try:
            plans.append(ConversionPlan.for_source(kt, kt.hf_to_ms_config(hf_config)))
        except MigrateError:
            continue   # a target this config cannot take (a flag it lacks)
    return plans


def covering_plan(plans: list[ConversionPlan], names, where) -> ConversionPlan:
    """The first plan whose parameters are exactly the state's (by checkpoint or model name)."""
    names = set(names)
    for plan in plans:
        lookup = _lookup(plan)
        if names <= set(lookup) and {lookup[n][2] for n in names} == {d for g in plan.groups for d in g.dst}:
            return plan
    keymap = plans[0].keymap.name if plans else "?"
    raise MigrateError(f"{where}: its parameter names fit no layout of keymap {keymap} for this model "
                       f"({', '.join(sorted(names)[:2])}, ...)")


def _lookup(plan: ConversionPlan) -> dict[str, tuple[int, int, str]]:
    """Checkpoint or model name -> (group index, position among its targets, model name)."""
    renamed = plan.checkpoint_names
    out = {}
    for i, group in enumerate(plan.groups):
        for k, dst in enumerate(group.dst):
            out[dst] = (i, k, dst)
            out[renamed.get(dst, dst)] = (i, k, dst)
    return out


def to_hf(tensors: dict[str, np.ndarray], plan: ConversionPlan, what: str) -> dict[str, np.ndarray]:
    """MindSpore-named tensors (checkpoint or model names) under HF names, fused ones split."""
    lookup = _lookup(plan)
    unknown = [n for n in tensors if n not in lookup]
    if unknown:
        raise MigrateError(f"{what}: {unknown[0]} is no parameter keymap {plan.keymap.name} knows")
    parts: dict[int, dict[int, np.ndarray]] = {}
    for name, array in tensors.items():
        i, k, _ = lookup[name]
        parts.setdefault(i, {})[k] = array
    out = {}
    for i, got in parts.items():
        group = plan.groups[i]
        if len(got) < len(group.dst):
            absent = [d for k, d in enumerate(group.dst) if k not in got]
            raise MigrateError(f"{what}: {', '.join(absent)} missing (needed for {', '.join(group.src)})")
        arrays = [got[k] for k in range(len(group.dst))]
        if group.layout is not None:
            arrays = group.transform().inverse(arrays, plan.fields)
        out.update(zip(group.src, arrays, strict=True))
    return out


def state_in_hf_names(state: TrainingState, plan: ConversionPlan) -> TrainingState:
    """The state with its parameters and both moments under HF names (a state already so: unchanged)."""
    if state.names == "hf":
        return state
    where = str(state.path)
    state.params = to_hf(state.params, plan, f"{where} (parameters)")
    for which in MOMENTS:
        converted = to_hf(state.moments(which), plan, f"{where} ({which})")
        setattr(state, which, converted)
    state.names = "hf"
    return state


def recorded(state: TrainingState) -> str:
    """The keymap a MindSpore trainer's checkpoint records (checked as `recorded_keymap` checks it)."""
    return recorded_keymap(state.path) if state.path.is_dir() else "hf_llama"
