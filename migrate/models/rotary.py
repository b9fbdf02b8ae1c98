"""Rotary position embedding of the bundled Llama, as two seams:

    cos, sin = model.rotary_emb(seq_len)        # RotaryEmbedding: the tables (rope type, theta, scaling)
    cos, sin = model.rotary_emb.at(positions)   # the same at per-row position_ids (a KV-cache step)
    q = attention.rotary(q, cos, sin)           # RotateHalf: how the tables rotate q and k

The frequencies come from `migrate.models.rope` (numpy, transformers' operation
order in float32); both cells follow HF's LlamaRotaryEmbedding / apply_rotary_pos_emb.
"""
from __future__ import annotations

from mindspore import Tensor, mint, ops

from migrate.models.base import F32, ModelCell, PrecisionPolicy
from migrate.models.rope import dynamic_ntk_inv_freq, dynamic_ntk_table, rope_frequencies


class RotaryEmbedding(ModelCell):
    """cos/sin tables (seq_len, head_dim) in the activation dtype."""

    def __init__(self, config, precision: PrecisionPolicy):
        super().__init__(precision)
        rope = rope_frequencies(config.head_dim, config.theta, config.rope_scaling, config.seq_length)
        self.attention_scaling = rope.attention_scaling
        # Constants, not Parameters: they must not show up in checkpoints.
        self.inv_freq = Tensor(rope.inv_freq, F32)
        # longrope's long set, used past original_max_position_embeddings.
        self.long_inv_freq = None if rope.long_inv_freq is None else Tensor(rope.long_inv_freq, F32)
        # Past this length longrope switches sets and dynamic NTK recomputes its own (both as HF).
        self.rope_switch = rope.switch_after
        # Plain numbers, not the RopeFrequencies object: GRAPH_MODE reads those from a Cell.
        self.dynamic_rope = (rope.theta, rope.factor, rope.dim) if rope.rope_type == "dynamic" else None
        self.length_table = None  # dynamic NTK's frequencies by length for a KV cache (`cover`)

    def _inv_freq(self, seq_len):
        # seq_len is a Python int (a constant in GRAPH_MODE, where the numpy call runs at compile time).
        if self.rope_switch is None or seq_len <= self.rope_switch:
            return self.inv_freq
        if self.long_inv_freq is not None:
            return self.long_inv_freq
        theta, factor, dim = self.dynamic_rope
        return Tensor(dynamic_ntk_inv_freq(theta, factor, dim, self.rope_switch, seq_len), F32)

    def cover(self, cache_len: int) -> None:
        """Make `at` ready for positions below cache_len: dynamic NTK looks its frequencies up by
        length in a table (a constant of the compiled step). Call before the step first runs."""
        if self.dynamic_rope is not None and self.long_inv_freq is None:
            theta, factor, dim = self.dynamic_rope
            self.length_table = Tensor(dynamic_ntk_table(theta, factor, dim, self.rope_switch, cache_len), F32)

    def at(self, positions):
        """cos/sin (b, 1, s, head_dim) at per-row `positions` (b, s): a KV-cache step, where left
        padding shifts each row. Where the frequencies depend on the length they follow HF's
        dynamic_rope_update: chosen per call from its longest position + 1 (cached keys keep the
        set they were rotated with)."""
        inv_freq = self.inv_freq
        if self.rope_switch is not None:
            seq_len = positions.max() + 1
            if self.long_inv_freq is not None:
                inv_freq = mint.where(seq_len > self.rope_switch, self.long_inv_freq, self.inv_freq)
            else:
                inv_freq = ops.gather(self.length_table, (seq_len - 1).reshape(1), 0).reshape(-1)
        freqs = positions.astype(F32).expand_dims(-1) * inv_freq
        return self._tables(freqs.expand_dims(1))

    def construct(self, seq_len):
        # HF: fp32 positions * inv_freq, cos/sin in fp32, then cast to the activation dtype.
        # ops.arange: mint.arange has no CPU kernel.
        pos = ops.arange(0, seq_len, dtype=F32)
        return self._tables(pos.expand_dims(-1) * self._inv_freq(seq_len).expand_dims(0))

    def _tables(self, freqs):
        emb = mint.cat((freqs, freqs), -1)
        cos = mint.cos(emb)
        sin = mint.sin(emb)
        if self.attention_scaling != 1.0:
            cos = cos * self.attention_scaling
            sin = sin * self.attention_scaling
        return self._r(cos.astype(self.act)), self._r(sin.astype(self.act))


def rotate_half(x):
    half = x.shape[-1] // 2
    return mint.cat((-x[..., half:], x[..., :half]), -1)


class RotateHalf(ModelCell):
    """HF's apply_rotary_pos_emb on one of q, k (b, heads, s, d): x·cos + rotate_half(x)·sin."""

    def use_precision(self, precision: PrecisionPolicy) -> None:
        super().use_precision(precision)
        # The fused kernel (`migrate.models.fused_ops.use_fused_ops`) computes plain float32 only.
        self.fused = None

    def construct(self, x, cos, sin):
        if self.fused is not None and x.dtype == F32 and x.ndim == 4:
            return self.fused(x, cos, sin)
        return self._r(self._r(x * cos) + self._r(rotate_half(x) * sin))
