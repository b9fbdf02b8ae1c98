"""Structured training logs: HF Trainer's trainer_state.json and TensorBoard event files.

trainer_state.json (transformers/trainer_callback.py ``TrainerState.save_to_json``) holds
``log_history``, one dict per ``Trainer.log`` call: ``{**logs, "step": global_step}`` with
``loss``, ``grad_norm``, ``learning_rate``, ``epoch`` (and ``num_input_tokens_seen``) for
training entries (transformers/trainer.py ``_maybe_log_save_evaluate``, ``log``).

TensorBoard files are read with TensorBoard's own ``EventAccumulator`` (no protobuf by hand);
the producer is told by its tags (`TB_DIALECTS`).
"""
from __future__ import annotations

import math
from pathlib import Path

from migrate.compare.foreign_run import Rows
from migrate.compare.foreign_text import MEGATRON, MINDFORMERS
from migrate.compare.log_formats import FP32_HALF_ULP, LogFormat, log_format, printed_resolution
from migrate.compare.metrics_log import Run
from migrate.errors import MigrateError
from migrate.jsonsafe import load_json

__all__ = ["HF_TRAINER", "TENSORBOARD", "TB_DIALECTS", "read_hf_trainer_state", "read_tensorboard", "tensorboard_files"]


class _Literal(float):
    """A JSON number that remembers how it was written (for its printed resolution)."""

    text: str

    def __new__(cls, text: str):
        obj = super().__new__(cls, float(text))
        obj.text = text
        return obj


HF_TRAINER = LogFormat(
    "hf_trainer", "HF Trainer trainer_state.json",
    "transformers/trainer.py: Trainer._maybe_log_save_evaluate and Trainer.log (state.log_history)",
    {"step": "step", "loss": "loss", "lr": "learning_rate", "grad_norm": "grad_norm",
     "tokens": "num_input_tokens_seen"},
    loss_averaged=True, torch_clip=True,
    printed={"loss": "repr", "lr": "repr", "grad_norm": "repr"},
    note="loss = tr_loss / (global_step - last logged step): the mean since the previous entry; "
         "learning_rate is read before lr_scheduler.step() (transformers 5; 4.x releases logged the next "
         "step's lr, which the lr rule names as a schedule off by one step); grad_norm is "
         "clip_grad_norm_'s pre-clip total norm. Numbers are Python reprs (exact); transformers 4.x rounded "
         "the loss to 4 decimals, which is read from the file (every loss with <= 4 decimals). Entries "
         "without 'loss' (evaluation, the final train_runtime summary) are skipped.",
    sniff=lambda s: s.child("trainer_state.json") or (not s.is_dir and s.name == "trainer_state.json")
    or (not s.is_dir and s.first.startswith("{") and '"log_history"' in s.text),
    rank=10, folder="trainer_state.json")


@log_format(HF_TRAINER)
def read_hf_trainer_state(path: Path, role: str) -> Run:
    fmt = HF_TRAINER
    try:
        data = load_json(path, parse_float=_Literal)  # bounded: one line naming the file otherwise
    except OSError as e:
        raise MigrateError(f"{path}: cannot read ({e.strerror or e})") from None
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


TENSORBOARD = LogFormat(
    "tensorboard", "TensorBoard event file",
    "read with tensorboard.backend.event_processing.event_accumulator.EventAccumulator",
    {}, loss_averaged=False, torch_clip=False,
    note="scalar tags per producer below (TB_DIALECTS); values are float32",
    sniff=lambda s: (s.is_dir and bool(tensorboard_files(s.path))) or s.name.startswith("events.out.tfevents"),
    rank=20, known="TensorBoard event files", folder="TensorBoard event files")

# TensorBoard tags per producer: compare's column <- tag; the dialect is the first whose loss and
# lr tags the file has. Sources: transformers/integrations/integration_utils.py TensorBoardCallback.on_log
# (rewrite_logs adds "train/"), Megatron-LM training_log (writer.add_scalar(key, loss_dict[key]) is
# the iteration's own loss, not the printed window mean), MindFormers MFLossMonitor.print_output_info.
TB_DIALECTS: dict[str, tuple[LogFormat, dict[str, str]]] = {
    # migrate's own trainers (migrate/train/tensorboard.py SCALARS): the step's own values
    "migrate": (
        LogFormat("migrate_tb", "migrate TensorBoard", "migrate/train/tensorboard.py", {},
                  loss_averaged=False, torch_clip=True),
        {"loss": "train/loss", "lr": "train/lr", "grad_norm": "train/grad_norm",
         "grad_norm_clipped": "train/grad_norm_clipped", "loss_scale": "fp16/loss_scale"}),
    "hf_trainer": (
        LogFormat("hf_trainer_tb", "HF Trainer TensorBoard (TensorBoardCallback)",
                  "transformers/integrations/integration_utils.py: TensorBoardCallback.on_log", {},
                  loss_averaged=True, torch_clip=True),   # the same logs as log_history
        {"loss": "train/loss", "lr": "train/learning_rate", "grad_norm": "train/grad_norm"}),
    "megatron": (
        LogFormat("megatron_tb", "Megatron-LM TensorBoard", MEGATRON.source, {},
                  loss_averaged=False, torch_clip=True, lr_of_next_step=True),
        {"loss": "lm loss", "lr": "learning-rate", "grad_norm": "grad-norm", "loss_scale": "loss-scale"}),
    "mindformers": (
        LogFormat("mindformers_tb", "MindSpore Transformers TensorBoard", MINDFORMERS.source, {},
                  loss_averaged=False, torch_clip=False),
        {"loss": "loss", "lr": "learning-rate", "grad_norm": "grad-norm", "loss_scale": "loss-scale"}),
}


@log_format(TENSORBOARD)
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
    name = next((n for n, (_, m) in TB_DIALECTS.items() if m["loss"] in tags and m["lr"] in tags), None)
    if name is None:
        known = "; ".join(f"{n}: {m['loss']!r} + {m['lr']!r}" for n, (_, m) in TB_DIALECTS.items())
        shown = ", ".join(sorted(tags)[:8]) or "none"
        raise MigrateError(f"{path}: TensorBoard scalars of an unknown producer (tags: {shown}); "
                           f"compare reads the loss and lr tags of {known}")
    fmt, mapping = TB_DIALECTS[name]
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
