"""Bytes the generation options size, from the model config alone (no MindSpore): checked against
the machine (`migrate.resources.need_memory`) before the model loads, so `--cache-len 10**12`
is one line instead of a MemoryError from the cache's zeros.

Lower bounds: the cache's keys and values, or without a cache one layer's attention scores over
the padded length (the full forward each step), plus the logits `--compare-hf` records.
"""
from __future__ import annotations

from migrate.dtype_names import PRECISIONS, canonical_dtype
from migrate.resources import need_memory

__all__ = ["cache_bytes", "check_generation_memory"]


def _dims(fields: dict) -> tuple[int, int, int, int]:
    """(layers, heads, kv heads, head dim) of a bundled model's config fields."""
    heads = int(fields["num_heads"])
    kv = int(fields.get("n_kv_heads") or heads)
    head_dim = int(fields.get("head_dim") or fields["hidden_size"] // heads)
    return int(fields["num_layers"]), heads, kv, head_dim


def cache_bytes(fields: dict, batch: int, cache_len: int, itemsize: int) -> int:
    """Keys and values of every layer: 2 x layers x (batch, kv heads, cache_len, head dim)."""
    layers, _, kv, head_dim = _dims(fields)
    return 2 * layers * batch * kv * cache_len * head_dim * itemsize


def check_generation_memory(fields: dict, batch: int, cache_len: int, *, cache: bool, dtype: str | None,
                            max_new_tokens: int, record_logits: bool, what: str) -> None:
    """Refuse a generation whose cache (or uncached attention) and recorded logits cannot fit here."""
    itemsize = PRECISIONS[canonical_dtype(dtype or fields.get("compute_dtype") or "float32")].bytes
    if cache:
        need = cache_bytes(fields, batch, cache_len, itemsize)
    else:
        _, heads, _, _ = _dims(fields)
        need = batch * heads * cache_len * cache_len * 4   # one layer's fp32 scores, every step
    if record_logits:
        need += max_new_tokens * batch * int(fields["vocab_size"]) * 4
    need_memory(need, what)
