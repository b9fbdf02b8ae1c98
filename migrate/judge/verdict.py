"""One judged figure (`Check`) and what a list of them decides (`Verdict`).

`migrate diff` makes a Check of every bound a compared tensor is held to (cosine, max abs,
NaN/Inf, ...) and one per compared tensor for the whole report; `migrate compare` makes one
per rule over the loss curves (first step, mean, noise band, drift, ...). Both decide pass,
exit code and first failure through `Verdict`.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from migrate.judge.fmt import fmt_figure

__all__ = ["Check", "Verdict", "EXIT_PASS", "EXIT_FAIL"]

EXIT_PASS, EXIT_FAIL = 0, 1   # bad input is a MigrateError: exit 2


@dataclass
class Check:
    """One figure held to one bound.

    ``passed`` is None when the check was not judged (no data, a disabled bound, a figure
    that cannot be measured in this run); ``detail`` then says why. On a failure ``detail``
    is the reason in words, or empty for the default "label value > limit".
    """

    key: str                   # the rule: "cosine", "max_abs", "first", "drift", ...
    label: str = ""            # what is measured, in words
    value: Any = None          # the measured figure
    limit: Any = None          # the bound it was held to
    passed: bool | None = None
    step: int | None = None    # the first step out of bound, where the figure runs over steps
    noise: float | None = None  # the same figure between two baseline runs, where there is one
    detail: str = ""

    @property
    def judged(self) -> bool:
        return self.passed is not None

    def reason(self) -> str:
        if self.detail:
            return self.detail
        return f"{self.label} {fmt_figure(self.value)} > {fmt_figure(self.limit)}"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass
class Verdict:
    """What a list of checks decides: it passes when no judged check failed.

    The first failure is the failing check at the earliest step; checks without a step come
    after every stepped one, and ties go to the rule listed first in ``order`` (then to the
    order of ``checks``).
    """

    checks: list[Check] = field(default_factory=list)
    order: Sequence[str] = ()   # rule keys, most fundamental first

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
        return EXIT_PASS if self.passed else EXIT_FAIL

    def rank(self, check: Check) -> tuple:
        rule = list(self.order).index(check.key) if check.key in self.order else len(self.order)
        return (check.step if check.step is not None else math.inf, rule)

    @property
    def first_failure(self) -> Check | None:
        fails = self.failed
        return min(fails, key=self.rank) if fails else None

    def check(self, key: str) -> Check | None:
        return next((c for c in self.checks if c.key == key), None)

    def reasons(self, sep: str = "; ") -> str | None:
        """Every failing check's reason in the order of ``checks``; None when none failed."""
        return sep.join(c.reason() for c in self.failed) or None

    def line(self, *parts: str) -> str:
        """The verdict line: "PASS · part · part" (or FAIL), empty parts left out."""
        return " · ".join(["PASS" if self.passed else "FAIL", *(p for p in parts if p)])
