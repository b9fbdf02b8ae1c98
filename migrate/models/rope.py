"""RoPE inverse frequencies, following transformers' `modeling_rope_utils`.

Computed in float32 numpy with the same operation order as the torch code (a
Python number meeting a float32 tensor is rounded to float32 first, as torch
does), so the frequencies agree with HF's to the last bit or within an ulp.
MindSpore-free: `migrate convert` validates a config's RoPE here, before writing.

Types (HF's `rope_type`):
- default, linear, llama3, yarn: one set of frequencies (yarn also scales cos/sin
  by its attention factor);
- longrope: the short factors, switched to the long ones for a sequence longer than
  `original_max_position_embeddings` (HF's `longrope_frequency_update`);
- dynamic (NTK): the base frequencies, recomputed from the sequence length for a
  sequence longer than `max_position_embeddings` (HF's `dynamic_frequency_update`).
  HF keeps the last recomputed set while later calls stay longer than
  max_position_embeddings; the bundled model computes each call's set from its own
  length, which is the same for any single call and for a growing sequence.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from migrate.errors import MigrateError
from migrate.safeyaml import quote

SUPPORTED_ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3")
f32 = np.float32


def _arange_exponent(dim: int) -> np.ndarray:
    # HF: torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    return np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / f32(dim)


def _pow(base, exponent: np.ndarray) -> np.ndarray:
    """float32 base ** float32 exponents, correctly rounded: what torch's CPU kernel gives
    (numpy's float32 power is an ulp off for some, e.g. 500000 ** 0.75)."""
    return (np.float64(f32(base)) ** exponent.astype(np.float64)).astype(np.float32)


def _base_inv_freq(theta: float, dim: int) -> np.ndarray:
    # HF: 1.0 / (base ** (arange(0, dim, 2).float() / dim)), all float32
    return (f32(1.0) / _pow(theta, _arange_exponent(dim))).astype(np.float32)


def _pow_scalar(x: np.float32, exponent: float) -> np.float32:
    """torch.pow(float32 tensor, Python float) on CPU: a few exponents are special
    cases (x*x, x*x*x, sqrt, ...); the others go through double pow, then float32."""
    special = {2.0: lambda: x * x, 3.0: lambda: x * x * x, 0.5: lambda: np.sqrt(x),
               -1.0: lambda: f32(1) / x, -2.0: lambda: f32(1) / (x * x), -0.5: lambda: f32(1) / np.sqrt(x)}
    if exponent in special:
        return f32(special[exponent]())
    return f32(float(x) ** exponent)


def _number(scaling: dict, key: str, rope_type: str, default=None, required: bool = False):
    value = scaling.get(key, default)
    if value is None:
        if required:
            raise MigrateError(f"rope_scaling of type {rope_type!r} lacks {key}")
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise MigrateError(f"rope_scaling.{key} must be a number, got {quote(value)}")
    return value


def _positive(scaling: dict, key: str, rope_type: str, default=None, required: bool = False):
    value = _number(scaling, key, rope_type, default, required)
    if value is not None and value <= 0:
        raise MigrateError(f"rope_scaling.{key} must be positive, got {quote(value)}")
    return value


def _factors(scaling: dict, key: str, count: int) -> np.ndarray:
    value = scaling.get(key)
    if not isinstance(value, list) or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                               for v in value):
        raise MigrateError(f"rope_scaling.{key} (longrope) must be a list of numbers, got {quote(value)}")
    if len(value) != count:
        raise MigrateError(f"rope_scaling.{key} holds {len(value)} values; the model's rotary dimension "
                           f"needs {count} (head_dim / 2)")
    return np.asarray(value, dtype=np.float32)  # HF: torch.tensor(factors, dtype=torch.float32)


@dataclass(frozen=True)
class RopeFrequencies:
    """The frequencies of one model config. `inv_freq` is what HF's rotary embedding
    holds after construction; `for_length(seq_len)` what it uses for a call whose
    positions are 0 .. seq_len - 1."""

    rope_type: str
    inv_freq: np.ndarray
    attention_scaling: float
    long_inv_freq: np.ndarray | None = None   # longrope: past `switch_after`
    switch_after: int | None = None           # longrope: original_max_position_embeddings; dynamic: max positions
    theta: float = 0.0                        # dynamic: its inputs
    factor: float = 1.0
    dim: int = 0

    def for_length(self, seq_len: int) -> np.ndarray:
        if self.switch_after is None or seq_len <= self.switch_after:
            return self.inv_freq
        if self.rope_type == "longrope":
            return self.long_inv_freq
        return self.dynamic_inv_freq(seq_len)

    def dynamic_inv_freq(self, seq_len: int) -> np.ndarray:
        return dynamic_ntk_inv_freq(self.theta, self.factor, self.dim, self.switch_after, seq_len)


