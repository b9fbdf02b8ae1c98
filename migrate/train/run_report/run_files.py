"""A training run folder as the report reads it: metrics records (checked by `migrate compare`'s
reader, kept whole for the fields it does not know), effective hyperparameters, health events."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from migrate.compare.metrics_log import Run, read_metrics
from migrate.errors import MigrateError

HEALTH_FILE = "health.jsonl"
HPARAMS_FILE = "effective_hparams.json"


@dataclass
class RunFiles:
    folder: Path
    metrics: Run                                   # the validated columns
    records: list[dict]                            # every metrics.jsonl line, by step
    hparams: dict | None = None
    health: list[dict] = field(default_factory=list)   # events, in file order
    health_verdicts: list[dict] = field(default_factory=list)
    health_found: bool = False

    @property
    def side(self) -> str:
        side = (self.hparams or {}).get("side")
        return {"mindspore": "MindSpore", "golden": "golden (PyTorch)"}.get(side, side or "run")

    def config(self, key: str, default=None):
        return ((self.hparams or {}).get("config") or {}).get(key, default)


def read_run(path) -> RunFiles:
    folder = Path(path)
    if folder.is_file() and folder.name == "metrics.jsonl":
        folder = folder.parent
    if not folder.is_dir():
        raise MigrateError(f"run folder not found: {path}")
    metrics = read_metrics(folder, "run")
    records = {}
    for line in metrics.path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            rec = json.loads(line)  # read_metrics has checked every line
            records[int(rec["step"])] = rec
    run = RunFiles(folder, metrics, [records[s] for s in sorted(records)])
    hp = folder / HPARAMS_FILE
    if hp.is_file():
        try:
            run.hparams = json.loads(hp.read_text())
        except ValueError as exc:
            raise MigrateError(f"{hp} is not JSON: {exc}") from None
    health = folder / HEALTH_FILE
    if health.is_file():
        run.health_found = True
        for n, line in enumerate(health.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
            except ValueError:
                raise MigrateError(f"{health}:{n}: not JSON") from None
            if not isinstance(entry, dict):
                raise MigrateError(f"{health}:{n}: expected a JSON object")
            (run.health_verdicts if entry.get("kind") == "verdict" else run.health).append(entry)
    return run
