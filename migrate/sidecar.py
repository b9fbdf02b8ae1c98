"""Files that travel beside the weights unchanged (tokenizer, generation config).

They are copied byte for byte into an output the user may share, so a sidecar that
is a link to a file outside the model folder (`tokenizer.json -> ~/.ssh/id_rsa`) is
refused, not copied and not skipped: the rule of index entries (`ModelFolder`),
links inside a hub cache repository allowed.
"""
from __future__ import annotations

import shutil
from pathlib import Path

from migrate.checkpoints.model_folder import ModelFolder

# What transformers' tokenizers and `generate` read from a model folder: fast and slow tokenizer
# files (BPE vocab.json + merges.txt, WordPiece vocab.txt, sentencepiece tokenizer.model), the
# chat template transformers 5 writes beside tokenizer_config.json, and the generation defaults.
SIDECAR_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
    "vocab.json", "merges.txt", "vocab.txt", "added_tokens.json", "chat_template.jinja", "chat_template.json",
    "generation_config.json",
)


# Folders of such files: transformers 5 writes each named chat template as additional_chat_templates/NAME.jinja.
SIDECAR_DIRS = ("additional_chat_templates",)


def _names(src: Path) -> list[str]:
    names = [name for name in SIDECAR_FILES if (src / name).is_file()]
    for folder in SIDECAR_DIRS:
        if (src / folder).is_dir():
            names += sorted(f"{folder}/{p.name}" for p in (src / folder).iterdir() if p.is_file())
    return names


def _checked(src: Path) -> list[tuple[str, Path]]:
    folder = ModelFolder(src)
    return [(name, folder.file(name, name)) for name in _names(Path(src))]


def sidecars(src: Path) -> list[Path]:
    """The sidecar files of `src`, each checked to lie inside it (MigrateError otherwise): a file of a
    sidecar folder too, so a folder linking outside is refused as a file would be."""
    return [path for _, path in _checked(src)]


def copy_sidecars(src: Path, dst: Path) -> list[str]:
    """Copies the sidecars to the same names under `dst`; returns those names."""
    checked = _checked(src)  # all checked before the first is copied
    for name, path in checked:
        (Path(dst) / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, Path(dst) / name)
    return [name for name, _ in checked]
