"""Do the two runs' saved states after one step agree? `migrate diff`'s training-state engine
(`migrate.state_diff`) on a golden checkpoint-N and a MindSpore checkpoint-N: parameters, AdamW
moments, counters and lr, in backward order, held to its bounds (docs/diff.md, "Diffing two training
states"). `migrate replay` uses it to walk back from the step `compare` flags to the first step whose
starting states still agree -- an optimizer fault at step k shows in the loss only at step k + 1, from
a state that already parts.
"""
from __future__ import annotations

from pathlib import Path

from migrate.state_diff.compare import diff_states


def first_parting_state(golden_checkpoint: Path, ms_checkpoint: Path) -> str | None:
    """The first tensor or counter of the two saved states that parts, in words ("exp_avg_sq
    lm_head.weight (…)"), or None when the state diff passes them."""
    report = diff_states(str(golden_checkpoint), str(ms_checkpoint))
    if report.passed:
        return None
    entry = report.first_grad_divergence or next(e for e in report.entries if not e.passed)
    return f"{entry.name}: {entry.headline()}"
