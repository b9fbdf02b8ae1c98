"""Structured training logs: HF Trainer's trainer_state.json and TensorBoard event files.

trainer_state.json (transformers/trainer_callback.py ``TrainerState.save_to_json``) holds
``log_history``, one dict per ``Trainer.log`` call: ``{**logs, "step": global_step}`` with
``loss``, ``grad_norm``, ``learning_rate``, ``epoch`` (and ``num_input_tokens_seen``) for
training entries (transformers/trainer.py ``_maybe_log_save_evaluate``, ``log``).

TensorBoard files are read with TensorBoard's own ``EventAccumulator`` (no protobuf by hand);
the producer is told by its tags (`log_formats.TB_DIALECTS`).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from migrate.errors import MigrateError
from migrate.compare.foreign_run import Rows
from migrate.compare.log_formats import FORMATS, FP32_HALF_ULP, TB_DIALECTS, printed_resolution
from migrate.compare.metrics_log import Run

__all__ = ["read_hf_trainer_state", "read_tensorboard"]


class _Literal(float):
    """A JSON number that remembers how it was written (for its printed resolution)."""

    text: str

    def __new__(cls, text: str):
        obj = super().__new__(cls, float(text))
        obj.text = text
        return obj


def read_hf_trainer_state(path: Path, role: str) -> Run:
    fmt = FORMATS["hf_trainer"]
    try:
        data = json.loads(path.read_text(encoding="utf-8"), parse_float=_Literal)
    except (OSError, UnicodeDecodeError) as e:
        raise MigrateError(f"{path}: cannot read ({getattr(e, 'strerror', None) or e})") from None
    except json.JSONDecodeError as e:
        raise MigrateError(f"{path}: not JSON ({e.msg} at line {e.lineno})") from None
    history = data.get("log_history") if isinstance(data, dict) else None
    if not isinstance(history, list):
        raise MigrateError(f"{path}: no 'log_history' list (not an HF Trainer trainer_state.json)")
    rows = Rows(path, fmt.key)
    columns = {v: k for k, v in fmt.fields.items() if k != "step"}
    styles = dict(fmt.printed)
    losses = [e["loss"] for e in history if isinstance(e, dict) and isinstance(e.get("loss"), _Literal)]
    if losses and all(len(v.text.partition(".")[2]) <= 4 and "e" not in v.text.lower() for v in losses):
        styles["loss"] = "fixed"   # transformers 4.x: round(loss, 4)
    for i, entry in enumerate(history):
        if not isinstance(entry, dict) or "loss" not in entry:
            continue  # evaluation entries, the final train_runtime summary
        where = f"{path}: log_history[{i}]"
        step = entry.get("step")
        if isinstance(step, bool) or not isinstance(step, int):
            raise MigrateError(f"{where}: 'step' must be an integer, got {step!r}")
        values, res = {}, {}
        for key, column in columns.items():
            v = entry.get(key)
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise MigrateError(f"{where}: {key!r} must be a number, got {v!r}")
            values[column] = float(v)
            if isinstance(v, _Literal):
                res[column] = printed_resolution(v.text, styles.get(column, "repr"))
        rows.add(step, i + 1, values, res)
    return rows.run(role, averaged=fmt.loss_averaged)


def tensorboard_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    return sorted(p for p in path.iterdir() if p.is_file() and p.name.startswith("events.out.tfevents"))


def read_tensorboard(path: Path, role: str) -> Run:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # no TF, no torch

    acc = EventAccumulator(str(path), size_guidance={"scalars": 0})
    try:
        acc.Reload()
    except Exception as e:  # noqa: BLE001 -- a damaged file: one line, whatever TensorBoard raised
        raise MigrateError(f"{path}: not a readable TensorBoard event file ({type(e).__name__}: {e})") from None
    tags = set(acc.Tags().get("scalars", []))
    if not tags:
        raise MigrateError(f"{path}: no TensorBoard scalars in it (an empty or damaged event file?)")
    for name, (fmt, mapping) in TB_DIALECTS.items():
        if mapping["loss"] in tags and mapping["lr"] in tags:
            break
    else:
        known = "; ".join(f"{n}: {m['loss']!r} + {m['lr']!r}" for n, (_, m) in TB_DIALECTS.items())
        shown = ", ".join(sorted(tags)[:8]) or "none"
        raise MigrateError(f"{path}: TensorBoard scalars of an unknown producer (tags: {shown}); "
                           f"compare reads the loss and lr tags of {known}")
    rows = Rows(path, f"tensorboard:{name}")
    per_step: dict[int, dict[str, float]] = {}
    for column, tag in mapping.items():
        if tag not in tags:
            continue
        for ev in acc.Scalars(tag):  # a step written twice (a restart TensorBoard did not purge): the last
            per_step.setdefault(int(ev.step), {})[column] = float(ev.value)
    for i, step in enumerate(sorted(per_step)):
        values = per_step[step]
        if "loss" not in values:
            continue
        res = {k: abs(v) * FP32_HALF_ULP for k, v in values.items() if math.isfinite(v)}  # float32 scalars
        skipped = None
        rows.add(step, i + 1, values, res, skipped)
    return rows.run(role, averaged=fmt.loss_averaged)
