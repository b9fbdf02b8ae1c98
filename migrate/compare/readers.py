"""Which log a path is, and reading it into a `Run`: `read_run(path, role)`.

A path may be a file or a run folder. Folders: ``metrics.jsonl``, else ``trainer_state.json``
(HF Trainer's output_dir or one of its checkpoint-N folders), else TensorBoard event files
(``events.out.tfevents.*``). Files: by name (``trainer_state.json``, ``events.out.tfevents.*``),
else by content -- Megatron-LM iteration lines, MindSpore Transformers MFLossMonitor lines, or
JSON lines (metrics.jsonl). Anything else is refused in one line naming what is read.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from migrate.errors import MigrateError
from migrate.compare.foreign_files import read_hf_trainer_state, read_tensorboard, tensorboard_files
from migrate.compare.foreign_text import MEGATRON_LINE, MINDFORMERS_LINE, read_megatron, read_mindformers
from migrate.compare.metrics_log import Run, read_metrics

__all__ = ["detect_format", "read_run", "KNOWN"]

KNOWN = ("metrics.jsonl, HF Trainer trainer_state.json, TensorBoard event files, Megatron-LM iteration "
         "log lines, MindSpore Transformers MFLossMonitor log lines")
_SNIFF_BYTES = 4 << 20   # text formats are recognised within the first 4 MiB


def detect_format(path: Any, role: str = "metrics") -> tuple[str, Path]:
    """(format key, the file or folder to read); `MigrateError` for a path or format it cannot read."""
    if path is None:
        raise MigrateError(f"no {role} metrics file given")
    p = Path(path)
    if p.is_dir():
        if (p / "metrics.jsonl").is_file():
            return "metrics", p / "metrics.jsonl"
        if (p / "trainer_state.json").is_file():
            return "hf_trainer", p / "trainer_state.json"
        if tensorboard_files(p):
            return "tensorboard", p
        raise MigrateError(f"{p}: a folder without metrics.jsonl, trainer_state.json or TensorBoard event files "
                           f"({role} run)")
    if not p.exists():
        raise MigrateError(f"{p}: no such file ({role} metrics)")
    if p.name.startswith("events.out.tfevents"):
        return "tensorboard", p
    if p.name == "trainer_state.json":
        return "hf_trainer", p
    try:
        with open(p, "rb") as f:
            head = f.read(_SNIFF_BYTES)
    except OSError as e:
        raise MigrateError(f"{p}: cannot read ({e.strerror or e})") from None
    text = head.decode("utf-8", errors="replace")
    lines = text.splitlines()
    if any(MEGATRON_LINE.search(line) for line in lines):
        return "megatron", p
    if any(MINDFORMERS_LINE.search(line) for line in lines):
        return "mindformers", p
    first = next((line.strip() for line in lines if line.strip()), "")
    if first.startswith("{") and '"log_history"' in text:
        return "hf_trainer", p
    if first.startswith("{") or not first or not _is_utf8(head):
        return "metrics", p   # metrics.jsonl; its reader names any bad line (or the bytes that are not UTF-8)
    raise MigrateError(f"{p}: unknown log format ({role} run): compare reads {KNOWN}")


def _is_utf8(head: bytes) -> bool:
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as e:
        return len(head) == _SNIFF_BYTES and e.start >= len(head) - 3   # a character cut by the sniffing limit
    return True


_READERS = {"metrics": lambda p, role: read_metrics(p, role), "hf_trainer": read_hf_trainer_state,
            "tensorboard": read_tensorboard, "megatron": read_megatron, "mindformers": read_mindformers}


def read_run(path: Any, role: str = "metrics") -> Run:
    """Detect the format of ``path`` and read it into a `Run` (its ``format`` says which)."""
    fmt, p = detect_format(path, role)
    return _READERS[fmt](p, role)