def dynamic_ntk_inv_freq(theta: float, factor: float, dim: int, max_positions: int, seq_len: int) -> np.ndarray:
    """HF `_compute_dynamic_ntk_parameters` with a tensor seq_len (as the forward pass
    calls it): base * ((factor * seq_len / max) - (factor - 1)) ** (dim / (dim - 2)),
    each op in float32 on a 0-d tensor."""
    seq = f32(max(seq_len, max_positions))
    scaled = f32(f32(factor) * seq) / f32(max_positions)
    shifted = f32(scaled - f32(factor - 1))
    base = f32(f32(theta) * _pow_scalar(shifted, dim / (dim - 2)))
    return (f32(1.0) / _pow(base, _arange_exponent(dim))).astype(np.float32)


def dynamic_ntk_table(theta: float, factor: float, dim: int, max_positions: int, max_len: int) -> np.ndarray:
    """(max_len, dim / 2): row n - 1 holds what HF's dynamic_rope_update uses for a call whose
    longest position is n - 1: the base frequencies up to max_positions, then
    `dynamic_ntk_inv_freq` of n (a KV-cache step looks its row up by position)."""
    base = _base_inv_freq(theta, dim)
    return np.stack([base if n <= max_positions else dynamic_ntk_inv_freq(theta, factor, dim, max_positions, n)
                     for n in range(1, max_len + 1)])


def rope_frequencies(head_dim: int, theta: float, rope_scaling: dict | None,
                     max_position_embeddings: int) -> RopeFrequencies:
    """The RoPE of a Llama-family config, or MigrateError naming the field the bundled
    model cannot run (before any byte of a conversion is written)."""
    if rope_scaling is not None and not isinstance(rope_scaling, dict):
        raise MigrateError(f"rope_scaling must be a mapping, got {quote(rope_scaling)}")
    scaling = dict(rope_scaling or {})
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise MigrateError(f"rope_type {quote(rope_type)} (config.json rope_parameters / rope_scaling) is not "
                           f"supported by the bundled Llama; supported: {', '.join(SUPPORTED_ROPE_TYPES)}")
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not theta > 0:
        raise MigrateError(f"rope_theta must be a positive number, got {quote(theta)}")
    if rope_type == "default":
        # HF's default rope ignores partial_rotary_factor for Llama
        return RopeFrequencies(rope_type, _base_inv_freq(theta, head_dim), 1.0)
    partial = _number(scaling, "partial_rotary_factor", rope_type, default=1.0)
    dim = int(head_dim * partial)
    if dim != head_dim:
        raise MigrateError(f"rope_scaling.partial_rotary_factor {quote(partial)} is not supported: the bundled "
                           f"Llama (as HF's) rotates the whole head")

    if rope_type == "linear":
        factor = _positive(scaling, "factor", rope_type, required=True)
        return RopeFrequencies(rope_type, (_base_inv_freq(theta, dim) / f32(factor)).astype(np.float32), 1.0)
    if rope_type == "llama3":
        return RopeFrequencies(rope_type, _llama3(scaling, theta, dim, max_position_embeddings), 1.0)
    if rope_type == "yarn":
        return _yarn(scaling, theta, dim, max_position_embeddings)
    if rope_type == "longrope":
        return _longrope(scaling, theta, dim, max_position_embeddings)
    # dynamic
    factor = _positive(scaling, "factor", rope_type, required=True)
    if dim <= 2:
        raise MigrateError(f"dynamic RoPE needs head_dim > 2, got {head_dim}")
    # At construction HF calls it with seq_len=None -> max_position_embeddings, in Python floats.
    base = theta * ((factor * max_position_embeddings / max_position_embeddings) - (factor - 1)) ** (dim / (dim - 2))
    return RopeFrequencies(rope_type, _base_inv_freq(base, dim), 1.0, switch_after=max_position_embeddings,
                           theta=theta, factor=factor, dim=dim)


def rope_inv_freq(
    head_dim: int,
    theta: float,
    rope_scaling: dict | None,
    max_position_embeddings: int,
) -> tuple[np.ndarray, float]:
    """Return (inv_freq float32 of shape (rotary_dim // 2,), attention_scaling) at
    construction (see `rope_frequencies` for the length-dependent types)."""
    rope = rope_frequencies(head_dim, theta, rope_scaling, max_position_embeddings)
    return rope.inv_freq, rope.attention_scaling


def _original_max(scaling: dict, rope_type: str, max_position_embeddings: int) -> int:
    # HF standardize_rope_params falls back to max_position_embeddings
    value = scaling.get("original_max_position_embeddings", max_position_embeddings)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise MigrateError(f"rope_scaling.original_max_position_embeddings must be a positive integer, "
                           f"got {quote(value)}")
    return value


