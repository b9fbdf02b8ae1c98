"""Layers the bundled Llama, GPT-2 and BERT share, each computing under the
model's precision policy (`migrate.models.base`) and through its kernel seams
(`migrate.models.kernels`): torch-layout and Conv1D-layout dense layers, the
tied LM head, LayerNorm, embedding lookups, HF's activations, additive
attention masks and HF's losses.
"""
from __future__ import annotations

import math

import mindspore as ms
from mindspore import mint, nn, ops

from migrate.errors import MigrateError
from migrate.models.base import F32, MIN_VALUE, Build, ModelCell, PrecisionPolicy, hidden_names, name_parameters
from migrate.models.kernels import LinearKernel, LookupKernel, MatMulKernel

MATMUL_SITES = ("matmul_in", "matmul_param", "matmul_out")


# ---------------------------------------------------------------- dense layers

class Linear(ModelCell):
    """torch.nn.Linear layout: weight (out, in), optional bias; computed by `self.kernel` (the projection seam)."""

    SITES = MATMUL_SITES

    def __init__(self, in_features: int, out_features: int, has_bias: bool, build: Build, prefix: str):
        super().__init__(build.precision)
        self.weight = build.normal(prefix + ".weight", (out_features, in_features))
        self.bias = build.const(prefix + ".bias", (out_features,), "zeros") if has_bias else None
        self.kernel = LinearKernel()

    def construct(self, x):
        bias = None if self.bias is None else self._p(self.bias, "matmul_param")
        y = self.kernel(self._r(x, "matmul_in"), self._p(self.weight, "matmul_param"), bias)
        return self._r(y, "matmul_out")


class LinearInOut(ModelCell):
    """A dense layer whose weight is stored (in, out): HF's Conv1D and MindFormers'
    legacy `_Linear(transpose_b=False)` layout. y = x @ W + b."""

    def __init__(self, in_features: int, out_features: int, build: Build, prefix: str, std: float | None = None):
        super().__init__(build.precision)
        self.weight = build.normal(prefix + ".weight", (in_features, out_features), std=std)
        self.bias = build.const(prefix + ".bias", (out_features,), "zeros")
        self.kernel = MatMulKernel()

    def construct(self, x):
        return self._r(self.kernel(x, self._p(self.weight)) + self._p(self.bias))


class TiedHead(ModelCell):
    """The LM head tied to the embedding table: logits = h · Eᵀ. Holds no parameters:
    the caller passes the table, already in the activation dtype."""

    SITES = MATMUL_SITES

    def __init__(self, precision: PrecisionPolicy):
        super().__init__(precision)
        self.kernel = MatMulKernel(transpose_b=True)

    def construct(self, h, weight):
        logits = self.kernel(self._r(h, "matmul_in"), self._r(weight, "matmul_param"))
        return self._r(logits, "matmul_out")


# ---------------------------------------------------------------- norms, embeddings

class LayerNorm(ModelCell):
    """torch.nn.LayerNorm over the last axis: biased variance, eps inside the sqrt,
    computed in fp32 and rounded once (torch's CPU kernel for half types does the same).
    `names` are the attribute (hence parameter) names of scale and shift."""

    def __init__(self, size: int, eps: float, build: Build, prefix: str, names=("weight", "bias")):
        super().__init__(build.precision)
        self.eps = eps
        self.scale_name, self.shift_name = names
        # mint's layer_norm (LayerNormExt) has no CPU kernel: written out here.
        setattr(self, names[0], build.const(f"{prefix}.{names[0]}", (size,), "ones"))
        setattr(self, names[1], build.const(f"{prefix}.{names[1]}", (size,), "zeros"))

    def construct(self, x):
        scale = getattr(self, self.scale_name)
        shift = getattr(self, self.shift_name)
        h = x.astype(F32)
        mean = mint.mean(h, -1, keepdim=True)
        d = h - mean
        var = mint.mean(d * d, -1, keepdim=True)
        out = d * mint.rsqrt(var + self.eps) * scale.astype(F32) + shift.astype(F32)
        return self._r(out.astype(self.act))


class Embedding(ModelCell):
    """Lookup table through `self.lookup` (the lookup seam); `padding_idx` as torch's:
    that row gets no gradient from lookups."""

    SITES = ()

    def __init__(self, num: int, size: int, build: Build, prefix: str, attr: str = "embedding_weight",
                 padding_idx: int | None = None):
        super().__init__(build.precision)
        self.attr = attr
        self.padding_idx = padding_idx
        setattr(self, attr, build.normal(f"{prefix}.{attr}", (num, size), zero_row=padding_idx))
        self.lookup = LookupKernel()

    def table(self):
        """The table in the activation dtype (cast once; share it when the head is tied)."""
        return self._p(getattr(self, self.attr))

    def construct(self, ids, weight=None):
        if weight is None:
            weight = self.table()
        out = self.lookup(weight, ids)
        if self.padding_idx is not None:
            keep = (ids != self.padding_idx).expand_dims(-1)
            out = mint.where(keep, out, ops.stop_gradient(out))
        return out


