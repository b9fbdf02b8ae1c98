"""Do the two runs' saved states after one step agree? Parameters and AdamW moments of a golden
checkpoint-N and a MindSpore checkpoint-N, paired through the run's conversion plan and held to
the judge's bounds (parameters as `migrate diff`'s parameters after a step, moments as gradients).

A small stand-in for a full training-state diff: `migrate replay` uses it to walk back from the
step `compare` flags to the first step whose starting states still agree -- an optimizer fault at
step k shows in the loss only at step k + 1, from a state that already parts.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from migrate.judge.report import Report
from migrate.replay.judging import to_peak
from migrate.train.checkpoint.folder import open_checkpoint


def first_parting_state(cfg, plan, golden_state, ms_checkpoint: Path) -> str | None:
    """The first saved tensor that parts (parameters, then exp_avg, then exp_avg_sq; lm_head first),
    in words, or None when the two states agree. golden_state: `golden_side.golden_state`'s tuple."""
    _, model, optimizer, _, _ = golden_state
    named = [(n, p) for g in optimizer.param_groups for n, p in zip(g["param_names"], g["params"], strict=True)]
    golden = {"parameter": {n: p.detach().float().numpy() for n, p in named}}
    for key in ("exp_avg", "exp_avg_sq"):
        golden[key] = {n: optimizer.state[p][key].float().numpy() for n, p in named if key in optimizer.state[p]}
    checkpoint = open_checkpoint(ms_checkpoint)
    own_name = {saved: own for own, saved in plan.checkpoint_names.items()}
    params = {own_name.get(n, n): _array(v) for n, v in checkpoint.parameters().items()}
    moments = checkpoint.optimizer_state()
    ms = {"parameter": params,
          "exp_avg": {n.removeprefix("adam_m."): v for n, v in moments.items() if n.startswith("adam_m.")},
          "exp_avg_sq": {n.removeprefix("adam_v."): v for n, v in moments.items() if n.startswith("adam_v.")}}
    report = Report(dtype=cfg.dtype, ref_label="golden", got_label="MindSpore")
    for key, kind in (("parameter", "param_after_step"), ("exp_avg", "grad"), ("exp_avg_sq", "grad")):
        ref = plan.in_model_names(golden[key])
        trained = [n for n in plan.expected if n in ms["exp_avg"] and n in ref]  # in the model's order
        for name in reversed(trained):  # lm_head first
            got = ms[key].get(name)
            if got is None:
                continue
            a, b = (ref[name], np.asarray(got, np.float32)) if kind != "grad" else to_peak(ref[name], got)
            entry = report.add(name, a, b, kind=kind)
            if not entry.passed:
                hf = " + ".join(plan.sources.get(name, (name,)))
                return f"{key} of {hf} ({entry.headline()})"
    return None


def _array(value) -> np.ndarray:
    return np.asarray(value.asnumpy() if hasattr(value, "asnumpy") else value, np.float32)
