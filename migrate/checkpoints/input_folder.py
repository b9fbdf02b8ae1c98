"""The reader rule: what a folder migrate reads may name, and how its files are read.

Every folder format migrate reads -- an HF model folder, a converted folder, a dump, a PEFT
adapter, a MindIR export, a run folder, a training checkpoint -- is untrusted input, and its
readers go through `InputFolder`:

- a member a file of the folder names (an index's shard, a dump record's tensors file, a
  MindIR graph) is a relative name without `..`, and lies inside the folder after links are
  resolved (a link to `/etc/passwd` or `../outside` is refused, as is an absolute name); it
  must exist and be a regular file, not a folder. A hard link is an ordinary file of the
  folder, and is read;
- JSON members are read through `migrate.jsonsafe.load_json`: bounded in size and nesting
  depth, refused in one line naming the file (YAML likewise through `migrate.safeyaml`);
- what the index or manifest says about a member (its shape, size, dtype) is checked by the
  format's reader against what the member holds, before it is used.

Every refusal is one MigrateError line. `ModelFolder` (an HF folder, which may also name files
inside the hub cache repository holding it) is this rule with one more root.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path, PurePosixPath
from typing import Any

from migrate.errors import MigrateError
from migrate.jsonsafe import MAX_JSON_BYTES, load_json
from migrate.safeyaml import clip, quote


class InputFolder:
    """A folder migrate reads. `what` names it in messages ("dump", "MindIR export", ...); `roots`:
    folders besides this one its members may lead into (the hub cache repository of a snapshot)."""

    def __init__(self, folder: str | Path, what: str = "folder", roots: tuple[Path, ...] = ()):
        self.path = Path(folder)
        self.what = what
        self.real = resolve(self.path)
        self.roots = (self.real, *roots)

    def member(self, name: Any, named_by: str, must_exist: bool = True) -> Path:
        """The path of member `name` as `named_by` spells it (a fixed file name: then `named_by` is
        `name`), refused when it is not a relative name inside the folder, or (with `must_exist`)
        when it is missing or not a regular file. The path is returned as named, not resolved, so
        messages show `model-00001-of-00002.safetensors`, not a blob hash."""
        if not isinstance(name, str) or not name or "\0" in name:
            raise MigrateError(f"{named_by} names {quote(name)}, not a file name")
        rel = PurePosixPath(name)
        if rel.is_absolute() or Path(name).is_absolute() or ".." in rel.parts:
            raise MigrateError(f"{named_by} names a file outside the {self.what}: {clip(name)}")
        path = self.path / rel
        real = resolve(path)
        if not any(real == root or root in real.parents for root in self.roots):
            if named_by == name:
                raise MigrateError(f"{name} is a link to a file outside the {self.what}: {real}")
            raise MigrateError(f"{named_by} names a file outside the {self.what}: {clip(name)} (a link to {real})")
        if must_exist:
            try:
                mode = path.stat().st_mode
            except OSError:
                raise MigrateError(f"{named_by} names {name}, which is not in {self.path}") from None
            if not stat.S_ISREG(mode):
                kind = "a folder" if stat.S_ISDIR(mode) else "a FIFO, device or socket"
                if named_by == name:
                    raise MigrateError(f"{path} is {kind}, not a file")
                raise MigrateError(f"{named_by} names {name}, which is {kind} in {self.path}, not a file")
        return path

    def optional(self, name: str) -> Path | None:
        """Member `name` (a fixed file name) when the folder has one, under the rule (inside, a regular
        file); None when there is none. A folder or a FIFO under that name is refused, not skipped."""
        return self.member(name, name) if os.path.lexists(self.path / name) else None

    def json(self, name: str, named_by: str | None = None, expect: type | tuple[type, ...] | None = None,
             max_bytes: int = MAX_JSON_BYTES) -> Any:
        """Member `name` read as bounded JSON (`jsonsafe.load_json`), of type `expect` at the top."""
        path = self.member(name, named_by or name)
        return load_json(path, expect=expect, max_bytes=max_bytes)


def resolve(path: Path) -> Path:
    try:
        return path.resolve()
    except (OSError, RuntimeError) as exc:  # a link loop (RuntimeError before Python 3.13)
        raise MigrateError(f"cannot resolve {path}: {exc}") from None
