"""A static-shape KV cache for the bundled causal LMs (Llama family, GPT-2), through their seams.

The cache is preallocated, (batch, kv_heads, cache_len, head_dim) for the keys and for the values
of each layer, and travels as explicit inputs and outputs: nothing in the model holds state, so the
same step runs as a live cell, in GRAPH_MODE, or from exported MindIR files. Every call has the
same shapes but for the number of new tokens, so GRAPH_MODE compiles two graphs, prefill
(s = prompt length) and decode (s = 1), once:

    step = CachedStep(model, cache_len)
    logits, *caches = step(input_ids, positions, start, key_mask, *caches)   # k_0, v_0, k_1, v_1, ...

  input_ids  (b, s) int32    the new tokens (prefill: the left-padded prompts)
  positions  (b, s) int32    each token's position: HF's attention_mask.cumsum(-1) - 1, pads 0
  start      () int32        the cache slot of the first new token (0 for prefill)
  key_mask   (b, L) int32    1 where a slot may be attended (0: a left-pad slot of the prompt)
  caches     (b, kv_heads, L, head_dim) each: layer 0's keys, its values, layer 1's keys, ...
  logits     (b, vocab) fp32 the last new token's logits

Inside the model the step is a tuple `(positions, start, key_mask, keys, values)` handed to
`CausalLM.construct(..., cache=step)`; the decoder turns it into rotary tables at the positions
(`RotaryEmbedding.at`), masks over the cache (`CausalMask.over_cache`) and one
`(k_cache, v_cache, start)` per layer, which the attention joins between the rotary and
`_attend` through its `kv_cache` seam (`KVCacheWrite`): this step's k, v written at their slots,
the whole cache attended (unwritten slots are masked out).

Functional, not in place: each step returns new cache tensors (a where over every slot), which
costs one pass over the cache per layer and step -- what HF's DynamicCache pays in its torch.cat,
and what lets MindIR carry the cache as plain inputs and outputs.
"""
from __future__ import annotations

import mindspore as ms
from mindspore import mint, nn, ops

from migrate.models.base import F32
from migrate.models.rotary import RotaryEmbedding


class KVCacheWrite(nn.Cell):
    """The attention's cache seam: k, v (b, kv_heads, s, d) written into k_cache, v_cache
    (b, kv_heads, L, d) at slots start .. start + s - 1; the updated caches are returned.
    Selects only (gather + where), so cached values are bit-identical to the computed ones."""

    def construct(self, k_cache, v_cache, k, v, start):
        length, s = k_cache.shape[2], k.shape[2]
        slots = ops.arange(0, length, dtype=ms.int32)
        written = mint.logical_and(slots >= start, slots < start + s).reshape(1, 1, length, 1)
        source = mint.clamp(slots - start, 0, s - 1)  # slot -> index among the new tokens
        k_cache = mint.where(written, ops.gather(k.astype(k_cache.dtype), source, 2), k_cache)
        v_cache = mint.where(written, ops.gather(v.astype(v_cache.dtype), source, 2), v_cache)
        return k_cache, v_cache


def layer_cache(step, layer: int):
    """What one decoder layer's attention gets from the model-level step: (k_cache, v_cache, start)."""
    return step[3][layer], step[4][layer], step[1]


class CachedStep(nn.Cell):
    """A bundled causal LM as one cache step with flat tensor inputs and outputs (see the module
    docstring): what generation calls, and what `migrate export --format mindir` exports twice
    (prefill and decode shapes). The cache travels as one (k, v) pair of tensors per layer, in
    layer order: in GRAPH_MODE a tuple argument of the top-level cell would be a compile-time
    constant (a recompile per value), and slicing layers out of one stacked tensor costs more on
    CPU than the whole attention (measured: 157 ms against 16 ms for the writes, batch 8 x 288
    slots x 12 layers)."""

    def __init__(self, model, cache_len: int):
        super().__init__(auto_prefix=False)  # the model's parameter names stay as they are
        self.model = model
        self.num_layers = model.config.num_layers
        for _, cell in model.cells_and_names():
            if isinstance(cell, RotaryEmbedding):
                cell.cover(cache_len)

    def construct(self, input_ids, positions, start, key_mask, *caches):
        """(logits, k_cache_0, v_cache_0, k_cache_1, ...) from caches in the same order."""
        keys = ()
        values = ()
        for i in range(self.num_layers):
            keys = keys + (caches[2 * i],)
            values = values + (caches[2 * i + 1],)
        logits, step = self.model(input_ids, cache=(positions, start, key_mask, keys, values))
        out = (logits[:, -1].astype(F32),)
        for i in range(self.num_layers):
            out = out + (step[3][i], step[4][i])
        return out


def cache_shape(config, batch: int, cache_len: int) -> tuple[int, ...]:
    """The shape of each layer's key (and value) cache for a bundled model's config."""
    kv_heads = getattr(config, "n_kv_heads", None) or config.num_heads
    return (batch, kv_heads, cache_len, config.head_dim)
