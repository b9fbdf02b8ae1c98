"""An offline demo corpus and tokenizer: no download anywhere.

`write_stdlib_corpus` gathers the docstrings of a fixed list of standard-library
modules (one text file per module, members in sorted order), so the text is
the same on every machine with the same Python version. `train_bpe_tokenizer`
trains a byte-level BPE on it with HF `tokenizers` and saves an HF tokenizer
folder that `AutoTokenizer.from_pretrained` loads.
"""
from __future__ import annotations

import importlib
import inspect
from collections.abc import Iterable
from pathlib import Path

from migrate.checkpoints.atomic import atomic_output_dir
from migrate.errors import MigrateError

STDLIB_MODULES = (
    "argparse", "base64", "bisect", "calendar", "collections", "contextlib", "copy", "csv", "dataclasses",
    "datetime", "decimal", "difflib", "enum", "fractions", "functools", "glob", "heapq", "html", "inspect",
    "ipaddress", "itertools", "json", "logging", "os", "pathlib", "pickle", "pprint", "random", "re", "shlex",
    "shutil", "statistics", "string", "subprocess", "tempfile", "textwrap", "threading", "typing", "unittest",
    "urllib.parse", "uuid", "zipfile",
)
SPECIAL_TOKENS = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"}


def module_text(name: str) -> str:
    """The module docstring, then each public member's (and public methods'), sorted by name."""
    module = importlib.import_module(name)
    parts = [f"Module {name}\n\n{inspect.getdoc(module) or ''}"]
    for attr in _public(module):
        obj = getattr(module, attr)
        if not _own(obj, name):
            continue  # re-exports belong to their own module
        doc = inspect.getdoc(obj) if inspect.isclass(obj) or callable(obj) else None
        if doc:
            parts.append(f"{name}.{attr}\n\n{doc}")
        if inspect.isclass(obj):
            for meth in _public(obj):
                member = inspect.getattr_static(obj, meth)
                if not (meth in vars(obj) and callable(member)):
                    continue
                method = getattr(obj, meth)
                # A method another library patched in (transformers adds logging.Logger.info_once on import)
                # is not the module's: the text must not depend on what else was imported.
                mdoc = inspect.getdoc(method) if _own(method, name, missing_ok=True) else None
                if mdoc:
                    parts.append(f"{name}.{attr}.{meth}\n\n{mdoc}")
    return "\n\n".join(parts) + "\n"


def _own(obj, name: str, missing_ok: bool = False) -> bool:
    """Defined in module `name` (or `_name`, its C accelerator); missing_ok: C methods name no module."""
    module = getattr(obj, "__module__", None)
    return module in (name, "_" + name) or (missing_ok and module is None)


def _public(obj) -> list[str]:
    return sorted(n for n in vars(obj) if not n.startswith("_"))


def write_stdlib_corpus(out_dir: str | Path, modules: Iterable[str] = STDLIB_MODULES,
                        overwrite: bool = False) -> list[Path]:
    """One `<module>.txt` per module in out_dir; returns the files, sorted."""
    with atomic_output_dir(out_dir, overwrite=overwrite) as tmp:
        for name in modules:
            (tmp / f"{name}.txt").write_text(module_text(name), encoding="utf-8")
    return sorted(Path(out_dir).glob("*.txt"))


def train_bpe_tokenizer(text_files: Iterable[str | Path], vocab_size: int, out_dir: str | Path,
                        overwrite: bool = False) -> Path:
    """Byte-level BPE (GPT-2 style, every byte reachable) saved as an HF tokenizer folder."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    files = [str(f) for f in sorted({Path(f) for f in text_files}, key=str)]
    if not files:
        raise MigrateError("no text files to train a tokenizer on")
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if vocab_size < len(alphabet) + len(SPECIAL_TOKENS):
        raise MigrateError(f"vocab_size must be at least {len(alphabet) + len(SPECIAL_TOKENS)} "
                           f"(256 bytes + special tokens), got {vocab_size}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS.values()),
                                  initial_alphabet=alphabet, show_progress=False)
    tok.train(files, trainer)
    with atomic_output_dir(out_dir, overwrite=overwrite) as tmp:
        PreTrainedTokenizerFast(tokenizer_object=tok, **SPECIAL_TOKENS).save_pretrained(str(tmp))
    return Path(out_dir)