def _llama3(scaling: dict, theta: float, dim: int, max_position_embeddings: int) -> np.ndarray:
    factor = _positive(scaling, "factor", "llama3", required=True)
    low_freq_factor = _positive(scaling, "low_freq_factor", "llama3", required=True)
    high_freq_factor = _positive(scaling, "high_freq_factor", "llama3", required=True)
    old_context_len = _original_max(scaling, "llama3", max_position_embeddings)
    if high_freq_factor == low_freq_factor:
        raise MigrateError("rope_scaling.high_freq_factor must differ from low_freq_factor (llama3)")
    inv_freq = _base_inv_freq(theta, dim)

    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = f32(2 * math.pi) / inv_freq
    inv_freq_llama = np.where(wavelen > f32(low_freq_wavelen), inv_freq / f32(factor), inv_freq)
    smooth_factor = (f32(old_context_len) / wavelen - f32(low_freq_factor)) / f32(
        high_freq_factor - low_freq_factor
    )
    smoothed = (f32(1) - smooth_factor) * inv_freq_llama / f32(factor) + smooth_factor * inv_freq_llama
    is_medium = ~(wavelen < f32(high_freq_wavelen)) & ~(wavelen > f32(low_freq_wavelen))
    inv_freq_llama = np.where(is_medium, smoothed, inv_freq_llama)
    return inv_freq_llama.astype(np.float32)


def _yarn(scaling: dict, theta: float, dim: int, max_position_embeddings: int) -> RopeFrequencies:
    """HF `_compute_yarn_parameters`."""
    original = _original_max(scaling, "yarn", max_position_embeddings)
    factor = _positive(scaling, "factor", "yarn")
    if factor is None:  # DeepSeek-V3 style: the ratio of the two lengths
        factor = max_position_embeddings / original
    attention_factor = _number(scaling, "attention_factor", "yarn")
    mscale = _number(scaling, "mscale", "yarn")
    mscale_all_dim = _number(scaling, "mscale_all_dim", "yarn")
    truncate = scaling.get("truncate", True)
    if not isinstance(truncate, bool):
        raise MigrateError(f"rope_scaling.truncate must be true or false, got {quote(truncate)}")

    def get_mscale(scale, mscale=1):
        if scale <= 1:
            return 1.0
        return 0.1 * mscale * math.log(scale) + 1.0

    if attention_factor is None:
        if mscale and mscale_all_dim:
            attention_factor = float(get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim))
        else:
            attention_factor = get_mscale(factor)
    beta_fast = _number(scaling, "beta_fast", "yarn") or 32
    beta_slow = _number(scaling, "beta_slow", "yarn") or 1

    def find_correction_dim(num_rotations):
        return (dim * math.log(original / (num_rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = find_correction_dim(beta_fast), find_correction_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # HF: prevent singularity

    pos_freqs = _pow(theta, _arange_exponent(dim))
    inv_freq_extrapolation = f32(1.0) / pos_freqs
    inv_freq_interpolation = f32(1.0) / (f32(factor) * pos_freqs)
    # linear_ramp_factor(low, high, dim // 2): (arange(dim // 2) - low) / (high - low), clamped
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - f32(low)) / f32(high - low), f32(0), f32(1))
    extrapolation_factor = f32(1) - ramp
    inv_freq = (inv_freq_interpolation * (f32(1) - extrapolation_factor)
                + inv_freq_extrapolation * extrapolation_factor)
    return RopeFrequencies("yarn", inv_freq.astype(np.float32), float(attention_factor))


def _longrope(scaling: dict, theta: float, dim: int, max_position_embeddings: int) -> RopeFrequencies:
    """HF `_compute_longrope_parameters`, short set at construction, long past the original length."""
    original = _original_max(scaling, "longrope", max_position_embeddings)
    factor = _positive(scaling, "factor", "longrope")
    attention_factor = _number(scaling, "attention_factor", "longrope")
    if factor is None:  # Phi-3: the ratio of the two lengths
        factor = max_position_embeddings / original
    if attention_factor is None:
        if factor <= 1.0:
            attention_factor = 1.0
        else:
            attention_factor = math.sqrt(1 + math.log(factor) / math.log(original))
    shape = _pow(theta, _arange_exponent(dim))

    def inv(key: str) -> np.ndarray:
        return (f32(1.0) / (_factors(scaling, key, dim // 2) * shape)).astype(np.float32)

    return RopeFrequencies("longrope", inv("short_factor"), float(attention_factor),
                           long_inv_freq=inv("long_factor"), switch_after=original)
