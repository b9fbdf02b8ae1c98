"""What the kernel's page cache holds around a bench run: the evidence for why one run of
the same work is slower than another (bench/convert.py prints it per run).

    state = cache_state(files)   # {"src_cached": 0..1, "dirty_mb", "writeback_mb"}
    seconds = timed_sync()       # how long flushing what is dirty now takes
    settle()                     # every timed run starts with its fresh memory in the same state

Linux only (/proc/meminfo, util-linux `fincore`); elsewhere the figures are None.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path


def meminfo_mb(*keys: str) -> dict[str, float | None]:
    """/proc/meminfo fields in MB (None where unreadable)."""
    found: dict[str, float | None] = {k: None for k in keys}
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            name, _, rest = line.partition(":")
            if name in found:
                found[name] = int(rest.split()[0]) / 1024
    except OSError:
        pass
    return found


def cached_fraction(files: list[Path]) -> float | None:
    """Share of the files' bytes resident in the page cache (`fincore`), None if unknown."""
    if not shutil.which("fincore"):
        return None
    proc = subprocess.run(["fincore", "-b", "-n", "-o", "RES,SIZE", *map(str, files)], capture_output=True, text=True)
    if proc.returncode != 0:
        return None
    res = size = 0
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2:
            res, size = res + int(parts[0]), size + int(parts[1])
    return res / size if size else None


def cache_state(files: list[Path]) -> dict[str, float | None]:
    mem = meminfo_mb("Dirty", "Writeback")
    return {"src_cached": cached_fraction(files), "dirty_mb": mem["Dirty"], "writeback_mb": mem["Writeback"]}


# On this machine (a VM) memory the guest frees goes back to the host within about a second, and
# memory the host must back again costs: 2 GiB written into the page cache took 0.51 s right after a
# 2 GiB file was deleted, 2.2-2.8 s one to five seconds after (dd, measured). cp started at once,
# after the previous run's output was deleted, and wrote into the freed pages; a migrate process
# writes a second later, after its imports, into memory the host had taken back. Each timed run
# starts after this pause, so every run meets that state, the one a user's run meets.
SETTLE_S = 3.0


def settle() -> None:
    time.sleep(SETTLE_S)


def timed_sync() -> float:
    started = time.perf_counter()
    os.sync()
    return time.perf_counter() - started


def fmt_state(state: dict) -> str:
    def mb(v):
        return "?" if v is None else f"{v:,.0f}"
    cached = state.get("src_cached")
    return (f"src cached {'?' if cached is None else f'{cached:.0%}':>4} · Dirty {mb(state.get('dirty_mb')):>6} MB"
            f" · Writeback {mb(state.get('writeback_mb')):>5} MB")
