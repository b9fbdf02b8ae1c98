"""Which files a model folder may name: its own, never one elsewhere (`input_folder`'s rule).

A model folder is untrusted input: an index entry, a weights file or a tokenizer
file that leads outside it (`../x`, an absolute name, a link to `/etc/...`) is
refused, so converting a folder someone sent cannot read, or copy into the output,
a file of the user's. One exception, because it is where most real models live:
the Hugging Face hub cache keeps a model as `models--ORG--NAME/snapshots/REV/`,
whose files are links to `../../blobs/SHA256`. A folder inside such a snapshot may
also name files anywhere inside its `models--*` folder, and nowhere else.
"""
from __future__ import annotations

from pathlib import Path

from migrate.checkpoints.input_folder import InputFolder, resolve


class ModelFolder(InputFolder):
    def __init__(self, folder: str | Path):
        real = resolve(Path(folder))
        self.cache_repo = hub_cache_repo(real)
        super().__init__(folder, "model folder", (self.cache_repo,) if self.cache_repo else ())

    def file(self, name: str, named_by: str) -> Path:
        """`name` (relative to the folder, as an index spells it, or a fixed file name:
        then `named_by` is `name`), refused when it leads outside; whether it exists is the caller's."""
        return self.member(name, named_by, must_exist=False)


def hub_cache_repo(real: Path) -> Path | None:
    """The `models--*` folder of the hub cache that holds `real` inside one of its
    snapshots (`models--ORG--NAME/snapshots/REV[/sub]`), or None."""
    for folder in (real, *real.parents):
        snapshots = folder.parent
        repo = snapshots.parent
        if snapshots.name == "snapshots" and repo.name.startswith("models--") and (repo / "blobs").is_dir():
            return repo
    return None
