"""A training run folder as the report reads it: metrics records (checked by `migrate compare`'s
reader, kept whole for the fields it does not know), effective hyperparameters, health events."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from migrate.checkpoints.input_folder import InputFolder
from migrate.compare.metrics_log import Run, read_metrics
from migrate.errors import MigrateError
from migrate.jsonsafe import load_json, parse_json

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
    for n, line in enumerate(metrics.path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            rec = parse_json(line, f"{metrics.path}:{n}")  # read_metrics has checked every line
            records[int(rec["step"])] = rec
    run = RunFiles(folder, metrics, [records[s] for s in sorted(records)])
    members = InputFolder(folder, "run folder")  # the reader rule: inside the run, regular files
    hp = members.optional(HPARAMS_FILE)
    if hp is not None:
        run.hparams = load_json(hp)  # bounded: one line naming the file otherwise
    health = members.optional(HEALTH_FILE)
    if health is not None:
        run.health_found = True
        try:
            text = health.read_bytes().decode("utf-8")
        except UnicodeDecodeError as exc:
            raise MigrateError(f"{health}: not UTF-8 text (byte {exc.start})") from None
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            entry = parse_json(line, f"{health}:{n}", expect=dict)
            (run.health_verdicts if entry.get("kind") == "verdict" else run.health).append(entry)
    return run
