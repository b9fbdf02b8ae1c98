"""RoPE inverse frequencies, following transformers' `modeling_rope_utils`.

Computed in float32 numpy with the same operation order as the torch code, so
the frequencies agree with HF's to the last bit or within an ulp.
"""
from __future__ import annotations

import math

import numpy as np

from migrate.errors import MigrateError

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


def _base_inv_freq(theta: float, dim: int) -> np.ndarray:
    # HF: 1.0 / (base ** (arange(0, dim, 2).float() / dim)), all float32
    exponent = np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / np.float32(dim)
    return (np.float32(1.0) / (np.float32(theta) ** exponent)).astype(np.float32)


def _require(scaling: dict, keys: tuple[str, ...], rope_type: str) -> None:
    missing = [k for k in keys if k not in scaling]
    if missing:
        raise MigrateError(f"rope_scaling of type {rope_type!r} lacks {', '.join(missing)}")


def rope_inv_freq(
    head_dim: int,
    theta: float,
    rope_scaling: dict | None,
    max_position_embeddings: int,
) -> tuple[np.ndarray, float]:
    """Return (inv_freq float32 of shape (rotary_dim // 2,), attention_scaling)."""
    scaling = dict(rope_scaling or {})
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise MigrateError(
            f"rope_type {rope_type!r} is not supported; supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
        )
    partial = scaling.get("partial_rotary_factor", 1.0)
    if rope_type == "default":
        # HF's default rope ignores partial_rotary_factor for Llama
        return _base_inv_freq(theta, head_dim), 1.0
    dim = int(head_dim * partial)
    if dim != head_dim:
        raise MigrateError(f"partial_rotary_factor {partial} is not supported for Llama")
    inv_freq = _base_inv_freq(theta, dim)

    if rope_type == "linear":
        _require(scaling, ("factor",), rope_type)
        return (inv_freq / np.float32(scaling["factor"])).astype(np.float32), 1.0

    # llama3
    _require(scaling, ("factor", "low_freq_factor", "high_freq_factor"), rope_type)
    factor = scaling["factor"]
    low_freq_factor = scaling["low_freq_factor"]
    high_freq_factor = scaling["high_freq_factor"]
    # HF standardize_rope_params falls back to max_position_embeddings
    old_context_len = scaling.get("original_max_position_embeddings", max_position_embeddings)

    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    f32 = np.float32
    wavelen = f32(2 * math.pi) / inv_freq
    inv_freq_llama = np.where(wavelen > f32(low_freq_wavelen), inv_freq / f32(factor), inv_freq)
    smooth_factor = (f32(old_context_len) / wavelen - f32(low_freq_factor)) / f32(
        high_freq_factor - low_freq_factor
    )
    smoothed = (f32(1) - smooth_factor) * inv_freq_llama / f32(factor) + smooth_factor * inv_freq_llama
    is_medium = ~(wavelen < f32(high_freq_wavelen)) & ~(wavelen > f32(low_freq_wavelen))
    inv_freq_llama = np.where(is_medium, smoothed, inv_freq_llama)
    return inv_freq_llama.astype(np.float32), 1.0
