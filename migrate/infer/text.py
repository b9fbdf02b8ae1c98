"""Prompts in, text out: the folder's tokenizer (the files `convert` copies beside the weights).

    tokenizer = load_tokenizer(folder)            # None when the folder has none
    prompts = encode_prompts(["Hello"], [], tokenizer, folder)
    stream = TextStream(tokenizer, write)          # stream.push(token) prints what became readable
"""
from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from migrate.errors import MigrateError
from migrate.hf_config import transformers_version
from migrate.jsonsafe import load_json

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


# AutoTokenizer's module imports every model config and, through them, torch: about 3 s of a `migrate generate`
# process that needs no torch (SmolLM2's tokenizer: 4.1 s through AutoTokenizer, 1.3 s through its class).
# Where AutoTokenizer would choose transformers' generic fast class anyway, that class is loaded directly:
# transformers 5, a tokenizer_config.json naming a generic class and no code of its own, and a model type for
# which AutoTokenizer keeps the named class: none (a converted folder has no config.json), or one it neither
# corrects nor gives Mistral's own backend (tests/test_tokenizer_load.py checks each against AutoTokenizer).
# Everything else goes through AutoTokenizer.
GENERIC_CLASSES = frozenset({"TokenizersBackend", "PreTrainedTokenizerFast"})
DIRECT_MODEL_TYPES = frozenset({"", "llama", "qwen3", "gpt2", "gemma", "bert"})  # qwen2: AutoTokenizer corrects it


def direct_class_name(folder: Path) -> str | None:
    """The generic class AutoTokenizer would load for this folder, when that is certain without it; else None."""
    if transformers_version()[0] < 5:
        return None
    try:
        tokenizer_config = load_json(folder / "tokenizer_config.json", expect=dict)
        # a converted folder has no config.json: AutoTokenizer then sees no model type and keeps the named class
        model_config = load_json(folder / "config.json", expect=dict) if (folder / "config.json").exists() \
            else {"model_type": ""}
    except (OSError, MigrateError):
        return None  # AutoTokenizer says what is wrong, in its words
    name = tokenizer_config.get("tokenizer_class")
    if name not in GENERIC_CLASSES or "auto_map" in tokenizer_config or "auto_map" in model_config \
            or model_config.get("model_type") not in DIRECT_MODEL_TYPES:
        return None
    return "TokenizersBackend"


def load_tokenizer(folder):
    """The folder's tokenizer as AutoTokenizer loads it (local files only), or None when it holds no tokenizer."""
    folder = Path(folder)
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        return None
    try:
        direct = direct_class_name(folder)
        if direct is not None:
            import transformers

            return getattr(transformers, direct).from_pretrained(str(folder), local_files_only=True)
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except Exception as exc:
        raise MigrateError(f"cannot load the tokenizer in {folder}: {str(exc).strip().splitlines()[0]}") from None


def parse_ids(text: str) -> list[int]:
    """'1,2,3' or '1 2 3' -> [1, 2, 3]; an empty entry ('1,,2', '1,') is refused, not skipped:
    a dropped id would silently change the prompt. Each id is written in ASCII digits: int() would
    also read '+1', '1_000' and other scripts' digits, none of which is a token id someone meant."""
    pieces = [p.strip() for p in text.split(",")]
    parts = [q for p in pieces for q in p.split()]
    if parts and all(pieces) and all(re.fullmatch(r"-?[0-9]+", p) for p in parts):
        negative = [p for p in parts if p.startswith("-")]
        if negative:
            raise MigrateError(f"--ids: token ids are 0 or more, got {negative[0]} in {text!r}"[:200])
        return [int(p) for p in parts]
    raise MigrateError(f"--ids takes token ids separated by commas or spaces, got {text!r}"[:200])


def encode_prompts(texts: list[str], ids: list[str], tokenizer, folder) -> list[list[int]]:
    """--prompt texts through the tokenizer (with its special tokens, as HF pipelines do) and --ids lists."""
    if texts and ids:
        raise MigrateError("give --prompt or --ids, not both")
    if not texts and not ids:
        raise MigrateError("give a prompt: --prompt TEXT or --ids 1,2,3 (repeat either for a batch)")
    if ids:
        return [parse_ids(t) for t in ids]
    if tokenizer is None:
        raise MigrateError(f"--prompt needs a tokenizer, and {folder} holds none; give token ids with --ids")
    return [list(tokenizer(t)["input_ids"]) for t in texts]


def decode(tokenizer, ids) -> str:
    if tokenizer is None:
        return " ".join(str(int(t)) for t in ids)
    return tokenizer.decode([int(t) for t in ids], skip_special_tokens=True)


class TextStream:
    """Writes one row's new text as tokens arrive: the decoded suffix once it is whole (a
    multi-byte character split over tokens waits for its last piece); ids without a tokenizer."""

    def __init__(self, tokenizer, write: Callable[[str], None]):
        self.tokenizer, self.write = tokenizer, write
        self.ids: list[int] = []
        self.shown = ""

    def push(self, token: int) -> None:
        self.ids.append(int(token))
        if self.tokenizer is None:
            self.write(("" if len(self.ids) == 1 else " ") + str(int(token)))
            return
        text = decode(self.tokenizer, self.ids)
        if text.endswith("\ufffd") or not text.startswith(self.shown):
            return
        self.write(text[len(self.shown):])
        self.shown = text

    def close(self) -> None:
        if self.tokenizer is not None:
            text = decode(self.tokenizer, self.ids)
            if text.startswith(self.shown) and len(text) > len(self.shown):
                self.write(text[len(self.shown):])
        self.write("\n")
