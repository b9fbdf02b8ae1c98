"""Which log a path is, and reading it into a `Run`: `read_run(path, role)`.

Derived from the registry (`log_formats.FORMATS`, each format declared beside its reader): a path
-- a file or a run folder -- goes to the first format, by ``rank``, whose ``sniff`` claims it, else
to one whose ``fallback`` does. Folders: ``metrics.jsonl``, else ``trainer_state.json`` (HF
Trainer's output_dir or one of its checkpoint-N folders), else TensorBoard event files
(``events.out.tfevents.*``). Files: by name (``trainer_state.json``, ``events.out.tfevents.*``),
else by content -- HF's log_history JSON, Megatron-LM iteration lines, MindSpore Transformers
MFLossMonitor lines, or JSON lines (metrics.jsonl, the fallback). Anything else is refused in
one line naming what is read.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

# The modules that declare formats: importing them fills FORMATS (a format in a new module adds
# its import here; one in these modules needs nothing else).
from migrate.compare import foreign_files, foreign_text, metrics_log  # noqa: F401 -- they register
from migrate.compare.log_formats import FORMATS, LogFormat, Sample
from migrate.compare.metrics_log import Run
from migrate.errors import MigrateError

__all__ = ["FORMATS", "detect_format", "read_run", "known", "formats"]


def formats() -> list[LogFormat]:
    """The registered formats in detection order."""
    return sorted(FORMATS.values(), key=lambda f: f.rank)


def known() -> str:
    """What compare reads, for its refusal: 'metrics.jsonl, HF Trainer trainer_state.json, ...'."""
    return ", ".join(f.known or f.title for f in formats())


def _folder_files() -> str:
    names = [f.folder for f in formats() if f.folder]
    return ", ".join(names[:-1]) + " or " + names[-1] if len(names) > 1 else "".join(names)


def detect_format(path: Any, role: str = "metrics") -> tuple[str, Path]:
    """(format key, the file or folder to read); `MigrateError` for a path or format it cannot read."""
    if path is None:
        raise MigrateError(f"no {role} metrics file given")
    p = Path(path)
    sample = Sample(p)
    if not sample.is_dir and not p.exists():
        raise MigrateError(f"{p}: no such file ({role} metrics)")
    if not sample.is_dir and not p.is_file():  # a FIFO blocked compare forever on open(); a device never ends
        raise MigrateError(f"{p}: not a regular file or folder ({role} metrics)")
    for claims in ("sniff", "fallback"):
        hits = []
        for fmt in formats():
            sniff = getattr(fmt, claims)
            hit = sniff(sample) if sniff is not None else None
            if hit:
                hits.append((fmt, hit if isinstance(hit, Path) else p))
                if sample.is_dir:
                    break  # a folder holding several formats' files reads the lowest rank's (by design)
        if len(hits) > 1:
            # One file holding two formats' lines (two logs concatenated, tee'd output): reading either
            # would judge a curve that is half another run's.
            raise MigrateError(f"{p}: holds {' and '.join(f.known or f.title for f, _ in hits)}; compare reads "
                               f"one format per file, split it ({role} run)")
        if hits:
            return hits[0][0].key, hits[0][1]
    if sample.is_dir:
        raise MigrateError(f"{p}: a folder without {_folder_files()} ({role} run)")
    raise MigrateError(f"{p}: unknown log format ({role} run): compare reads {known()}")


def read_run(path: Any, role: str = "metrics") -> Run:
    """Detect the format of ``path`` and read it into a `Run` (its ``format`` says which)."""
    key, p = detect_format(path, role)
    return FORMATS[key].read(p, role)
