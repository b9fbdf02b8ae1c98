"""Step runners over the bundled MindSpore model (see `migrate.infer.generate`).

`CachedRunner` runs the model as one static-shape KV-cache step (`migrate.models.kv_cache.
CachedStep`): the prompt once, then one token per step; in GRAPH_MODE that is two compiled
graphs, whatever the number of steps. `UncachedRunner` is the path without a cache: the whole
sequence through the full forward at every step (what `migrate diff --generate` did before).
"""
from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import nn, ops

from migrate.errors import MigrateError
from migrate.infer.kernel_decode import KernelStep, why_not_kernels
from migrate.models.kv_cache import CachedStep, cache_shape


def learned_positions(model) -> int | None:
    """The position-table size of a model with learned positions (GPT-2), else None (RoPE)."""
    return model.config.seq_length if getattr(type(model), "LEARNED_POSITIONS", False) else None


class CachedRunner:
    def __init__(self, model, batch: int, prefill_len: int, cache_len: int):
        self.step = CachedStep(model, batch, cache_len)
        self.step.set_train(False)
        # Prefill and decode through one kernel per layer where the model allows (kernel_decode.py):
        # two instances, two graphs; every other model steps op by op (`no_kernels` says why).
        self.no_kernels = why_not_kernels(model)
        self.kernels = self.kernel_prefill = None
        if self.no_kernels is None:
            self.kernel_prefill, self.kernels = KernelStep(self.step), KernelStep(self.step)
            self.kernel_prefill.set_train(False)
            self.kernels.set_train(False)
            self.kernels.phase = "increment"  # as `_run`'s decode calls: the compiled graph without the compile path
        self.batch, self.prefill_len, self.cache_len = batch, prefill_len, cache_len
        self.max_positions = learned_positions(model)
        self.shape = cache_shape(model.config, batch, cache_len)
        self.tensors = 2 * model.config.num_layers
        self.dtype = model.precision.act  # activations' dtype: fp32 when low precision is emulated on CPU
        self._key_mask = None

    def _run(self, ids, positions, start: int, caches=()) -> np.ndarray:
        # "increment": MindSpore's phase for a decode step, whose calls after the first run the
        # graph compiled then without the compile path (no argument key, no walk over every
        # sub-cell to set its phase: a few ms a step here). Sound because the decode shapes are
        # static. The prefill (once per generation) stays on the ordinary path: the fast one
        # refuses its cache arguments.
        self.step.phase = "predict" if caches else "increment"
        logits, *caches = self.step(ms.Tensor(ids), ms.Tensor(positions), ms.Tensor(start, ms.int32),
                                    self._key_mask, *caches)
        return logits.asnumpy()

    def prefill(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        """The prompt into the cache: through the kernels (the slots it covers written), else into a
        zeroed cache through the step's flat boundary, as MindIR runs it."""
        self._key_mask = ms.Tensor(inputs["key_mask"])
        if self.kernel_prefill is not None:
            # every slot the prompt covers is written; later ones are written before they are read
            return self.kernel_prefill(ms.Tensor(inputs["input_ids"]), ms.Tensor(inputs["positions"]),
                                       ms.Tensor(0, ms.int32), self._key_mask).asnumpy()
        zeros = ops.zeros(self.shape, self.dtype)
        return self._run(inputs["input_ids"], inputs["positions"], 0, (zeros,) * self.tensors)

    def decode(self, tokens, positions, start: int, key_mask) -> np.ndarray:
        """One token per row; the cache stays in the step's `KVCache` between calls (no copies in and out)."""
        if self.kernels is None:
            return self._run(tokens, positions, start)
        return self.kernels(ms.Tensor(tokens), ms.Tensor(positions), ms.Tensor(start, ms.int32),
                            self._key_mask).asnumpy()


class _LogitsAt(nn.Cell):
    """The model's full forward, the logits at one position per call (a graph input, not a shape)."""

    def __init__(self, model):
        super().__init__(auto_prefix=False)
        self.model = model

    def construct(self, input_ids, attention_mask, index):
        logits = self.model(input_ids, attention_mask)[0]
        return ops.gather(logits, index, 1).astype(ms.float32)


class UncachedRunner:
    """The full forward over the whole sequence at every step; logits of the last position.

    PyNative: the sequence grows by one token per step. GRAPH_MODE: every step runs the padded
    cache length (right padding, masked), so one graph serves every step, as MindFormers runs
    without `use_past`. Prompts of one length only: the full forward numbers positions from the
    first slot, HF generate from each row's first token."""

    def __init__(self, model, batch: int, prefill_len: int, cache_len: int):
        self.model = model
        self.batch, self.prefill_len, self.cache_len = batch, prefill_len, cache_len
        self.max_positions = learned_positions(model)
        self.static = ms.get_context("mode") == ms.GRAPH_MODE
        self.step = _LogitsAt(model)
        self.ids = self.mask = None
        self.length = 0

    def _last_logits(self) -> np.ndarray:
        width = self.cache_len if self.static else self.length
        index = ms.Tensor([self.length - 1], ms.int32)
        return self.step(ms.Tensor(self.ids[:, :width]), ms.Tensor(self.mask[:, :width]), index)[:, 0].asnumpy()

    def prefill(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        if not inputs["key_mask"][:, :self.prefill_len].all():
            raise MigrateError("the path without a cache takes prompts of one length (no left padding)")
        self.ids = np.zeros((self.batch, self.cache_len), np.int32)
        self.mask = np.zeros((self.batch, self.cache_len), np.int32)
        self.ids[:, :self.prefill_len] = inputs["input_ids"]
        self.mask[:, :self.prefill_len] = 1
        self.length = self.prefill_len
        return self._last_logits()

    def decode(self, tokens, positions, start: int, key_mask) -> np.ndarray:
        self.ids[:, self.length] = tokens[:, 0]
        self.mask[:, self.length] = 1
        self.length += 1
        return self._last_logits()
