"""MindSpore Llama causal LM that reproduces HF transformers' LlamaForCausalLM.

Parameter names are MindFormers' legacy Llama names (see keymaps/hf_llama.yaml),
so a checkpoint saved from this model also loads into MindFormers. With
`qkv_concat` (MindFormers' fused layout) attention holds one `w_qkv` (rows per
KV group: the group's query heads, its key head, its value head) and the MLP one
`w_gate_hidden` (gate and up rows interleaved); `migrate.transforms` layouts
"qkv_groups" and "interleave_rows" map HF's separate tensors onto them.

    model = LlamaForCausalLM(config)
    logits, loss, hidden = model(input_ids, attention_mask=None, labels=None,
                                 output_hidden_states=False)
    # with a KV cache (`migrate.models.kv_cache.KVCache`, updated in place): the same outputs
    logits, loss, hidden = model(input_ids, key_mask, cache=cache, position_ids=positions)

`loss` is None without labels. `hidden` is None unless output_hidden_states is
True (embedding output, each decoder layer's output, final-norm output) or
"detail" (additionally each layer's attention and MLP outputs before their
residual add); `LlamaForCausalLM.hidden_names(...)` names the entries.

Seams: one forward, and the places other concerns plug into it instead of
restating it (each replaced by type, e.g. by `migrate.align.model_faults`):

  precision     every cell computes under a `PrecisionPolicy` (`migrate.models.base`):
                emulated low precision on CPU by default, torch.autocast's policy
                from `migrate.train.precision.autocast_model`
  projections   `Linear.kernel` (`migrate.models.kernels`); sharding swaps in
                primitives with strategies (`migrate.parallel.strategy`); LoRA wraps it
  attention     `attention.scores` (q·kᵀ), `attention.softmax`, `attention.mix`
                (probs·v) kernels
  kv cache      the model's `cache` argument (`migrate.models.kv_cache.KVCache`): the
                attention joins this step's k/v to it (`cache.update(layer_idx, k, v)`)
                between the rotary and `_attend`; `position_ids` place the rotary,
                `model.mask` covers the cache (its write seam: `KVCache.write`)
  norm          `RMSNorm` cells (`eps`); `UnitOffsetRMSNorm` (Gemma) where the config sets
                `rms_norm_unit_offset`
  embedding     `model.tok_embeddings`; a `ScaledEmbedding` (Gemma) where the config sets
                `scale_embeddings` (`scale`)
  rotary        `model.rotary_emb` (the cos/sin tables), `attention.rotary` (how they rotate q, k)
  kv repeat     `attention.repeat_kv` (GQA)
  mask          `model.mask` (`fill_value`)
  loss          `loss_fn` (`migrate.models.common.ShiftedCrossEntropy`)

Low precision on CPU: MindSpore's CPU backend lacks most bfloat16 kernels (even
Reshape in GRAPH_MODE), so there parameters stay in the compute dtype but
activations are carried in fp32 and rounded to the compute dtype after every op
where HF's model would produce a tensor of that dtype. That is what torch's CPU
kernels do internally (fp32 math, one rounding per op), so the result tracks HF
closely. On other devices the ops run natively in the compute dtype.
"""
from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import mint, nn, ops

from migrate.errors import MigrateError
from migrate.models.base import F32, Build, ModelCell
from migrate.models.common import CausalLM, CausalMask, Embedding, Linear
from migrate.models.config import LlamaConfig
from migrate.models.kernels import MatMulKernel, SoftmaxKernel
from migrate.models.rotary import RotaryEmbedding, RotateHalf
from migrate.models.support import check_activation


def _gelu(x):
    # mint's gelu (GeluExt) has no CPU kernel in PyNative.
    return ops.gelu(x, approximate="none")


def _gelu_tanh(x):
    return ops.gelu(x, approximate="tanh")


def _relu2(x):
    # HF ReLUSquaredActivation: relu, then torch.square (x * x); relu is exact, so one rounding.
    r = mint.nn.functional.relu(x)
    return r * r


# HF ACT2FN names with an exact MindSpore equivalent (support.LLAMA_ACTIVATIONS, which
# convert checks without MindSpore, lists the same names).
_ACTIVATIONS = {
    "silu": mint.nn.functional.silu,
    "swish": mint.nn.functional.silu,
    "relu": mint.nn.functional.relu,
    "relu2": _relu2,
    "gelu": _gelu,
    "gelu_pytorch_tanh": _gelu_tanh,
    "gelu_new": _gelu_tanh,
}


