"""A static-shape KV cache for the bundled causal LMs (Llama family, GPT-2): one object the forward
takes, as transformers' `Cache`, so the forward keeps one signature and one return shape with or
without it.

    cache = KVCache(config, batch, cache_len, dtype)
    logits, loss, hidden = model(input_ids, attention_mask=key_mask, position_ids=positions,
                                 cache=cache, logits_to_keep=1)

`KVCache` is a cell holding, per layer, the keys and the values, (batch, kv_heads, cache_len,
head_dim) each, and `start`, the slot of this call's first new token, as Parameters (no grad, not
the model's: they sit outside it and never reach its checkpoint). What the model asks of it:

  cache.update(layer_idx, key, value) -> (keys, values)
      this call's k, v (b, kv_heads, s, head_dim) written at slots start .. start + s - 1 of
      layer `layer_idx`, in place; the layer's whole cache returned, for the attention to attend
      (unwritten slots are masked out). transformers' `Cache.update(key, value, layer_idx)`.
  cache.start
      where the mask over the cache puts this call's queries (`CausalMask(..., cache=cache)`).

and what the step around it does: `load(start, caches)` (the state from flat tensors) and
`tensors()` (the state as flat tensors). With a cache, `attention_mask` is HF's: (b, cache_len),
1 where a slot may be attended (0: a left-pad slot of the prompt), and `position_ids` (b, s) each
new token's position (HF's attention_mask.cumsum(-1) - 1, pads 0).

Why Parameters: in GRAPH_MODE a Python object built inside `construct` takes constants only
(`jit_class`), and attributes or list items a callee sets are not seen by its caller (measured:
the caller reads the old values, silently). Parameters are what a compiled graph updates in
place, in order (auto-monad), in PyNative too, and through `mindspore.export` / `nn.GraphCell`.

`CachedStep` is the model and its cache as one step with flat tensor inputs and outputs, what
generation calls and what `migrate export --format mindir` exports twice (prefill and decode
shapes); GRAPH_MODE compiles the two once:

    step = CachedStep(model, batch, cache_len)
    logits, *caches = step(input_ids, positions, start, key_mask, *caches)   # k_0, v_0, k_1, v_1, ...

  input_ids  (b, s) int32    the new tokens (prefill: the left-padded prompts)
  positions  (b, s) int32    each token's position: HF's attention_mask.cumsum(-1) - 1, pads 0
  start      () int32        the cache slot of the first new token (0 for prefill)
  key_mask   (b, L) int32    1 where a slot may be attended (0: a left-pad slot of the prompt)
  caches     (b, kv_heads, L, head_dim) each: layer 0's keys, its values, layer 1's keys, ...
  logits     (b, vocab) fp32 the last new token's logits

Writes copy the new rows into the cache Parameters in place (ScatterNdUpdate, `KVCacheWrite`,
the write seam), so cached values are bit-identical to the computed ones and a decode step moves
b x kv_heads rows per layer, not the cache (HF's DynamicCache copies the whole cache in its
torch.cat every step).
"""
from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import Parameter, ParameterTuple, nn, ops
from mindspore.common.initializer import initializer

from migrate.models.base import F32
from migrate.models.rotary import RotaryEmbedding


class KVCacheWrite(nn.Cell):
    """The cache's write seam: k, v (b, kv_heads, s, d) written into the Parameters k_cache,
    v_cache (b, kv_heads, L, d) at slots start .. start + s - 1, in place (ScatterNdUpdate: only
    the new rows move, not the cache); the updated caches are returned. A copy, so cached values
    are bit-identical to the computed ones."""

    def __init__(self, batch: int, kv_heads: int):
        super().__init__()
        rows = np.stack(np.meshgrid(np.arange(batch), np.arange(kv_heads), indexing="ij"), -1)
        # (b, kv_heads, 1, 3): each (row, head)'s index into the cache, its slot added per call.
        self.base = ms.Tensor(np.concatenate([rows, np.zeros((batch, kv_heads, 1), np.int64)], -1)
                              .reshape(batch, kv_heads, 1, 3).astype(np.int32))
        self.slot_axis = ms.Tensor(np.array([0, 0, 1], np.int32))

    def construct(self, k_cache, v_cache, k, v, start):
        s = k.shape[2]
        slots = (ops.arange(0, s, dtype=ms.int32) + start).reshape(1, 1, s, 1)
        index = self.base + slots * self.slot_axis  # (b, kv_heads, s, 3)
        k_cache = ops.scatter_nd_update(k_cache, index, k.astype(k_cache.dtype))
        v_cache = ops.scatter_nd_update(v_cache, index, v.astype(v_cache.dtype))
        return k_cache, v_cache


