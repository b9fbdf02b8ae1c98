"""The files each msrun worker leaves in the run's log folder: its exit code and its pid.

msrun itself reports only that some worker failed; these let the launcher
(`migrate.train.launch.msrun`) name the rank, its code or the signal that killed it.
"""
from __future__ import annotations

from pathlib import Path

from migrate.checkpoints.atomic import atomic_write_text


def exit_file(log_dir: str | Path, rank: int) -> Path:
    return Path(log_dir) / f"worker_{rank}.exit"


def pid_file(log_dir: str | Path, rank: int) -> Path:
    return Path(log_dir) / f"worker_{rank}.pid"


def record_exit(log_dir: str | Path, rank: int, code: int) -> None:
    atomic_write_text(exit_file(log_dir, rank), f"{code}\n")


def record_pid(log_dir: str | Path, rank: int, pid: int) -> None:
    atomic_write_text(pid_file(log_dir, rank), f"{pid}\n")
