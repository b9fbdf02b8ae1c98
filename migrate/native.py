"""The project's C++ kernels, built from their source into the user's cache when first needed.

One library per source and compiler flags ($MIGRATE_CACHE_DIR/kernels or ~/.cache/migrate/kernels),
built under a temporary name and renamed into place, so concurrent first uses never see half a file.
`build` answers None where no C++ compiler is found or the build fails: every caller has a slower
path that computes the same figures. `python -m migrate.native` (`make install`) builds them ahead.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
# Every kernel, and what runs without it
KERNELS = {
    PACKAGE / "train" / "kernels" / "adamw.cc": "the trainer's fused AdamW (else its op-by-op AdamW)",
    PACKAGE / "judge" / "pair_sums.cc": "diff's one-pass tensor figures (else numpy's passes)",
    PACKAGE / "infer" / "decode_layer.cc": "generate's decode kernels, one per layer (else the op-by-op step)",
    PACKAGE / "models" / "fused_ops.cc": "the models' fused RMSNorm, rotary and softmax gradient (else op by op)",
}
# No -ffast-math: the kernels keep IEEE rounding and NaN/Inf semantics; no FMA contraction, so a
# kernel rounds each operation the way the op-by-op code it replaces does. No -march=native either:
# the vector width fixes how a vectorised sum is grouped, so every x86-64 machine sums alike (a dump
# made on one box is diffed on another). A kernel that wants wider vectors says so per function
# (decode_layer.cc: target_clones of AVX2 and the baseline, each summing in the same groups).
FLAGS = ("-std=c++17", "-O3", "-ffp-contract=off", "-fno-math-errno", "-fopenmp", "-fPIC", "-shared")


def kernel_dir() -> Path:
    if os.environ.get("MIGRATE_CACHE_DIR"):
        return Path(os.environ["MIGRATE_CACHE_DIR"]) / "kernels"
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "migrate" / "kernels"


def compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")


def build(source: Path) -> Path | None:
    """`source` compiled to a shared library (now, if absent), or None with no compiler or a failed build."""
    cxx = compiler()
    if cxx is None:
        return None
    digest = hashlib.sha256(source.read_bytes() + " ".join((cxx, *FLAGS)).encode()).hexdigest()[:16]
    target = kernel_dir() / f"{source.stem}-{digest}.so"
    if target.is_file():
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            partial = Path(tmp) / target.name
            done = subprocess.run([cxx, *FLAGS, "-o", str(partial), str(source)], capture_output=True, timeout=300)
            if done.returncode != 0 or not partial.is_file():
                return None
            os.replace(partial, target)
    except (OSError, subprocess.SubprocessError):
        return None
    return target


def switched_off(variable: str) -> bool:
    """An environment switch set to off / 0 / false / no."""
    return os.environ.get(variable, "").strip().lower() in ("off", "0", "false", "no")


if __name__ == "__main__":   # `make install`: build every kernel ahead, say which the tools will use
    for source, use in KERNELS.items():
        built = build(source)
        print(f"{use}: {built}" if built else f"{use}: not built (no C++ compiler or the build failed)")
