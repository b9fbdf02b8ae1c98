"""Judge one step's run against what a correct tool must do: its exit code, where report.json
places a fault, its own checks. Also reads the verdict line a table shows."""
from __future__ import annotations

import json
import re
import signal
from dataclasses import dataclass, field
from pathlib import Path

from .measure import Measured
from .steps import Step

# migrate's verdict lines: "PASS · …", "FAIL · …", "vs HF generate: PASS · …"
VERDICT = re.compile(r"^(?:[\w ]+: )?(PASS|FAIL)\b")


def verdict_line(measured: Measured) -> str:
    """The last PASS/FAIL line; else, on failure, the last line on stderr; else the last line printed."""
    out, err = (_lines(text) for text in (measured.stdout, measured.stderr))
    verdicts = [ln for ln in out + err if VERDICT.match(ln)]
    if verdicts:
        return verdicts[-1]
    if measured.exit_code != 0 and err:
        return err[-1]
    return (out or err or [""])[-1]


def _lines(text: str) -> list[str]:
    return [ln.strip() for ln in text.splitlines() if ln.strip()]


def report_summary(report_dir: Path) -> dict | None:
    try:
        return json.loads((report_dir / "report.json").read_text())["summary"]
    except (OSError, ValueError, KeyError):
        return None


def divergence_text(summary: dict | None) -> str | None:
    """"layer 12 · mlp output (forward)" for the first forward and gradient divergences, if any."""
    if not summary:
        return None
    places = [f"{summary[key]['location']} ({label})" for key, label in
              (("first_divergence", "forward"), ("first_grad_divergence", "gradients")) if summary.get(key)]
    return "; ".join(places) or None


@dataclass
class Outcome:
    step: Step
    measured: Measured
    report: dict | None          # report.json's summary when the step wrote one
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def verdict(self) -> str:
        return verdict_line(self.measured)

    def summary(self) -> str:
        """One line: what was not as expected, the verdict, and where the report found a divergence."""
        parts = ["; ".join(self.problems), self.verdict, divergence_text(self.report)]
        return f"{self.step.name}: " + " · ".join(p for p in parts if p)

    def explain(self) -> str:
        lines = [f"{self.step.name}: " + "; ".join(self.problems), "  $ " + " ".join(self.measured.argv),
                 f"  exit {self.measured.exit_code} · {self.verdict}"]
        if divergence_text(self.report):
            lines.append(f"  first divergence: {divergence_text(self.report)}")
        tail = self.measured.stderr.strip().splitlines()[-5:]
        return "\n".join(lines + ["  stderr: " + ln for ln in tail])


def judge(step: Step, measured: Measured, report_dir: Path, paths: dict, earlier: dict[str, Measured],
          failed_needs: list[str]) -> Outcome:
    outcome = Outcome(step, measured, report_summary(report_dir))
    problems = outcome.problems
    if failed_needs:
        problems.append(f"ran after failed steps it needs: {', '.join(failed_needs)}")
    if measured.timed_out:
        problems.append(f"killed after {measured.wall_s:.0f} s: past the step's time limit")
    elif measured.exit_code < 0:  # e.g. SIGKILL from the OOM killer
        problems.append(f"killed by {signal.Signals(-measured.exit_code).name}, expected exit {step.exit}")
    elif measured.exit_code != step.exit:
        problems.append(f"exit {measured.exit_code}, expected {step.exit}")
    if step.at is not None:
        problems += _misplaced(step, outcome.report)
    if step.check is not None and measured.exit_code == step.exit:
        try:
            problems += step.check(paths, measured, earlier)
        except Exception as exc:  # a check that cannot read its outputs is a failed claim, not a crash
            problems.append(f"check failed: {type(exc).__name__}: {exc}")
    return outcome


def _misplaced(step: Step, summary: dict | None) -> list[str]:
    if summary is None:
        return ["no report.json to locate the fault in"]
    found = summary.get(step.at.key)
    if not found:
        return [f"report.json has no {step.at.key}; expected {step.at}"]
    if (found.get("layer"), found.get("block")) != (step.at.layer, step.at.block):
        return [f"{step.at.key} at {found.get('location')}, expected {step.at}"]
    return []