# ---------------------------------------------------------------- activations

ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "silu", "swish", "tanh")
_GELU_NEW_C = math.sqrt(2.0 / math.pi)


class Activation(ModelCell):
    """HF's ACT2FN[name]. gelu_new is written op by op as HF writes it
    (NewGELUActivation), so low-precision rounding falls where HF's does."""

    def __init__(self, name: str, precision: PrecisionPolicy, field: str = "hidden_act"):
        super().__init__(precision)
        if name not in ACTIVATIONS:
            raise MigrateError(f"{field} {name!r} is not supported; supported: {', '.join(ACTIVATIONS)}")
        self.name = name

    def construct(self, x):
        if self.name == "gelu_new":
            r = self._r
            half = r(0.5 * x)
            inner = r(x + r(0.044715 * r(x * x * x)))
            return r(half * r(1.0 + r(mint.tanh(r(_GELU_NEW_C * inner)))))
        if self.name == "gelu":
            # mint's gelu (GeluExt) has no CPU kernel in PyNative.
            return self._r(ops.gelu(x, approximate="none"))
        if self.name == "gelu_pytorch_tanh":
            return self._r(ops.gelu(x, approximate="tanh"))
        if self.name == "relu":
            return mint.nn.functional.relu(x)
        if self.name == "tanh":
            return self._r(mint.tanh(x))
        return self._r(mint.nn.functional.silu(x))


# ---------------------------------------------------------------- masks

def causal_mask(batch: int, seq_len: int, attention_mask, fill_value: float, dtype, window=None):
    """HF eager's additive causal mask (0 keep, `fill_value` drop), (b or 1, 1, s, s);
    with `window`, HF's sliding_window_overlay (key kept while kv_idx > q_idx - window)."""
    # ops.arange: mint.arange has no CPU kernel.
    idx = ops.arange(0, seq_len, dtype=ms.int32)
    keep = idx.expand_dims(0) <= idx.expand_dims(1)  # [q, k]: key at or before query
    if window is not None:
        keep = mint.logical_and(keep, idx.expand_dims(0) > idx.expand_dims(1) - window)
    keep = keep.reshape(1, 1, seq_len, seq_len)
    if attention_mask is not None:
        keep = mint.logical_and(keep, attention_mask.astype(ms.bool_).reshape(batch, 1, 1, seq_len))
    # Arithmetic in fp32 (mint.full/where on bf16 lack CPU kernels); the cast is exact.
    return ((1.0 - keep.astype(F32)) * fill_value).astype(dtype)


def cache_mask(batch: int, start, seq_len: int, key_mask, fill_value: float, dtype, window=None):
    """`causal_mask` for `seq_len` queries written at cache slots start.. over every slot of a
    static KV cache, (b, 1, s, cache length): a key is kept at or before its query's slot
    (within `window` slots, as HF's sliding_window_overlay counts them) and where `key_mask`
    (b, cache length) is 1 (0: a left-pad slot)."""
    slots = ops.arange(0, key_mask.shape[1], dtype=ms.int32)
    query = ops.arange(0, seq_len, dtype=ms.int32) + start
    keep = slots.expand_dims(0) <= query.expand_dims(1)  # [q, slot]
    if window is not None:
        keep = mint.logical_and(keep, slots.expand_dims(0) > query.expand_dims(1) - window)
    keep = mint.logical_and(keep.expand_dims(0).expand_dims(0),
                            key_mask.astype(ms.bool_).reshape(batch, 1, 1, key_mask.shape[1]))
    return ((1.0 - keep.astype(F32)) * fill_value).astype(dtype)


def padding_mask(batch: int, seq_len: int, attention_mask, min_value: float, dtype):
    """HF eager's bidirectional additive mask, (b, 1, 1, s): padded keys get dtype min."""
    keep = attention_mask.astype(F32).reshape(batch, 1, 1, seq_len)
    return ((1.0 - keep) * min_value).astype(dtype)


class CausalMask(ModelCell):
    """The additive causal mask in the activation dtype; `fill_value` (the seam) is what
    dropped keys get: the minimum of the parameters' dtype, as HF fills."""

    SITES = ()

    def __init__(self, build: Build):
        super().__init__(build.precision)
        self.fill_value = MIN_VALUE[build.dtype]

    def construct(self, batch, seq_len, attention_mask=None, window=None, cache=None):
        """The mask of `seq_len` queries: over themselves, or with a KV cache (`migrate.models.kv_cache`)
        over the whole cache, the queries at slots cache.start.. and `attention_mask` (b, cache length)."""
        if cache is None:
            return causal_mask(batch, seq_len, attention_mask, self.fill_value, self.act, window)
        return cache_mask(batch, cache.start, seq_len, attention_mask, self.fill_value, self.act, window)


# ---------------------------------------------------------------- losses

def causal_lm_loss(logits, labels, vocab_size: int, ignore_index: int):
    """HF ForCausalLMLoss: fp32 logits, labels shifted left, ignore_index padded at the end."""
    pad = labels[:, :1] * 0 + ignore_index  # mint.full/zeros_like lack CPU kernels
    shift = mint.cat((labels[:, 1:], pad), 1).reshape(-1)
    return masked_lm_loss(logits, shift, vocab_size, ignore_index)