def cache_shape(config, batch: int, cache_len: int) -> tuple[int, ...]:
    """The shape of each layer's key (and value) cache for a bundled model's config."""
    kv_heads = getattr(config, "n_kv_heads", None) or config.num_heads
    return (batch, kv_heads, cache_len, config.head_dim)


class KVCache(nn.Cell):
    """Per layer the keys and values of a static cache, and the slot the next call writes from
    (see the module docstring)."""

    def __init__(self, config, batch: int, cache_len: int, dtype=F32):
        super().__init__()
        self.num_layers = config.num_layers
        self.shape = cache_shape(config, batch, cache_len)
        self.dtype = dtype

        def state(name):
            return Parameter(initializer("zeros", self.shape, dtype), name=name, requires_grad=False)

        self.keys = ParameterTuple([state(f"kv_cache.keys.{i}") for i in range(self.num_layers)])
        self.values = ParameterTuple([state(f"kv_cache.values.{i}") for i in range(self.num_layers)])
        self.start = Parameter(ms.Tensor(0, ms.int32), name="kv_cache.start", requires_grad=False)
        self.write = KVCacheWrite(batch, self.shape[1])

    def update(self, layer_idx, key, value):
        """Write this call's key, value (b, kv_heads, s, d) of layer `layer_idx` at slots start..
        (in place); the layer's whole (keys, values) after the write."""
        return self.write(self.keys[layer_idx], self.values[layer_idx], key, value, self.start)

    def load(self, start, caches):
        """The state from `start` and flat caches (k_0, v_0, k_1, ...)."""
        ops.assign(self.start, start)
        for i in range(self.num_layers):
            ops.assign(self.keys[i], caches[2 * i])
            ops.assign(self.values[i], caches[2 * i + 1])

    def tensors(self) -> tuple:
        """The state as flat caches (k_0, v_0, k_1, ...), in the order `load` takes them."""
        out = ()
        for i in range(self.num_layers):
            out = out + (self.keys[i].value(), self.values[i].value())
        return out


class CachedStep(nn.Cell):
    """A bundled causal LM and its `KVCache` as one step with flat tensor inputs and outputs (see
    the module docstring). The cache travels as one (k, v) pair of tensors per layer, in layer
    order: in GRAPH_MODE a tuple argument of the top-level cell would be a compile-time constant
    (a recompile per value), and slicing layers out of one stacked tensor costs more on CPU than
    the whole attention (measured: 157 ms against 16 ms for the writes, batch 8 x 288 slots x 12
    layers)."""

    def __init__(self, model, batch: int, cache_len: int):
        super().__init__(auto_prefix=False)  # the model's parameter names stay as they are
        self.model = model
        self.cache = KVCache(model.config, batch, cache_len, model.precision.act)
        for _, cell in model.cells_and_names():
            if isinstance(cell, RotaryEmbedding):
                cell.cover(cache_len)

    def construct(self, input_ids, positions, start, key_mask, *caches):
        """(logits, k_cache_0, v_cache_0, k_cache_1, ...) from caches in the same order; without
        caches, (logits,) from the state the previous call left (a live runner's decode steps: no
        copy of the cache in and out per step)."""
        if caches:
            self.cache.load(start, caches)
        else:
            ops.assign(self.cache.start, start)
        logits = self.model(input_ids, key_mask, cache=self.cache, position_ids=positions, logits_to_keep=1)[0]
        logits = (logits[:, -1].astype(F32),)
        if caches:
            return logits + self.cache.tensors()
        return logits
