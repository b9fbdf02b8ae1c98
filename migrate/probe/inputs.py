"""The inputs both frameworks see: seeded token ids or tokenized text, optionally
left-padded so the padding mask is exercised."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from migrate.errors import MigrateError
from migrate.resources import need_memory

IGNORE_INDEX = -100


@dataclass
class Inputs:
    ids: np.ndarray                 # (batch, seq) int64
    mask: np.ndarray | None         # (batch, seq) 1 keep / 0 pad, or None
    labels: np.ndarray              # ids with IGNORE_INDEX at pad positions
    description: str
    prompt: str | None = None

    @property
    def valid(self) -> np.ndarray:
        """Boolean (batch, seq): positions compared (pad query rows are ill-defined)."""
        return np.ones(self.ids.shape, bool) if self.mask is None else self.mask.astype(bool)


def seeded_inputs(vocab: int, batch: int, length: int, seed: int, padded: bool, pad_id: int = 0) -> Inputs:
    if batch < 1 or length < 2:
        raise MigrateError("need --batch ≥ 1 and --seq-len ≥ 2")
    # The ids, and the least a forward allocates for them: one head's fp32 attention scores.
    need_memory(batch * length * 8 + batch * length * length * 4,
                f"a forward of --batch {batch:,} × --seq-len {length:,}")
    ids = np.random.default_rng(seed).integers(0, vocab, size=(batch, length), dtype=np.int64)
    mask = None
    desc = f"{batch}×{length} seeded token ids (seed {seed})"
    if padded:
        mask = np.ones_like(ids)
        # Left padding: later real tokens attend over the pad keys, so the mask matters.
        for row in range(1, batch):
            width = max(1, (length * row) // (2 * batch))
            mask[row, :width] = 0
            ids[row, :width] = pad_id
        if batch == 1:
            raise MigrateError("--padded needs --batch ≥ 2 (row 0 stays unpadded)")
        desc += ", left-padded rows"
    labels = np.where(mask == 0, IGNORE_INDEX, ids) if mask is not None else ids.copy()
    return Inputs(ids, mask, labels, desc)


def text_inputs(hf_dir: Path, text: str) -> Inputs:
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(hf_dir), local_files_only=True)
    except Exception as exc:
        raise MigrateError(f"--text needs a tokenizer in {hf_dir}: {str(exc).strip().splitlines()[0]}") from None
    ids = np.asarray(tokenizer(text)["input_ids"], dtype=np.int64)[None, :]
    if ids.shape[1] < 2:
        raise MigrateError("--text must tokenize to at least 2 tokens")
    return Inputs(ids, None, ids.copy(), f"text {text!r} ({ids.shape[1]} tokens)", prompt=text)


def decode(hf_dir: Path, rows: list[list[int]]) -> list[str] | None:
    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(hf_dir), local_files_only=True)
    except Exception:
        return None
    return [tokenizer.decode(r) for r in rows]
