"""The KV-cache steps of a plain float32 Llama as one CPU kernel per layer (decode_layer.cc).

    reason = why_not_kernels(model)         # None: the kernels can run this model's steps
    step = KernelStep(cached_step)          # shares the CachedStep's model and cache Parameters
    logits = step(input_ids, positions, start, key_mask)   # (b, vocab) fp32: the last new token's

`input_ids` (b, s): the prompt (start 0, every slot of the prefill written) or one token per row
(a decode step at slot `start`); the other inputs as `CachedStep`'s.

Why: a batch-1 decode step reads every weight once; MindSpore's compiled step of SmolLM2-135M's
shapes launched ~1,370 kernels a token, about 15 µs each, beside ~35 ms of kernel time
(docs/generate.md). And MindSpore's CPU graphs keep every intermediate: the op-by-op prefill graph
of that model held 2 GB at batch 8 × 32 tokens, the kernels' a layer's worth. Here the embedding,
rotary tables, mask and final norm stay MindSpore ops and each decoder layer and the LM head are
one `ops.Custom` kernel each, reading the weight Parameters where they are and writing the new k, v
into the cache Parameters in place.

What it takes (`why_not_kernels` says which part a model misses; `why_not_config` the part a
model.yaml decides, for callers that name things before the model loads): MindSpore on CPU in
GRAPH_MODE, a C++ compiler (migrate/native.py), and a model built only of the plain float32
Llama's cells (no fused q/k/v layout, biases, Gemma offsets, sliding windows, LoRA, swapped kernels
or fault seams), SiLU MLP. Anything else decodes through `CachedStep`, op by op; so does every
model with MIGRATE_DECODE_KERNELS=off. The numbers agree with `CachedStep`'s within float32
rounding (tests/test_kernel_decode.py), not bit for bit: each product sums in its own order.
"""
from __future__ import annotations

from functools import cache
from pathlib import Path

import mindspore as ms
from mindspore import nn, ops

from migrate import native
from migrate.models.base import F32
from migrate.models.common import CausalMask, Embedding, Linear, ShiftedCrossEntropy, TiedHead, cache_mask
from migrate.models.config import LlamaConfig
from migrate.models.kernels import LinearKernel, LookupKernel, MatMulKernel, SoftmaxKernel
from migrate.models.llama import (
    LlamaAttention,
    LlamaDecoderLayer,
    LlamaFeedForward,
    LlamaForCausalLM,
    LlamaModel,
    RepeatKV,
    RMSNorm,
)
from migrate.models.rotary import RotaryEmbedding, RotateHalf

SOURCE = Path(__file__).with_name("decode_layer.cc")
ENV_SWITCH = "MIGRATE_DECODE_KERNELS"
# The plain float32 Llama's cells, exactly: a subclass or any other cell (LoRA, sharded or fault
# kernels, Gemma's norms) computes something the kernel does not.
PLAIN_CELLS = {LlamaForCausalLM, LlamaModel, LlamaDecoderLayer, LlamaAttention, LlamaFeedForward, RMSNorm,
               Embedding, Linear, LinearKernel, LookupKernel, MatMulKernel, SoftmaxKernel, RotaryEmbedding,
               RotateHalf, RepeatKV, CausalMask, TiedHead, ShiftedCrossEntropy, nn.CellList}
SILU = ("silu", "swish")


def why_not_kernels(model) -> str | None:
    """None where `KernelStep` computes this model's decode step, else the reason it does not."""
    config = getattr(model, "config", None)
    if type(model) is not LlamaForCausalLM or config is None:
        return "not a bundled Llama"
    if ms.get_context("mode") != ms.GRAPH_MODE:
        return "the decode kernels run in GRAPH_MODE"
    reason = why_not_config(config)
    if reason is not None:
        return reason
    for name, cell in model.cells_and_names():
        if type(cell) not in PLAIN_CELLS:
            return f"{name or 'the model'} is a {type(cell).__name__}"
        precision = getattr(cell, "precision", None)
        if precision is not None and (precision.params != F32 or precision.act != F32 or precision.sites):
            return f"{name or 'the model'} does not compute in plain float32"
    return None


def why_not_config(config, compute_dtype: str | None = None) -> str | None:
    """What `why_not_kernels` decides from a Llama config (computed in `compute_dtype`, default its
    own) and the machine alone: a GRAPH_MODE run of a model loaded from that config."""
    if native.switched_off(ENV_SWITCH):
        return f"{ENV_SWITCH} is off"
    if type(config) is not LlamaConfig:
        return "not a Llama config"
    if ms.get_context("device_target") != "CPU":
        return "the decode kernels run on CPU"
    if (compute_dtype or getattr(config, "compute_dtype", None)) != "float32":
        return "not float32"
    if config.qkv_concat or config.qkv_has_bias or config.out_proj_has_bias or config.mlp_bias:
        return "fused qkv layout or biases"
    if config.hidden_act not in SILU or config.rms_norm_unit_offset or config.scale_embeddings:
        return "not SiLU with plain RMSNorm and embedding"
    if config.sliding_window is not None:
        return "sliding-window attention"
    if library() is None:
        return "no C++ compiler, or the kernels' build failed"
    return None


@cache
def library() -> str | None:
    built = native.build(SOURCE)
    return None if built is None else str(built)


class KernelStep(nn.Cell):
    """A `CachedStep` call on the state in its cache Parameters (no caches passed in or out) with each
    layer and the head one kernel; `why_not_kernels(step.model)` must be None. One instance per
    shape: a decode instance runs in MindSpore's "increment" phase (`CachedRunner`)."""

    def __init__(self, cached_step):
        super().__init__(auto_prefix=False)  # the model's parameter names stay as they are
        self.model = cached_step.model
        self.cache = cached_step.cache
        config = self.model.config
        lib = library()
        self.layer_op = ops.Custom(f"{lib}:MigrateDecodeLayer", out_shape=lambda x, *rest: x,
                                   out_dtype=lambda x, *rest: x, func_type="aot")
        self.head_op = ops.Custom(f"{lib}:MigrateHeadRows", out_shape=lambda x, table: (x[0], table[0]),
                                  out_dtype=lambda x, table: x, func_type="aot")
        self.scalars = ms.Tensor([config.rms_norm_eps, config.head_dim ** -0.5], F32)
        self.tied = config.tie_word_embeddings

    def construct(self, input_ids, positions, start, key_mask):
        decoder = self.model.model
        table = self.model.word_embedding().table()
        h = decoder.tok_embeddings(input_ids, table)
        cos, sin = decoder.rotary_emb.at(positions)
        b, s = input_ids.shape
        mask = cache_mask(b, start, s, key_mask, decoder.mask.fill_value, F32)
        for i, layer in enumerate(decoder.layers):
            attention, mlp = layer.attention, layer.feed_forward
            h = self.layer_op(h, layer.attention_norm.weight, attention.wq.weight, attention.wk.weight,
                              attention.wv.weight, attention.wo.weight, layer.ffn_norm.weight, mlp.w1.weight,
                              mlp.w3.weight, mlp.w2.weight, cos, sin, mask, self.cache.keys[i],
                              self.cache.values[i], start, self.scalars)
        h = decoder.norm_out(h[:, -1:])
        return self.head_op(h, table if self.tied else self.model.lm_head.weight)
