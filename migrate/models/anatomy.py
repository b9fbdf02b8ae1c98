"""Parameter counts of a bundled decoder model by the role each tensor plays, computed
from the config alone: what the memory planner places on each device and what the
trainer's MFU counts as matmul work.

`tests/test_shapes.py` holds each anatomy to its family's shape function (the same
total), and `tests/test_parallel_strategy.py` holds the per-device count to what the
sharding strategies place on a device.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LayerAnatomy:
    """The parameters of one decoder layer, grouped by how tensor parallelism (mp) places them."""

    column: int      # split over mp by output rows: q, gate, up (weights and biases)
    kv: int          # k and v: split like q, or whole on every rank when n_kv_heads < mp
    row: int         # split over mp by input columns: o, down weights
    row_bias: int    # whole on every rank: o and down biases (added after the reduction)
    norms: int       # whole on every rank; no matmul, so PaLM's N leaves them out

    @property
    def total(self) -> int:
        return self.column + self.kv + self.row + self.row_bias + self.norms

    @property
    def matmul(self) -> int:
        """The parameters that take part in matmuls (biases included, as PaLM's 6N counts them)."""
        return self.total - self.norms

    def per_device(self, mp: int, replicate_kv: bool) -> int:
        split = self.column + self.row + (0 if replicate_kv else self.kv)
        whole = self.row_bias + self.norms + (self.kv if replicate_kv else 0)
        return split // mp + whole


@dataclass(frozen=True)
class Anatomy:
    """A decoder-only model: embedding table, `num_layers` equal layers, final norm, LM head."""

    layer: LayerAnatomy
    num_layers: int
    embedding: int        # vocab × hidden: the input table (split over mp), also the LM head's matmul size
    tied: bool            # the LM head is the embedding table
    final_norm: int
    attention_width: int  # heads × head_dim: PaLM's attention term

    @property
    def head(self) -> int:
        """Parameters of an LM head of its own (0 when tied)."""
        return 0 if self.tied else self.embedding

    @property
    def total(self) -> int:
        return self.embedding + self.head + self.num_layers * self.layer.total + self.final_norm

    def flops_per_token(self, seq_length: int) -> int:
        """PaLM's estimate, 6 N + 12 L s (heads × head_dim), N = the parameters in matmuls: every
        layer's and the LM head (the tied table counts once, as the head); not the input lookup."""
        n = self.num_layers * self.layer.matmul + self.embedding
        return 6 * n + 12 * self.num_layers * seq_length * self.attention_width


def llama_anatomy(c) -> Anatomy:
    """The bundled Llama (`migrate.models.llama`), fused (`qkv_concat`) or not: the fused
    w_qkv / w_gate_hidden hold the same rows and are split over mp alike."""
    h, i = c.hidden_size, c.intermediate_size
    q, kv = c.num_heads * c.head_dim, c.n_kv_heads * c.head_dim
    qkv_bias = bool(c.qkv_has_bias)
    layer = LayerAnatomy(
        column=h * q + (q if qkv_bias else 0) + 2 * (h * i + (i if c.mlp_bias else 0)),
        kv=2 * (h * kv + (kv if qkv_bias else 0)),
        row=q * h + i * h,
        row_bias=(h if c.out_proj_has_bias else 0) + (h if c.mlp_bias else 0),
        norms=2 * h,
    )
    return Anatomy(layer, c.num_layers, c.vocab_size * h, bool(c.tie_word_embeddings), h, q)
