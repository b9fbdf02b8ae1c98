"""Which files a model folder may name: its own, never one elsewhere.

A model folder is untrusted input: an index entry, a weights file or a tokenizer
file that leads outside it (`../x`, an absolute name, a link to `/etc/...`) is
refused, so converting a folder someone sent cannot read, or copy into the output,
a file of the user's. One exception, because it is where most real models live:
the Hugging Face hub cache keeps a model as `models--ORG--NAME/snapshots/REV/`,
whose files are links to `../../blobs/SHA256`. A folder inside such a snapshot may
also name files anywhere inside its `models--*` folder, and nowhere else.
"""
from __future__ import annotations

from pathlib import Path, PurePosixPath

from migrate.errors import MigrateError


class ModelFolder:
    def __init__(self, folder: str | Path):
        self.path = Path(folder)
        self.real = _resolve(self.path)
        self.cache_repo = hub_cache_repo(self.real)
        self.roots = (self.real,) + ((self.cache_repo,) if self.cache_repo else ())

    def file(self, name: str, named_by: str) -> Path:
        """`name` (relative to the folder, as an index spells it, or a fixed file name:
        then `named_by` is `name`), refused when it leads outside. The path is returned as named, not resolved, so
        messages and records show `model-00001-of-00002.safetensors`, not a blob hash."""
        rel = PurePosixPath(str(name))
        if rel.is_absolute() or Path(str(name)).is_absolute() or ".." in rel.parts:
            raise MigrateError(f"{named_by} names a file outside the model folder: {name}")
        path = self.path / rel
        real = _resolve(path)
        if not any(real == root or root in real.parents for root in self.roots):
            if named_by == name:  # a fixed name (model.safetensors, tokenizer.json)
                raise MigrateError(f"{name} is a link to a file outside the model folder: {real}")
            raise MigrateError(f"{named_by} names a file outside the model folder: {name} (a link to {real})")
        return path


def hub_cache_repo(real: Path) -> Path | None:
    """The `models--*` folder of the hub cache that holds `real` inside one of its
    snapshots (`models--ORG--NAME/snapshots/REV[/sub]`), or None."""
    for folder in (real, *real.parents):
        snapshots = folder.parent
        repo = snapshots.parent
        if snapshots.name == "snapshots" and repo.name.startswith("models--") and (repo / "blobs").is_dir():
            return repo
    return None


def _resolve(path: Path) -> Path:
    try:
        return path.resolve()
    except (OSError, RuntimeError) as exc:  # a link loop (RuntimeError before Python 3.13)
        raise MigrateError(f"cannot resolve {path}: {exc}") from None