class RMSNorm(ModelCell):
    INIT = "ones"

    def __init__(self, hidden_size: int, eps: float, build: Build, prefix: str):
        super().__init__(build.precision)
        self.weight = build.const(prefix + ".weight", (hidden_size,), self.INIT)
        self.eps = eps

    def use_precision(self, precision) -> None:
        super().use_precision(precision)
        # The fused kernel (`migrate.models.fused_ops.use_fused_ops`, the trainer's step) computes plain
        # float32 only: a new policy drops it.
        self.fused = None

    def _normalise(self, x):
        h = x.astype(F32)
        variance = mint.mean(h * h, -1, keepdim=True)
        return h * mint.rsqrt(variance + self.eps)

    def construct(self, x):
        if self.fused is not None and x.dtype == F32:
            return self.fused(x, self.weight, ms.Tensor([self.eps], F32))
        # HF order: normalise in fp32, cast back to the input dtype, then scale.
        return self._r(self._p(self.weight) * self._r(self._normalise(x).astype(x.dtype)))


class UnitOffsetRMSNorm(RMSNorm):
    """HF GemmaRMSNorm: scales by (1 + weight) in fp32, then casts back to the input dtype
    once (Llama casts first, then scales); the weight starts at zeros."""

    INIT = "zeros"

    def construct(self, x):
        return self._r((self._normalise(x) * (1.0 + self.weight.astype(F32))).astype(x.dtype))


def _norm(config: LlamaConfig, build: Build, prefix: str) -> RMSNorm:
    kind = UnitOffsetRMSNorm if config.rms_norm_unit_offset else RMSNorm
    return kind(config.hidden_size, config.rms_norm_eps, build, prefix)


class ScaledEmbedding(Embedding):
    """HF GemmaTextScaledWordEmbedding: the lookup times √hidden_size, the multiplier (fp32)
    cast to the table's dtype first (55.4256 becomes 55.5 in bf16), the product rounded once."""

    SITES = ("op",)

    def __init__(self, num: int, size: int, build: Build, prefix: str, padding_idx: int | None = None):
        super().__init__(num, size, build, prefix, padding_idx=padding_idx)
        self.scale = float(ms.Tensor(np.float32(size ** 0.5)).astype(build.dtype).astype(F32).asnumpy())

    def construct(self, ids, weight=None):
        return self._r(super().construct(ids, weight) * self.scale)


class RepeatKV(nn.Cell):
    """HF repeat_kv: each kv head (b, kv_heads, s, d) repeated n_rep times consecutively.

    `groups_queries`: query head g * n_rep + r meets kv head g, so a KV-cache step may instead
    fold each group's queries into one matrix against its kv head (no copies of the cache); a
    replacement that pairs heads otherwise sets it False."""

    groups_queries = True

    def __init__(self, n_rep: int):
        super().__init__()
        self.n_rep = n_rep

    def construct(self, x):
        if self.n_rep == 1:
            return x
        b, n, s, d = x.shape
        # Copies side by side (cat), not broadcast_to: the same values, and on CPU broadcast_to took
        # two thirds of a KV-cache decode step (170 of 255 ms, batch 8 x 288 slots, 12 layers).
        x = x.expand_dims(2)
        return mint.cat([x] * self.n_rep, 2).reshape(b, n * self.n_rep, s, d)


