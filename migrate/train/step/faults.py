"""Faults injected at given steps of either trainer, to rehearse the health watch.

    faults = parse_step_faults(["nan_grad@12", "lr_x100@5", "nan_grad@20-24"])
    faults.lr_factor(step)      # the factor on the lr of optimizer step `step` (1-based)
    faults.poison_grad(step)    # put a NaN into one gradient element before clipping

golden/train_torch.py and `migrate train` both take `step_faults=`, and apply them at the
same point of the same step, so the two runs see the same fault: a NaN in the first
trainable parameter's first gradient element after accumulation (in fp16 that is an
overflow the loss scaler skips), or the step's lr multiplied. A batch that spikes the
loss needs no hook: put it in the data (tests/test_health.py writes one).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from migrate.errors import MigrateError

KINDS = {"nan_grad": "NaN in one gradient element after accumulation",
         "lr_x100": "the step's lr multiplied by 100"}
_SPEC = re.compile(r"^(?P<kind>[a-z_0-9]+)@(?P<first>\d+)(?:-(?P<last>\d+))?$")


@dataclass(frozen=True)
class StepFaults:
    steps: dict[str, frozenset[int]]

    def lr_factor(self, step: int) -> float:
        return 100.0 if step in self.steps.get("lr_x100", ()) else 1.0

    def poison_grad(self, step: int) -> bool:
        return step in self.steps.get("nan_grad", ())

    @property
    def specs(self) -> list[str]:
        return [f"{kind}@{step}" for kind, steps in sorted(self.steps.items()) for step in sorted(steps)]


def parse_step_faults(specs=(), total_steps: int | None = None) -> StepFaults:
    """KIND@STEP or KIND@FIRST-LAST (optimizer steps, 1-based); one MigrateError line for a bad one,
    or (given the run's `total_steps`) for a step the run never reaches: the rehearsal would end
    "healthy" without its fault, and FIRST-LAST 1-10**12 built a set of 10**12 steps."""
    if isinstance(specs, StepFaults):
        return specs
    steps: dict[str, set[int]] = {}
    for spec in specs or ():
        match = _SPEC.match(str(spec).strip())
        if not match or match["kind"] not in KINDS:
            raise MigrateError(f"bad step fault {spec!r}: use KIND@STEP or KIND@FIRST-LAST with KIND one of "
                               f"{', '.join(KINDS)}")
        first = int(match["first"])
        last = int(match["last"] or first)
        if first < 1 or last < first:
            raise MigrateError(f"bad step fault {spec!r}: steps are 1-based and FIRST <= LAST")
        if total_steps is not None and last > total_steps:
            raise MigrateError(f"bad step fault {spec!r}: the run has {total_steps} steps (total_steps)"[:300])
        steps.setdefault(match["kind"], set()).update(range(first, last + 1))
    return StepFaults({k: frozenset(v) for k, v in steps.items()})
