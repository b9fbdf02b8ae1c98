"""A torch AdamW's state_dict (optimizer.pt, golden's trainer_state.pt) by parameter name.

torch numbers the parameters 0, 1, ... across its param groups in the order they were given; the state
is keyed by that number. The names come from the groups' own ``param_names`` (an optimizer built from
named parameters: the golden script) or from the caller (HF Trainer's grouping, `read_hf_trainer`)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from migrate.errors import MigrateError


def group_indices(state_dict, path: Path) -> list[list[int]]:
    """Each param group's parameter numbers, as saved."""
    groups = state_dict.get("param_groups") if isinstance(state_dict, dict) else None
    if not isinstance(groups, list) or not all(isinstance(g, dict) and isinstance(g.get("params"), list)
                                               for g in groups):
        raise MigrateError(f"{path}: no torch optimizer state (param_groups with params)")
    return [list(g["params"]) for g in groups]


def recorded_names(state_dict) -> list[list[str]] | None:
    """Each group's ``param_names``, where the optimizer was built from named parameters."""
    names = [g.get("param_names") for g in state_dict["param_groups"]]
    return names if all(isinstance(n, list) for n in names) else None


def moments_by_name(state_dict, names: list[list[str]], path: Path) -> tuple[dict, dict, float | None]:
    """(exp_avg, exp_avg_sq, AdamW's step) keyed by parameter name. A parameter the optimizer never
    stepped has no state: it is left out, and `TrainingState.check_complete` names it."""
    indices = group_indices(state_dict, path)
    if [len(g) for g in names] != [len(g) for g in indices]:
        raise MigrateError(f"{path}: the param groups hold {[len(g) for g in indices]} parameters, the model's "
                           f"names give {[len(g) for g in names]}")
    state = state_dict.get("state")
    if not isinstance(state, dict):
        raise MigrateError(f"{path}: the optimizer state has no per-parameter state")
    exp_avg, exp_avg_sq, steps = {}, {}, set()
    for group_names, group in zip(names, indices, strict=True):
        for name, index in zip(group_names, group, strict=True):
            entry = state.get(index)
            if not isinstance(entry, dict):
                continue
            for key, out in (("exp_avg", exp_avg), ("exp_avg_sq", exp_avg_sq)):
                if key in entry:
                    out[name] = _array(entry[key])
            if "step" in entry:
                steps.add(float(_array(entry["step"])))
    if len(steps) > 1:
        raise MigrateError(f"{path}: the parameters' AdamW step counts differ ({sorted(steps)[:3]})")
    return exp_avg, exp_avg_sq, (steps.pop() if steps else None)


def group_lr(state_dict) -> float | None:
    """The lr of the first param group (every group's, for the schedules both trainers use)."""
    lr = state_dict["param_groups"][0].get("lr")
    return float(_array(lr)) if lr is not None else None


def _array(value) -> np.ndarray:
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().to(torch.float32 if value.is_floating_point() and value.dtype != torch.float64
                                 else value.dtype).cpu().numpy()
    return np.asarray(value)
