"""Do the two runs' saved states after one step agree? Parameters and AdamW moments of a golden
checkpoint-N and a MindSpore checkpoint-N, paired through the run's conversion plan and held to
the judge's bounds (parameters as `migrate diff`'s parameters after a step, moments as gradients).

Bounds: `STATE_BOUNDS`. A small stand-in for a full training-state diff: `migrate replay` uses it to walk back from the
step `compare` flags to the first step whose starting states still agree -- an optimizer fault at
step k shows in the loss only at step k + 1, from a state that already parts.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from migrate.judge.report import Report
from migrate.judge.thresholds import Thresholds
from migrate.replay.judging import to_peak
from migrate.train.checkpoint.folder import open_checkpoint

# Saved states of correct runs drift apart step by step (the demo's embedding: 1.4e-4 of its peak
# after 5 fp32 steps), so a state is held to a looser bound than one step's product: each tensor
# divided by its peak, max abs and cosine (fp32, bf16/fp16). A fault moves a moment by far more
# (beta2: x20), a parameter by a share of lr each step.
STATE_BOUNDS = {"fp32": (1e-3, 0.9999), "low": (3e-2, 0.999)}


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
    rel, cosine = STATE_BOUNDS["fp32" if cfg.dtype == "fp32" else "low"]
    bounds = Thresholds(cfg.dtype).with_overrides("grad", max_abs=0.0, max_abs_rel=rel, cosine=cosine)
    report = Report(dtype=cfg.dtype, ref_label="golden", got_label="MindSpore", thresholds=bounds)
    for key in ("parameter", "exp_avg", "exp_avg_sq"):
        ref = plan.in_model_names(golden[key])
        trained = [n for n in plan.expected if n in ms["exp_avg"] and n in ref]  # in the model's order
        for name in reversed(trained):  # lm_head first
            got = ms[key].get(name)
            if got is None:
                continue
            entry = report.add(name, *to_peak(ref[name], got), kind="grad")
            if not entry.passed:
                hf = " + ".join(plan.sources.get(name, (name,)))
                return f"{key} of {hf} ({entry.headline()})"
    return None


def _array(value) -> np.ndarray:
    return np.asarray(value.asnumpy() if hasattr(value, "asnumpy") else value, np.float32)
