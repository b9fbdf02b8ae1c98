"""Prompts as a left-padded batch, as HF `generate` sees them, and as a static-shape cache step takes them.

HF pads prompts on the left to the longest one, numbers each row's positions from its first real
token (`attention_mask.cumsum(-1) - 1`, pads 0) and counts every sequence slot, pads included, as
a cache slot. A static prefill may be longer than the longest prompt (an exported graph's fixed
length): the extra left padding shifts every slot of a row alike and is masked, so positions,
windows and results stay HF's; only `sequences` (what the repetition penalty and the output
see) keep HF's width.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from migrate.errors import MigrateError


@dataclass
class Batch:
    sequences: np.ndarray   # (b, longest prompt) int64: the prompts as HF holds them, left-padded with pad_id
    mask: np.ndarray        # (b, longest prompt) int64: 1 real token, 0 pad
    pad_id: int

    @property
    def size(self) -> int:
        return self.sequences.shape[0]

    @property
    def prompt_len(self) -> int:
        return self.sequences.shape[1]

    def positions(self) -> np.ndarray:
        """HF's position_ids for the prompts: cumsum of the mask - 1, pads 0."""
        return np.where(self.mask == 1, self.mask.cumsum(-1) - 1, 0)

    def prefill(self, length: int, cache_len: int) -> dict[str, np.ndarray]:
        """The prefill step's int32 inputs, the prompts padded on the left to `length` slots."""
        if length < self.prompt_len:
            raise MigrateError(f"the prompt ({self.prompt_len} tokens) is longer than the prefill length {length}")
        extra = length - self.prompt_len
        ids = np.pad(self.sequences, ((0, 0), (extra, 0)), constant_values=self.pad_id)
        mask = np.pad(self.mask, ((0, 0), (extra, 0)))
        positions = np.pad(self.positions(), ((0, 0), (extra, 0)))
        key_mask = np.ones((self.size, cache_len), np.int64)
        key_mask[:, :length] = mask
        return {"input_ids": ids.astype(np.int32), "positions": positions.astype(np.int32),
                "key_mask": key_mask.astype(np.int32)}


def make_batch(prompts: list[list[int]], pad_id: int | None, vocab_size: int) -> Batch:
    """Token-id prompts -> a left-padded Batch (MigrateError for an empty prompt or an id out of the vocabulary)."""
    if not prompts:
        raise MigrateError("no prompt given")
    for i, ids in enumerate(prompts):
        if not ids:
            raise MigrateError(f"prompt {i} has no tokens")
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            raise MigrateError(f"prompt {i}: token id {bad[0]} is outside the vocabulary (0..{vocab_size - 1})")
    pad = 0 if pad_id is None else pad_id
    width = max(len(p) for p in prompts)
    sequences = np.full((len(prompts), width), pad, np.int64)
    mask = np.zeros((len(prompts), width), np.int64)
    for row, ids in enumerate(prompts):
        sequences[row, width - len(ids):] = ids
        mask[row, width - len(ids):] = 1
    return Batch(sequences, mask, pad)