class LlamaAttention(ModelCell):
    SITES = ("op", "matmul_in", "matmul_out", "scaled", "probs", "dropout")

    def __init__(self, config: LlamaConfig, build: Build, prefix: str, layer_idx: int = 0):
        super().__init__(build.precision)
        self.layer_idx = layer_idx  # which layer of a KV cache this attention reads and writes
        self.num_heads = config.num_heads
        self.n_kv_heads = config.n_kv_heads
        self.n_rep = config.num_heads // config.n_kv_heads
        self.head_dim = config.head_dim
        self.scaling = self.head_dim ** -0.5
        self.dropout = config.attention_dropout
        h, q_out, kv_out = config.hidden_size, config.num_heads * config.head_dim, config.n_kv_heads * config.head_dim
        self.qkv_concat = config.qkv_concat
        if self.qkv_concat:
            # MindFormers' fused layout: rows per KV group [its n_rep q heads | k | v]
            # (migrate.transforms "qkv_groups").
            self.w_qkv = Linear(h, q_out + 2 * kv_out, config.qkv_has_bias, build, prefix + ".w_qkv")
        else:
            self.wq = Linear(h, q_out, config.qkv_has_bias, build, prefix + ".wq")
            self.wk = Linear(h, kv_out, config.qkv_has_bias, build, prefix + ".wk")
            self.wv = Linear(h, kv_out, config.qkv_has_bias, build, prefix + ".wv")
        self.wo = Linear(q_out, h, config.out_proj_has_bias, build, prefix + ".wo")
        self.rotary = RotateHalf(build.precision)
        self.repeat_kv = RepeatKV(self.n_rep)
        self.scores = MatMulKernel(transpose_b=True)  # q·kᵀ
        self.softmax = SoftmaxKernel()
        self.mix = MatMulKernel()  # probs·v

    def _split_qkv(self, qkv, b, s):
        """Fused per-group output -> q (b, heads, s, d), k and v (b, kv_heads, s, d)."""
        qkv = qkv.reshape(b, s, self.n_kv_heads, self.n_rep + 2, self.head_dim)
        # Query head g * n_rep + r is group g's r-th: HF's order, which repeat_kv pairs with kv head g.
        q = qkv[:, :, :, : self.n_rep].reshape(b, s, self.num_heads, self.head_dim)
        k = qkv[:, :, :, self.n_rep]
        v = qkv[:, :, :, self.n_rep + 1]
        return q.swapaxes(1, 2), k.swapaxes(1, 2), v.swapaxes(1, 2)

    def _project(self, x, b, s):
        if self.qkv_concat:
            return self._split_qkv(self.w_qkv(x), b, s)
        q = self.wq(x).reshape(b, s, self.num_heads, self.head_dim).swapaxes(1, 2)
        k = self.wk(x).reshape(b, s, self.n_kv_heads, self.head_dim).swapaxes(1, 2)
        v = self.wv(x).reshape(b, s, self.n_kv_heads, self.head_dim).swapaxes(1, 2)
        return q, k, v

    def _attend(self, q, k, v, mask, grouped=False):
        """HF eager attention: q (b, heads, s, d) over k, v (b, kv_heads, s_kv, d) -> (b, heads, s, d).
        `grouped`: each kv head's n_rep query heads as one (n_rep * s)-row matrix against it, the
        same products without repeating k and v (a KV-cache step: repeating the cache copied it
        n_rep times per layer and token)."""
        b, _, s, _ = q.shape
        kv_len = k.shape[2]
        if grouped and self.n_rep > 1:
            q = q.reshape(b, self.n_kv_heads, self.n_rep * s, self.head_dim)
        else:
            k, v = self.repeat_kv(k), self.repeat_kv(v)
        scores = self._r(self.scores(self._r(q, "matmul_in"), self._r(k, "matmul_in")), "matmul_out")
        scores = scores.reshape(b, self.num_heads, s, kv_len)
        scores = self._r(scores * self.scaling, "scaled")
        scores = self._r(scores + mask)
        # Softmax in fp32, then back to the activation dtype.
        probs = self._r(self.softmax(scores.astype(F32)).astype(self.act), "probs")
        if self.training and self.dropout > 0:
            # mint's dropout has no CPU kernel.
            probs = self._r(ops.dropout(probs, p=self.dropout, training=True), "dropout")
        if grouped and self.n_rep > 1:
            probs = probs.reshape(b, self.n_kv_heads, self.n_rep * s, kv_len)
        return self._r(self.mix(probs, v), "matmul_out").reshape(b, self.num_heads, s, self.head_dim)

    def construct(self, x, cos, sin, mask, cache=None):
        """The output, with or without `cache` (a `KVCache`, updated in place)."""
        b, s, _ = x.shape
        q, k, v = self._project(x, b, s)
        q, k = self.rotary(q, cos, sin), self.rotary(k, cos, sin)
        grouped = False
        if cache is not None:
            # The KV cache joins here: this step's k, v written at their slots, every slot attended
            # (the mask covers the cache); _attend takes any key length.
            k, v = cache.update(self.layer_idx, k, v)
            grouped = self.repeat_kv.groups_queries
        out = self._attend(q, k, v, mask, grouped)
        return self.wo(out.swapaxes(1, 2).reshape(b, s, self.num_heads * self.head_dim))


class LlamaFeedForward(ModelCell):
    SITES = ("mlp_act", "mlp_gate")

    def __init__(self, config: LlamaConfig, build: Build, prefix: str):
        super().__init__(build.precision)
        h, i, bias = config.hidden_size, config.intermediate_size, config.mlp_bias
        self.ffn_concat = config.qkv_concat  # MindFormers fuses gate/up together with qkv
        self.intermediate_size = i
        if self.ffn_concat:
            # Rows interleaved gate_0, up_0, gate_1, up_1, ... (migrate.transforms "interleave_rows").
            self.w_gate_hidden = Linear(h, 2 * i, bias, build, prefix + ".w_gate_hidden")
            self.w2 = Linear(i, h, bias, build, prefix + ".w2")  # down
        else:
            self.w1 = Linear(h, i, bias, build, prefix + ".w1")  # gate
            self.w2 = Linear(i, h, bias, build, prefix + ".w2")  # down
            self.w3 = Linear(h, i, bias, build, prefix + ".w3")  # up
        self.act_fn = _ACTIVATIONS[config.hidden_act]

    def construct(self, x):
        if self.ffn_concat:
            pairs = self.w_gate_hidden(x).reshape(x.shape[:-1] + (self.intermediate_size, 2))
            gate, up = pairs[..., 0], pairs[..., 1]
        else:
            gate, up = self.w1(x), self.w3(x)
        return self.w2(self._r(self._r(self.act_fn(gate), "mlp_act") * up, "mlp_gate"))


