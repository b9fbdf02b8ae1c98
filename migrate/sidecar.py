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


def sidecars(src: Path) -> list[Path]:
    """The sidecar files of `src`, each checked to lie inside it (MigrateError otherwise)."""
    folder = ModelFolder(src)
    return [folder.file(name, name) for name in SIDECAR_FILES if (Path(src) / name).is_file()]


def copy_sidecars(src: Path, dst: Path) -> list[str]:
    copied = []
    for path in sidecars(src):  # all checked before the first is copied
        shutil.copy2(path, Path(dst) / path.name)
        copied.append(path.name)
    return copied