def masked_lm_loss(logits, labels, vocab_size: int, ignore_index: int):
    """torch CrossEntropyLoss over every position (no shift), ignoring ignore_index."""
    flat = logits.astype(F32).reshape(-1, vocab_size)
    return ops.nll_loss(_log_softmax(flat), labels.reshape(-1), ignore_index=ignore_index, reduction="mean")


def _log_softmax(flat):
    """ops.cross_entropy's log-softmax over the last axis, x - (log(sum(exp(x - max))) + max), the same
    ops in the same order (the loss keeps its bits), with the max held constant for the gradient: the
    shift cancels in exact arithmetic, so the gradient is torch's g - softmax * sum(g) without a
    rounding-sized term at each row's largest logit, and MindSpore's CPU is spared ReduceMax's backward
    (an Equal, a Mul and a ReduceSum over the logits: 3.7 ms of a 72 ms step at the demo size).
    mint's log_softmax (LogSoftmaxExt) has no CPU kernel in PyNative."""
    top = ops.stop_gradient(ops.ReduceMax(keep_dims=True)(flat, 1))
    return flat - (ops.log(ops.sum(ops.exp(flat - top), 1, True)) + top)


class CrossEntropy(nn.Cell):
    """The loss seam: mean cross-entropy of fp32 logits against labels at the same position."""

    def __init__(self, vocab_size: int, ignore_index: int):
        super().__init__()
        self.vocab_size = vocab_size
        self.ignore_index = ignore_index

    def construct(self, logits, labels):
        return masked_lm_loss(logits, labels, self.vocab_size, self.ignore_index)


class ShiftedCrossEntropy(CrossEntropy):
    """HF's causal LM loss: position t predicts label t + 1."""

    def construct(self, logits, labels):
        return causal_lm_loss(logits, labels, self.vocab_size, self.ignore_index)


# ---------------------------------------------------------------- the causal LM head

class CausalLM(ModelCell):
    """HF's *ForCausalLM around a decoder: the LM head (tied: `tied_head` over the embedding
    table; else its own `lm_head`), HF's shifted loss (`loss_fn`, a seam) and the outputs as
    HF hands them out.

    A subclass builds its decoder under the attribute `DECODER` names (called as
    `decoder(input_ids, attention_mask, output_hidden_states, table, cache, position_ids)` ->
    (h, hidden), with or without a cache), says where its word embedding sits
    (`word_embedding`), then calls `_complete`. `HIDDEN` names the hidden entries:
    (embedding, layers, (attention part, MLP part), final norm).
    """

    SITES = ()
    DECODER: str
    HIDDEN: tuple[str, str, tuple[str, str], str]

    @classmethod
    def hidden_names(cls, config, detail: bool = False) -> list[str]:
        """Names of the `hidden` entries, in order, for output_hidden_states True or "detail"."""
        embedding, layers, parts, final = cls.HIDDEN
        return hidden_names(embedding, layers, config.num_layers, parts, detail) + [final]

    def _complete(self, config, build: Build) -> None:
        """Add the LM head and the loss after the decoder, keep the config, and name every
        parameter by its full path (checkpoints are keyed by it)."""
        self.config = config
        self.vocab_size = config.vocab_size
        self.ignore_index = config.ignore_token_id
        self.tie_word_embeddings = config.tie_word_embeddings
        if config.tie_word_embeddings:
            # A cell of its own, without parameters: parallel code swaps its kernel, stages it.
            self.tied_head = TiedHead(build.precision)
        else:
            self.lm_head = Linear(config.hidden_size, config.vocab_size, False, build, "lm_head")
        self.loss_fn = ShiftedCrossEntropy(config.vocab_size, config.ignore_token_id)
        name_parameters(self)

    def word_embedding(self) -> Embedding:
        raise NotImplementedError

    def construct(self, input_ids, attention_mask=None, labels=None, output_hidden_states=False, cache=None,
                  position_ids=None, logits_to_keep=0):
        """(logits, loss, hidden), with or without `cache` (a `migrate.models.kv_cache.KVCache`, updated
        in place; `attention_mask` then covers the cache, `position_ids` place the new tokens).
        `logits_to_keep` as HF's: n > 0, the logits of the last n positions only."""
        table = None
        if self.tie_word_embeddings:
            # One cast shared by lookup and head: in GRAPH_MODE two casts of a bf16
            # parameter need a bf16 TensorMove, which CPU lacks.
            table = self.word_embedding().table()
        decoder = getattr(self, self.DECODER)
        h, hidden = decoder(input_ids, attention_mask, output_hidden_states, table, cache, position_ids)
        if logits_to_keep:
            h = h[:, -logits_to_keep:]
        if self.tie_word_embeddings:
            logits = self.tied_head(h, table)
        else:
            logits = self.lm_head(h)
        loss = None
        if labels is not None:
            loss = self.loss_fn(logits, labels)
        return self._hand_out(logits), loss, self._hidden_out(hidden, output_hidden_states)