class LlamaDecoderLayer(ModelCell):
    def __init__(self, config: LlamaConfig, build: Build, prefix: str, sliding: bool = False, layer_idx: int = 0):
        super().__init__(build.precision)
        self.sliding = sliding  # attends through the sliding-window mask (Mistral, Qwen2 windowed layers)
        self.attention_norm = _norm(config, build, prefix + ".attention_norm")
        self.attention = LlamaAttention(config, build, prefix + ".attention", layer_idx)
        self.ffn_norm = _norm(config, build, prefix + ".ffn_norm")
        self.feed_forward = LlamaFeedForward(config, build, prefix + ".feed_forward")

    def construct(self, x, cos, sin, mask, window_mask, cache=None):
        """(output, attention output, MLP output), with or without `cache` (a `KVCache`)."""
        attn = self.attention(self.attention_norm(x), cos, sin, window_mask if self.sliding else mask, cache)
        h = self._r(x + attn)
        mlp = self.feed_forward(self.ffn_norm(h))
        return self._r(h + mlp), attn, mlp


def _sliding_layers(config: LlamaConfig) -> list[bool]:
    """Which layers use the sliding window: all of them (Mistral), or those HF's
    `layer_types` marks "sliding_attention" (Qwen2 and later configs)."""
    if config.sliding_window is None:
        return [False] * config.num_layers
    if not config.layer_types:
        return [True] * config.num_layers
    if len(config.layer_types) != config.num_layers:
        raise MigrateError(f"layer_types lists {len(config.layer_types)} layers, the model has {config.num_layers}")
    unknown = set(config.layer_types) - {"full_attention", "sliding_attention"}
    if unknown:
        raise MigrateError(f"unsupported layer types {sorted(unknown)}; supported: full_attention, sliding_attention")
    return [t == "sliding_attention" for t in config.layer_types]


class LlamaModel(ModelCell):
    SITES = ()

    def __init__(self, config: LlamaConfig, build: Build, prefix: str = "model"):
        super().__init__(build.precision)
        embedding = ScaledEmbedding if config.scale_embeddings else Embedding
        self.tok_embeddings = embedding(config.vocab_size, config.hidden_size, build, prefix + ".tok_embeddings",
                                        padding_idx=config.pad_token_id)
        self.sliding_window = config.sliding_window
        sliding = _sliding_layers(config)
        self.layers = nn.CellList(
            [LlamaDecoderLayer(config, build, f"{prefix}.layers.{i}", sliding[i], i) for i in range(config.num_layers)]
        )
        self.norm_out = _norm(config, build, prefix + ".norm_out")
        self.rotary_emb = RotaryEmbedding(config, build.precision)
        self.mask = CausalMask(build)

    def construct(self, input_ids, attention_mask=None, output_hidden_states=False, embedding_weight=None,
                  cache=None, position_ids=None):
        """(final hidden, hidden states), with or without `cache` (a `KVCache`; `attention_mask`
        then covers its slots). `position_ids` (b, s): each token's position (default 0 .. s - 1)."""
        b, s = input_ids.shape
        h = self.tok_embeddings(input_ids, embedding_weight)
        cos, sin = self.rotary_emb(s) if position_ids is None else self.rotary_emb.at(position_ids)
        mask = self.mask(b, s, attention_mask, cache=cache)
        window_mask = mask
        if self.sliding_window is not None:
            window_mask = self.mask(b, s, attention_mask, self.sliding_window, cache)
        hidden = (h,)
        for layer in self.layers:
            h, attn, mlp = layer(h, cos, sin, mask, window_mask, cache)
            hidden = self._keep_hidden(hidden, output_hidden_states, attn, mlp, h)
        h = self.norm_out(h)
        return h, hidden + (h,)


class LlamaForCausalLM(CausalLM):
    """HF LlamaForCausalLM in MindSpore; see the module docstring for the call.

    `seed` makes the HF-style initialisation (normal(0, initializer_range) for
    linears and the embedding, ones for norms (zeros with `rms_norm_unit_offset`),
    zeros for biases) reproducible.
    """

    DECODER = "model"
    HIDDEN = ("model.tok_embeddings", "model.layers", ("attention", "feed_forward"), "model.norm_out")

    def __init__(self, config: LlamaConfig, seed: int = 0):
        build = Build(config.compute_dtype, config.initializer_range, seed)
        check_activation(config.hidden_act)
        if config.head_dim % 2:
            raise MigrateError(f"head_dim must be even for RoPE, got {config.head_dim}")
        super().__init__(build.precision)
        self.model = LlamaModel(config, build, "model")
        self._complete(config, build)

    def word_embedding(self):
        return self.model.tok_embeddings
