"""`migrate data tokenize`: text files -> fixed-length token rows, written
twice: `train.mindrecord` for MindSpore's MindDataset and `train.npy` for the
golden PyTorch side, plus `data.json` describing how they were made.

Convention: files are read in sorted path order, each file is one document,
UTF-8 text (a file over 10 % control characters is refused as not text),
tokenized by the HF tokenizer without its automatic special tokens, then
followed by EOS (and preceded by BOS when `add_bos`). Documents are
concatenated and cut into rows of seq_length + 1 tokens (model input row[:-1],
target row[1:]; see migrate.data.samples); the tail shorter than a row is
dropped. The whole folder appears at once (built under a temporary name).
"""
from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from migrate.checkpoints.atomic import atomic_output_dir
from migrate.data.samples import META_FILE, MINDRECORD_FILE, SAMPLES_FILE
from migrate.errors import MigrateError

FORMAT_VERSION = 1
# Unicode's control characters (Cc) but tab, newline, vertical tab, form feed, carriage return.
_CONTROL = re.compile(r"[\x00-\x08\x0e-\x1f\x7f-\x9f]")
# Text has almost none (a coloured log, its escape codes: a few %); a file over this share is not text.
MAX_CONTROL_SHARE = 0.1
_WRITE_CHUNK = 1024  # rows per FileWriter.write_raw_data call


def tokenize_corpus(files: Iterable[str | Path], tokenizer_dir: str | Path, seq_length: int,
                    out_dir: str | Path, add_bos: bool = False, overwrite: bool = False) -> dict:
    """Tokenize `files` into `out_dir`; returns the data.json contents."""
    if seq_length < 1:
        raise MigrateError(f"seq_length must be >= 1, got {seq_length}")
    paths = sorted({Path(f) for f in files}, key=str)
    if not paths:
        raise MigrateError("no text files to tokenize")
    for path in paths:
        if not path.is_file():
            raise MigrateError(f"no text file at {path}")
    if Path(out_dir).exists() and not overwrite:  # fail before the slow part
        raise MigrateError(f"output {out_dir} already exists (pass --overwrite to replace it)")
    tokenizer = _load_tokenizer(tokenizer_dir)
    eos, bos = tokenizer.eos_token_id, tokenizer.bos_token_id
    if eos is None:
        raise MigrateError(f"tokenizer in {tokenizer_dir} has no eos_token; documents cannot be separated")
    if add_bos and bos is None:
        raise MigrateError(f"tokenizer in {tokenizer_dir} has no bos_token, but add_bos was asked")

    docs, records = [], []
    for path in paths:
        raw = path.read_bytes()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise MigrateError(f"{path} is not UTF-8 text: {exc}") from None
        check_text(path, text)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        doc = ([bos] if add_bos else []) + list(ids) + [eos]
        docs.append(np.asarray(doc, dtype=np.int64))
        records.append({"path": str(path), "sha256": hashlib.sha256(raw).hexdigest(),
                        "bytes": len(raw), "tokens": len(doc)})
    tokens = np.concatenate(docs)
    row = seq_length + 1
    n = len(tokens) // row
    if n == 0:
        raise MigrateError(f"the corpus has {len(tokens)} tokens, fewer than one row of seq_length + 1 = {row}")
    if tokens.max() >= 2**31:
        raise MigrateError("token ids do not fit int32")
    samples = tokens[: n * row].reshape(n, row).astype(np.int32)

    meta = {
        "format": "migrate-tokens", "version": FORMAT_VERSION,
        "layout": "row = seq_length + 1 tokens; input = row[:-1], target = row[1:]",
        "documents": "one per file, sorted by path; EOS after each" + ("; BOS before each" if add_bos else ""),
        "seq_length": seq_length, "samples": n, "dtype": "int32",
        "tokens": int(len(tokens)), "tokens_used": n * row, "tokens_dropped": int(len(tokens) - n * row),
        "eos_token_id": eos, "bos_token_id": bos, "add_bos": add_bos,
        "tokenizer": _tokenizer_record(tokenizer, Path(tokenizer_dir)),
        "files": records,
        "outputs": {"mindrecord": MINDRECORD_FILE, "npy": SAMPLES_FILE},
    }
    with atomic_output_dir(out_dir, overwrite=overwrite) as tmp:
        np.save(tmp / SAMPLES_FILE, samples)
        write_mindrecord(tmp / MINDRECORD_FILE, samples)
        (tmp / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    return meta


def check_text(path: Path, text: str) -> None:
    """Refuse a file that decodes as UTF-8 but is not text: a file of NUL bytes, or
    UTF-16 without its BOM, is valid UTF-8 made of control characters."""
    controls = len(text) - len(_CONTROL.sub("", text))
    if controls > MAX_CONTROL_SHARE * len(text):
        first = _CONTROL.search(text)
        raise MigrateError(f"{path} is not text: {controls:,} of its {len(text):,} characters are control characters "
                           f"(first U+{ord(first.group()):04X} at character {first.start():,}); "
                           f"migrate data tokenize reads UTF-8 text")


def write_mindrecord(path: Path, samples: np.ndarray) -> None:
    """One shard, schema `input_ids: int32 [-1]`, rows in order."""
    from mindspore.mindrecord import FileWriter

    writer = FileWriter(str(path), shard_num=1, overwrite=True)
    writer.add_schema({"input_ids": {"type": "int32", "shape": [-1]}}, "migrate_tokens")
    for start in range(0, len(samples), _WRITE_CHUNK):
        writer.write_raw_data([{"input_ids": r} for r in samples[start:start + _WRITE_CHUNK]])
    writer.commit()


def _load_tokenizer(folder: str | Path):
    from transformers import AutoTokenizer

    if not Path(folder).is_dir():
        raise MigrateError(f"no tokenizer folder at {folder}")
    try:
        return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except Exception as exc:  # transformers raises OSError/ValueError/KeyError for bad folders
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise MigrateError(f"transformers cannot load a tokenizer from {folder}: {first}") from None


def _tokenizer_record(tokenizer, folder: Path) -> dict:
    record = {"path": str(folder.resolve()), "class": type(tokenizer).__name__, "vocab_size": len(tokenizer)}
    spec = folder / "tokenizer.json"
    if spec.is_file():
        record["tokenizer_json_sha256"] = hashlib.sha256(spec.read_bytes()).hexdigest()
    return record
