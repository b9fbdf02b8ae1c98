"""Fused CPU kernels of the MindSpore trainer, built from their C++ source when first needed.

`adamw_op()` is MindSpore's ops.Custom over adamw.cc (one pass per tensor instead of fourteen
element-wise kernels and the clip's passes; bit for bit the same numbers), or None where it cannot be had: not on CPU,
no C++ compiler, a failed build, or MIGRATE_FUSED_ADAMW=off. The trainer then runs the op-by-op
graph (migrate/train/optim.py), which computes the same bits more slowly.

The library is built once per source and compiler flags into the user's cache
($MIGRATE_CACHE_DIR/kernels or ~/.cache/migrate/kernels), under a temporary name renamed into
place, so concurrent first uses never see half a file; `make install` builds it ahead.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path

SOURCE = Path(__file__).with_name("adamw.cc")
FLAGS = ("-O3", "-ffp-contract=off", "-fno-math-errno", "-fopenmp", "-fPIC", "-shared")
ENV_SWITCH = "MIGRATE_FUSED_ADAMW"
SYMBOL = "MigrateAdamW"


def kernel_dir() -> Path:
    if os.environ.get("MIGRATE_CACHE_DIR"):
        return Path(os.environ["MIGRATE_CACHE_DIR"]) / "kernels"
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "migrate" / "kernels"


def compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")


def build() -> Path | None:
    """The compiled library (built now if absent), or None with no compiler or a failed build."""
    cxx = compiler()
    if cxx is None:
        return None
    digest = hashlib.sha256(SOURCE.read_bytes() + " ".join((cxx, *FLAGS)).encode()).hexdigest()[:16]
    target = kernel_dir() / f"adamw-{digest}.so"
    if target.is_file():
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            partial = Path(tmp) / target.name
            done = subprocess.run([cxx, *FLAGS, "-o", str(partial), str(SOURCE)], capture_output=True, timeout=300)
            if done.returncode != 0 or not partial.is_file():
                return None
            os.replace(partial, target)
    except (OSError, subprocess.SubprocessError):
        return None
    return target


def wanted() -> bool:
    return os.environ.get(ENV_SWITCH, "").strip().lower() not in ("off", "0", "false", "no")


@cache
def _custom_op(library: str):
    import mindspore as ms
    from mindspore import ops

    # param, exp_avg, exp_avg_sq (and, asked, grad) are written in place (adamw.cc); the output is the
    # gradient's sum of squares, one element
    return ops.Custom(f"{library}:{SYMBOL}", out_shape=lambda *shapes: (1,), out_dtype=lambda *dtypes: ms.float32,
                      func_type="aot")


def adamw_op():
    """ops.Custom running adamw.cc, or None (module docstring: when)."""
    import mindspore as ms

    if not wanted() or ms.get_context("device_target") != "CPU":
        return None
    library = build()
    return None if library is None else _custom_op(str(library))

