"""MindSpore's compile cache for `migrate generate`: a second run of the same model starts in seconds.

A GRAPH_MODE generate compiles two graphs (prefill and decode step) before its first token: most of
a cold run on CPU (a 30-layer model: tens of seconds). MindSpore can keep compiled graphs on disk
(MS_COMPILER_CACHE_ENABLE and MS_COMPILER_CACHE_PATH, which MindSpore 2.10 reads at each compile and
names as the replacement of `set_context(enable_compile_cache=...)`, deprecated), but it keys them by the network's
source, not its shapes or config: a cache written by one model serves another of the same class
wrongly (docs/DESIGN.md: different losses, a crash). So each cache folder holds the graphs of one
thing only, named by a fingerprint of everything the graphs depend on: the model config
(model.yaml's fields), the compute dtype, the runner's static shapes (batch, prefill length, cache
slots), the MindSpore version, and the source of migrate's model and runner code. The weights are
not in it: graphs take them as parameters (measured: a model with other weights and the same config
generates its own tokens from the first model's cache, token for token as without one).

MindSpore reads the cache path once per process, at the first compile that uses it; a second path
later in the same process is not honoured. So the cache is used only where the process has set no
other: `migrate generate` from the command line (one model per process). Library callers and tests
pass `compile_cache=None` (the default), and MIGRATE_COMPILE_CACHE=off turns the CLI's off.

To keep shapes stable from run to run, a cached run pads the prompt to a multiple of PREFILL_BUCKET
(left padding, masked: the same tokens) and the cache to a multiple of CACHE_BUCKET slots.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
from contextlib import contextmanager
from pathlib import Path

ENV_SWITCH = "MIGRATE_COMPILE_CACHE"   # "off": no compile cache
ENV_ROOT = "MIGRATE_CACHE_DIR"         # where the caches live (default: $XDG_CACHE_HOME/migrate or ~/.cache/migrate)
PREFILL_BUCKET = 32
CACHE_BUCKET = 64
# the code the graphs are built from (the decode kernels' source too: a graph names their library)
_SOURCES = ("models", "infer/runners.py", "infer/generate.py", "infer/kernel_decode.py", "infer/decode_layer.cc")

_path_in_use: Path | None = None      # the one cache path MindSpore honours in this process
_CACHE_ENV = ("MS_COMPILER_CACHE_ENABLE", "MS_COMPILER_CACHE_PATH")


def wanted() -> bool:
    return os.environ.get(ENV_SWITCH, "").strip().lower() not in ("off", "0", "false", "no")


def cache_root() -> Path:
    if os.environ.get(ENV_ROOT):
        return Path(os.environ[ENV_ROOT]) / "compile"
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "migrate" / "compile"


def bucketed(length: int, bucket: int) -> int:
    return -(-length // bucket) * bucket


def _source_digest() -> str:
    package = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256()
    for entry in _SOURCES:
        path = package / entry
        for file in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            digest.update(file.relative_to(package).as_posix().encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()


def fingerprint(model_fields: dict, *, dtype: str, runner: str, batch: int, prefill_len: int, cache_len: int) -> str:
    """The name of the one cache folder these graphs may use (module docstring: what it covers)."""
    import mindspore as ms

    key = {"model": model_fields, "dtype": dtype, "runner": runner, "batch": batch, "prefill_len": prefill_len,
           "cache_len": cache_len, "mindspore": ms.__version__, "code": _source_digest()}
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:20]


@contextmanager
def compile_cache(folder: Path | None):
    """MindSpore's compile cache in `folder` while the block compiles and runs; yields what happened
    ("hit": graphs were there, "stored": compiled and kept, "off": no cache, or why not)."""
    global _path_in_use
    if folder is None:
        yield "off"
        return
    folder = Path(folder)
    if _path_in_use is not None and _path_in_use != folder:
        yield "off (this process already caches another model's graphs)"
        return
    if not (sys.argv and os.path.isfile(sys.argv[0])):
        # MindSpore keys the cache by the entry script's source and opens it at the first compile: under
        # `python -c` (argv[0] "-c") that compile fails with a FileNotFoundError for "./-c"
        yield "off (MindSpore's cache needs the entry script's file, and this process runs none)"
        return
    had = folder.is_dir() and any(folder.iterdir())
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        yield f"off (cannot write {folder}: {exc.strerror})"
        return
    before = {name: os.environ.get(name) for name in _CACHE_ENV}
    os.environ.update({"MS_COMPILER_CACHE_ENABLE": "1", "MS_COMPILER_CACHE_PATH": str(folder)})
    _path_in_use = folder
    try:
        yield "hit" if had else "stored"
    finally:
        for name, value in before.items():  # graphs compiled after this block are not cached
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
