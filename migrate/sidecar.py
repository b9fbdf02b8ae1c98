"""Files that travel beside the weights unchanged (tokenizer, generation config)."""
from __future__ import annotations

import shutil
from pathlib import Path

SIDECAR_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
    "vocab.json", "merges.txt", "added_tokens.json", "generation_config.json",
)


def copy_sidecars(src: Path, dst: Path) -> list[str]:
    copied = []
    for name in SIDECAR_FILES:
        if (Path(src) / name).is_file():
            shutil.copy2(Path(src) / name, Path(dst) / name)
            copied.append(name)
    return copied
