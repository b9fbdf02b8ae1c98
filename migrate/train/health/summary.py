"""`migrate health RUN`: what the health watch saw in a finished or running run.

    summary = summarise("runs/ms")
    summary.lines()          # the text `migrate health` prints
    summary.exit_code        # 0 healthy, 1 an event

Reads RUN/health.jsonl (events, verdict lines, saved batches) and RUN/metrics.jsonl
(how far the run got). A run without health.jsonl (written before the watch existed,
or by another tool in migrate's metrics format) is judged by replaying its metrics
through the same watch, with the run's own `health:` settings where its
effective_hparams.json records them. A half-written last line (a run still writing)
is ignored.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from migrate.checkpoints.input_folder import InputFolder
from migrate.errors import MigrateError
from migrate.jsonsafe import JSONError, load_json, parse_json
from migrate.safeyaml import quote
from migrate.train.config import HealthConfig, RunConfig
from migrate.train.health.log import FILE, facts_of
from migrate.train.health.watch import KINDS, HealthWatch, verdict_line

METRICS = "metrics.jsonl"
HPARAMS = "effective_hparams.json"


@dataclass
class HealthSummary:
    run: Path
    steps: int                           # last step logged in metrics.jsonl
    policy: str
    events: list[dict] = field(default_factory=list)
    verdicts: list[dict] = field(default_factory=list)
    source: str = FILE                   # or "replayed from metrics.jsonl"

    @property
    def first(self) -> dict[str, int]:
        first: dict[str, int] = {}
        for e in self.events:
            first.setdefault(e["kind"], e["step"])
        return first

    @property
    def counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for e in self.events:
            counts[e["kind"]] = counts.get(e["kind"], 0) + 1
        return counts

    @property
    def healthy(self) -> bool:
        return not self.events

    @property
    def exit_code(self) -> int:
        return 0 if self.healthy else 1

    def lines(self) -> list[str]:
        out = [f"run {self.run} · {self.steps} steps logged · policy {self.policy} · events from {self.source}"]
        for v in self.verdicts:
            out.append(v["line"])
        if self.events:
            out.append(f"{'step':>6}  {'kind':<20} {'action':<8} {'value':>10} {'limit':>10}  detail")
            for e in self.events:
                where = (f"; batch {e['batch']} (micro {e.get('micro')}, samples {e.get('samples')})"
                         if e.get("batch") else "")
                out.append(f"{e['step']:>6}  {e['kind']:<20} {e.get('action', ''):<8} {_fmt(e.get('value')):>10} "
                           f"{_fmt(e.get('limit')):>10}  {e.get('detail', '')}{where}")
        out.append(verdict_line(self.steps, self.first, self.counts).replace("health after", "now, after"))
        return out


def summarise(run: str | Path) -> HealthSummary:
    run = Path(run)
    metrics = _records(run / METRICS)
    if not run.is_dir() or not metrics and not (run / FILE).is_file():
        raise MigrateError(f"{run} is not a training run folder: no {METRICS}")
    steps = max((r["step"] for _, r in metrics), default=0)
    config = _health_config(run)
    entries = [_entry(run / FILE, line, e) for line, e in _records(run / FILE)]
    if (run / FILE).is_file():
        events = [e for e in entries if e.get("kind") in KINDS]
        verdicts = [e for e in entries if e.get("kind") == "verdict"]
        return HealthSummary(run, steps, config.policy, events, verdicts)
    watch = HealthWatch.for_run(_replay_config(run, config))
    events = []
    for line, rec in metrics:
        for event in watch.check(facts_of(_replayable(run / METRICS, line, rec))).events:
            events.append({"step": event.step, "kind": event.kind, "value": event.value, "limit": event.limit,
                           "detail": event.detail})
    return HealthSummary(run, steps, config.policy, events, [], f"{METRICS}, replayed (no {FILE})")


def _records(path: Path) -> list[tuple[int, dict]]:
    """(line number, step record) of a .jsonl file, each line read as bounded JSON (`jsonsafe.parse_json`);
    a file that is not UTF-8, or a line that is not a step record, is one line naming it."""
    if not os.path.lexists(path):
        return []
    # the reader rule: a member of the run folder, a regular file (a folder or FIFO there read as "no steps",
    # exit 0 "healthy"; a link out of the folder was followed)
    path = InputFolder(path.parent, "run folder").member(path.name, path.name)
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MigrateError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    out = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rec = parse_json(line, f"{path}:{i + 1}")
        except JSONError:
            if i == len(lines) - 1:
                continue  # a run still writing its last line
            raise
        if not isinstance(rec, dict) or not isinstance(rec.get("step"), int) or isinstance(rec["step"], bool):
            raise MigrateError(f"{path}:{i + 1}: not a step record")
        out.append((i + 1, rec))
    return out


def _replayable(path: Path, line: int, rec: dict) -> dict:
    """A metrics record the watch can replay: lr a number; loss, grad_norm and loss_scale numbers or absent."""
    where = f"{path}:{line}"
    if not _number(rec.get("lr")):
        raise MigrateError(f"{where}: no lr (a number) to replay the health watch with, found {quote(rec.get('lr'))}")
    for key in ("loss", "grad_norm", "loss_scale"):
        if rec.get(key) is not None and not _number(rec[key]):
            raise MigrateError(f"{where}: {key} must be a number, found {quote(rec[key])}")
    return rec


def _entry(path: Path, line: int, e: dict) -> dict:
    """A health.jsonl line with the fields the summary prints, of the types the watch writes them in."""
    text = {"kind": str, "action": str, "detail": str, "line": str, "batch": str}
    for key, kind in text.items():
        if e.get(key) is not None and not isinstance(e[key], kind):
            raise MigrateError(f"{path}:{line}: {key} must be text, found {quote(e[key])}")
    for key in ("value", "limit"):
        if e.get(key) is not None and not _number(e[key]):
            raise MigrateError(f"{path}:{line}: {key} must be a number, found {quote(e[key])}")
    if e.get("kind") == "verdict" and not isinstance(e.get("line"), str):
        raise MigrateError(f"{path}:{line}: a verdict line without its text")
    return e


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _hparams(run: Path) -> dict:
    try:
        data = load_json(run / HPARAMS)
    except (OSError, ValueError):  # ValueError: jsonsafe.JSONError; the record is optional here
        return {}
    return data if isinstance(data, dict) else {}


def _health_config(run: Path) -> HealthConfig:
    recorded = _hparams(run).get("health")
    if not isinstance(recorded, dict):
        return HealthConfig()
    known = {k: v for k, v in recorded.items() if k in HealthConfig.__dataclass_fields__}
    try:
        return HealthConfig(**known)
    except TypeError:
        return HealthConfig()


def _replay_config(run: Path, health: HealthConfig) -> RunConfig:
    """A RunConfig carrying what the watch needs (lr peak, warmup, dtype) from the run's own record."""
    data = _hparams(run).get("config")
    if isinstance(data, dict):
        try:
            cfg = RunConfig.from_dict(data)
            cfg.health = health
            return cfg
        except MigrateError:
            pass
    raise MigrateError(f"{run} has no {FILE} and no readable {HPARAMS} to replay its metrics with")


def _fmt(x) -> str:
    return "-" if x is None else f"{x:.4g}" if isinstance(x, float) else str(x)
