"""Is this training checkpoint the one that was written? (MindSpore-free, beside the readers: export and
inspect call it through `migrate.checkpoints.ms_reader`.)

Every checkpoint of format version 2 on carries manifest.json (sizes and sha256
of all its files, `migrate.checkpoints.manifest`), written last inside its
temporary folder. Resume, `migrate ckpt merge` and every reader of the folder as
a model (`migrate export`, `load_model`, `inspect`) verify it first and refuse a
damaged checkpoint in one line naming the file.

A version-1 checkpoint (written before manifests existed) has none: it is read
with one warning line on stderr, since nothing can tell whether it is intact.
A version-2 checkpoint without its manifest is refused: the manifest is part of it.
"""
from __future__ import annotations

import sys
from pathlib import Path

from migrate.checkpoints.manifest import MANIFEST_FILE, verify_manifest
from migrate.errors import MigrateError
from migrate.jsonsafe import load_json

STATE_FILE = "trainer_state.json"
FORMAT = "migrate-train-checkpoint"
VERSION = 2
MANIFEST_SINCE = 2  # the first format version that writes manifest.json
_warned: set[str] = set()


def is_training_checkpoint(folder: str | Path) -> bool:
    folder = Path(folder)
    return (folder / STATE_FILE).is_file() or (folder / MANIFEST_FILE).is_file()


def verify_checkpoint(folder: str | Path) -> None:
    """Refuse a damaged training checkpoint (one MigrateError line naming each damaged file);
    warn once per process about an old one that has no manifest. A folder that is no
    training checkpoint (a converted model) passes untouched."""
    folder = Path(folder)
    if (folder / MANIFEST_FILE).exists() or (folder / MANIFEST_FILE).is_symlink():
        verify_manifest(folder)
        return
    if not (folder / STATE_FILE).is_file():
        return
    version = _state_version(folder)
    if version is None:
        return  # someone else's trainer_state.json (HF Trainer writes one too): not ours to judge
    if version >= MANIFEST_SINCE:
        raise MigrateError(f"{folder} is damaged: {MANIFEST_FILE} missing (every checkpoint of format version "
                           f"{MANIFEST_SINCE} on has one; this is version {version})")
    key = str(folder.resolve())
    if key not in _warned:
        _warned.add(key)
        print(f"migrate: warning: {folder} has no {MANIFEST_FILE} (checkpoint format {version}, from an older "
              f"migrate): its files cannot be checked for damage", file=sys.stderr, flush=True)


def _state_version(folder: Path) -> int | None:
    """The format version of a migrate trainer_state.json; None for another tool's file."""
    try:
        state = load_json(folder / STATE_FILE)
    except (OSError, ValueError):
        raise MigrateError(f"{folder} is damaged: unreadable {STATE_FILE} and no {MANIFEST_FILE} "
                           f"to check it against") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        return None
    version = state.get("version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise MigrateError(f"{folder} is damaged: {STATE_FILE} has no format version")
    return version
