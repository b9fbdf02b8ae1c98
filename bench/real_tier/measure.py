"""Run one command as a child process and measure it: exit code, wall time, peak RSS, output.

Peak RSS is the child's own VmHWM, read from /proc/<pid>/status while it runs (every 50 ms;
VmHWM only grows, so the last reading before exit is the peak up to those last 50 ms). Not
ru_maxrss: the kernel carries the parent's high-water mark into a child spawned across exec
(bench/harness.py, migrate/memory_plan_measure.py), so a child of a big pytest process would read at
least as big as its parent. Only the process itself is measured, not processes it starts.
"""
from __future__ import annotations

import os
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

POLL_SECONDS = 0.05  # VmHWM is a high-water mark: sampling it rarely loses only the last 50 ms


@dataclass
class Measured:
    argv: list[str]
    exit_code: int
    wall_s: float
    peak_rss: int | None  # bytes; None where /proc could not be read
    stdout: str
    stderr: str
    timed_out: bool = False


def vm_hwm(pid: int) -> int | None:
    """A live process's peak resident memory (VmHWM) in bytes; None once it is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


class _Watcher(threading.Thread):
    """Samples the child's VmHWM, and kills the child at its deadline. The parent meanwhile
    blocks in waitpid: on a busy 2-core machine, a polling wait would take CPU from the child."""

    def __init__(self, proc: subprocess.Popen, timeout: float | None):
        super().__init__(daemon=True)
        self.proc, self.peak, self.timed_out = proc, None, False
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self._done = threading.Event()

    def run(self):
        while not self._done.is_set():
            value = vm_hwm(self.proc.pid)
            if value is not None:
                self.peak = max(self.peak or 0, value)
            if self.deadline is not None and time.monotonic() > self.deadline:
                self.timed_out = True
                self.proc.kill()
                return
            self._done.wait(POLL_SECONDS)

    def stop(self) -> None:
        self._done.set()
        self.join()


def run_measured(argv: list[str], *, env: dict | None = None, cwd: Path | None = None,
                 timeout: float | None = None) -> Measured:
    """Run `argv` to completion (killed after `timeout` seconds) and measure it."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        started = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=out, stderr=err, env=env, cwd=cwd, stdin=subprocess.DEVNULL)
        watcher = _Watcher(proc, timeout)
        watcher.start()
        proc.wait()
        wall = time.perf_counter() - started
        watcher.stop()
        out.seek(0), err.seek(0)
        return Measured(list(map(str, argv)), proc.returncode, wall, watcher.peak,
                        out.read().decode(errors="replace"), err.read().decode(errors="replace"), watcher.timed_out)


def child_env(**extra: str) -> dict:
    """The environment every step runs in: offline, quiet, unbuffered."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HUB_DISABLE_PROGRESS_BARS="1", TRANSFORMERS_VERBOSITY="error",
               GLOG_v="3", PYTHONUNBUFFERED="1")
    env.update(extra)
    return env
