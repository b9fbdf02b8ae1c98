"""What the health watch leaves in a run folder, written the same way by both trainers.

    RUN/health.jsonl         one line per event: step, kind, value, limit, detail, action,
                             the culprit micro-batch and its sample indices, the batch file;
                             and one `verdict` line after `health.verdict_step`
    RUN/health_batches/step-000012.json
                             the step's micro-batches: sample indices in the global order,
                             their loss, token ids, and the decoded text when the data's
                             tokenizer is at hand (data.json names it)

Token ids are read from the data folder's train.npy at the sample indices, so the two
sides save the very rows the step trained on. Files are written atomically.
"""
from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from migrate.checkpoints.atomic import atomic_write_text
from migrate.data.samples import load_samples, read_meta
from migrate.errors import MigrateError
from migrate.run_protocol.record import step_of
from migrate.train.health.watch import EXIT_CODE, HealthWatch, StepFacts, StepVerdict

FILE = "health.jsonl"
BATCHES = "health_batches"


class HealthStop(MigrateError):
    """The `stop` policy ended the run (exit code 3)."""

    exit_code = EXIT_CODE


class HealthLog:
    """The watch's events as log lines, health.jsonl entries and saved batches.

    out None: decide only, write nothing (a non-writing rank, a replay)."""

    def __init__(self, watch: HealthWatch, out: Path | None, data_dir: Path, seq_length: int,
                 log: Callable[[str], None] = print, start_step: int = 0):
        self.watch, self.out, self.log = watch, out, log
        self.data_dir, self.seq_length = Path(data_dir), seq_length
        self._samples = None
        self._tokenizer = False  # False: not looked for yet; None: none at hand
        if out is not None:
            _truncate(out / FILE, start_step)
            for old in (out / BATCHES).glob("step-*.json"):  # an earlier run's, past where this one starts
                if old.stem[5:].isdigit() and int(old.stem[5:]) > start_step:
                    old.unlink()

    def step(self, facts: StepFacts, micro_losses: Sequence[float], micro_samples) -> StepVerdict:
        """Check one step; log, record and save what it shows; raise nothing (see `stop_if`)."""
        verdict = self.watch.check(facts)
        if verdict.events:
            culprit = _culprit(micro_losses)
            batch = self._save_batch(verdict, micro_losses, micro_samples, culprit)
            samples = [int(i) for i in np.asarray(micro_samples[culprit]).ravel()]
            for event in verdict.events:
                self.log(f"{event.line()} -> {verdict.action} (micro-batch {culprit}, samples {_short(samples)})")
                self._append({"step": event.step, "kind": event.kind, "value": _num(event.value),
                              "limit": _num(event.limit), "detail": event.detail, "action": verdict.action,
                              "policy": self.watch.config.policy, "micro": culprit, "samples": samples,
                              "batch": batch})
        if self.watch.verdict_due(facts.step):
            line = self.watch.verdict_line()
            self.log(line)
            self._append({"step": facts.step, "kind": "verdict", "healthy": self.watch.healthy,
                          "first": dict(self.watch.first), "counts": dict(self.watch.counts), "line": line})
        return verdict

    def stop_if(self, verdict: StepVerdict) -> None:
        """Raise HealthStop after a step the `stop` policy ends the run at (its record written first)."""
        if verdict.action == "stop":
            kinds = ", ".join(e.kind for e in verdict.events)
            where = f"{self.out / FILE} and {self.out / BATCHES}/" if self.out is not None else f"{FILE} on rank 0"
            raise HealthStop(f"the health watch stopped the run at step {verdict.step}: {kinds} (health.policy stop; "
                             f"see {where})")

    # ---------- files ----------
    def _append(self, entry: dict) -> None:
        if self.out is None:
            return
        with open(self.out / FILE, "a") as fh:
            fh.write(json.dumps(entry) + "\n")

    def _save_batch(self, verdict: StepVerdict, micro_losses, micro_samples, culprit: int) -> str | None:
        if self.out is None or not self.watch.config.save_batches:
            return None
        rows = self._rows()
        micro = []
        for m, indices in enumerate(micro_samples):
            idx = np.asarray(indices, dtype=np.int64).ravel()
            ids = np.asarray(rows[idx]).tolist()
            entry = {"micro": m, "loss": _num(micro_losses[m]) if m < len(micro_losses) else None,
                     "samples": idx.tolist(), "token_ids": ids}
            text = self._decode(ids)
            if text is not None:
                entry["text"] = text
            micro.append(entry)
        name = f"{BATCHES}/step-{verdict.step:06d}.json"
        record = {"step": verdict.step, "kinds": [e.kind for e in verdict.events], "culprit_micro": culprit,
                  "layout": "token_ids[i] is row samples[i] of the data's train.npy: the model reads row[:-1] "
                            "and predicts row[1:]",
                  "micro_batches": micro}
        atomic_write_text(self.out / name, json.dumps(record) + "\n")
        return name

    def _rows(self):
        if self._samples is None:
            self._samples = load_samples(self.data_dir, self.seq_length)
        return self._samples

    def _decode(self, ids: list[list[int]]) -> list[str] | None:
        if self._tokenizer is False:
            self._tokenizer = _data_tokenizer(self.data_dir)
        if self._tokenizer is None:
            return None
        return [self._tokenizer.decode(row, skip_special_tokens=False) for row in ids]


def replay(watch: HealthWatch, records: Sequence[dict]) -> None:
    """Feed a resumed run's earlier steps (its metrics.jsonl records) through the watch, silently,
    so the running statistics and first steps are those of the uninterrupted run."""
    for rec in records:
        watch.check(facts_of(rec))


def facts_of(rec: dict) -> StepFacts:
    return StepFacts(int(rec["step"]), rec.get("loss"), rec.get("grad_norm"), float(rec["lr"]), rec.get("loss_scale"))


def _data_tokenizer(data_dir: Path):
    """The tokenizer data.json names (tokenizer.json in its folder), or None."""
    try:
        folder = read_meta(data_dir).get("tokenizer", {}).get("path")
        spec = Path(folder) / "tokenizer.json" if folder else None
        if spec is None or not spec.is_file():
            return None
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(spec))
    except Exception:  # the text is a courtesy: a tokenizer that will not load never fails a run
        return None


def _culprit(micro_losses: Sequence[float]) -> int:
    """The micro-batch most likely behind the step's event: the first with a non-finite loss, else the highest."""
    if not micro_losses:
        return 0
    for m, loss in enumerate(micro_losses):
        if loss is None or not math.isfinite(loss):
            return m
    return max(range(len(micro_losses)), key=lambda m: micro_losses[m])


def _truncate(path: Path, last_step: int) -> None:
    """Keep the entries of steps <= last_step: a resumed run rewrites what follows (a fresh run: all)."""
    if not path.is_file():
        return
    keep = [line for n, line in enumerate(path.read_text().splitlines(keepends=True), 1)
            if line.strip() and step_of(line, f"{path}:{n}") <= last_step]
    path.write_text("".join(keep))


def _num(x):
    return None if x is None or not math.isfinite(x) else float(x)


def _short(values: list[int], n: int = 8) -> str:
    return "[" + ", ".join(map(str, values[:n])) + (", ...]" if len(values) > n else "]")
