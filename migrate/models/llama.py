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

`loss` is None without labels. `hidden` is None unless output_hidden_states is
True (embedding output, each decoder layer's output, final-norm output) or
"detail" (additionally each layer's attention and MLP outputs before their
residual add); `LlamaForCausalLM.hidden_names(...)` names the entries.

Low precision on CPU: MindSpore's CPU backend lacks most bfloat16 kernels (even
Reshape in GRAPH_MODE), so there parameters stay in the compute dtype but
activations are carried in fp32 and rounded to the compute dtype after every op
where HF's model would produce a tensor of that dtype. That is what torch's CPU
kernels do internally (fp32 math, one rounding per op), so the result tracks HF
closely. On other devices the ops run natively in the compute dtype.
"""
from __future__ import annotations

import zlib

import numpy as np
import mindspore as ms
from mindspore import Parameter, Tensor, mint, nn, ops
from mindspore.common.initializer import Initializer, initializer

from migrate.errors import MigrateError
from migrate.models.config import LlamaConfig
from migrate.models.rope import dynamic_ntk_inv_freq, rope_frequencies
from migrate.models.support import check_activation

F32 = ms.float32
_DTYPES = {"float32": ms.float32, "float16": ms.float16, "bfloat16": ms.bfloat16}
# torch.finfo(dtype).min; all exact in fp32.
_MIN = {ms.float32: -3.4028234663852886e38, ms.float16: -65504.0, ms.bfloat16: -3.3895313892515355e38}


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


class _SeededNormal(Initializer):
    """Normal(0, sigma) from a per-parameter numpy seed.

    An Initializer (not a ready tensor) keeps parameter creation lazy, so loaders
    can skip it; the seed makes a fresh model reproducible without global state.
    """

    def __init__(self, sigma: float, seed: int, zero_row: int | None = None):
        super().__init__(sigma=sigma, seed=seed)
        self.sigma = sigma
        self._np_seed = seed
        self.zero_row = zero_row

    def _initialize(self, arr):
        rng = np.random.default_rng(self._np_seed)
        arr[...] = rng.normal(0.0, self.sigma, arr.shape).astype(arr.dtype)
        if self.zero_row is not None:
            arr[self.zero_row] = 0  # HF zeroes the embedding's padding_idx row


class _Precision:
    """Parameter dtype, activation dtype and rounding, shared by all cells."""

    def __init__(self, dtype, std: float, seed: int):
        self.dtype = dtype  # parameters
        self.emulate = dtype != F32 and ms.get_context("device_target") == "CPU"
        self.act = F32 if self.emulate else dtype  # activations between ops
        self.std, self.seed = std, seed

    def normal(self, name: str, shape, zero_row: int | None = None) -> Parameter:
        seed = zlib.crc32(f"{self.seed}:{name}".encode())
        init = _SeededNormal(self.std, seed, zero_row)
        return Parameter(initializer(init, shape, self.dtype), name=name)

    def const(self, name: str, shape, value: str) -> Parameter:
        return Parameter(initializer(value, shape, self.dtype), name=name)


class _Cell(nn.Cell):
    """A Cell that knows the precision policy."""

    def __init__(self, prec: _Precision):
        super().__init__()
        self.emulate = prec.emulate
        self.cdtype = prec.dtype
        self.act = prec.act

    def _r(self, x):
        """Round to the compute dtype where HF would hold a tensor of it (emulation only)."""
        if self.emulate:
            return x.astype(self.cdtype).astype(F32)
        return x

    def _p(self, param):
        """A parameter in the activation dtype."""
        if self.emulate:
            return param.astype(F32)
        return param


class Linear(_Cell):
    """torch.nn.Linear layout: weight (out, in), optional bias."""

    def __init__(self, in_features: int, out_features: int, has_bias: bool, prec: _Precision, prefix: str):
        super().__init__(prec)
        self.weight = prec.normal(prefix + ".weight", (out_features, in_features))
        self.bias = prec.const(prefix + ".bias", (out_features,), "zeros") if has_bias else None

    def construct(self, x):
        bias = None if self.bias is None else self._p(self.bias)
        return self._r(mint.nn.functional.linear(x, self._p(self.weight), bias))


class RMSNorm(_Cell):
    def __init__(self, hidden_size: int, eps: float, prec: _Precision, prefix: str):
        super().__init__(prec)
        self.weight = prec.const(prefix + ".weight", (hidden_size,), "ones")
        self.eps = eps

    def construct(self, x):
        # HF order: normalise in fp32, cast back to the input dtype, then scale.
        input_dtype = x.dtype
        h = x.astype(F32)
        variance = mint.mean(h * h, -1, keepdim=True)
        h = h * mint.rsqrt(variance + self.eps)
        return self._r(self._p(self.weight) * self._r(h.astype(input_dtype)))


class LlamaEmbedding(_Cell):
    def __init__(self, vocab_size: int, hidden_size: int, padding_idx, prec: _Precision, prefix: str):
        super().__init__(prec)
        self.embedding_weight = prec.normal(prefix + ".embedding_weight", (vocab_size, hidden_size), padding_idx)
        self.padding_idx = padding_idx

    def construct(self, input_ids, weight=None):
        # `weight`: the parameter already in the activation dtype, when the caller shares it.
        if weight is None:
            weight = self._p(self.embedding_weight)
        # ops.gather, not mint.nn.Embedding: the latter's backward fails on CPU.
        out = ops.gather(weight, input_ids, 0)
        if self.padding_idx is not None:
            # torch's padding_idx: the pad row gets no gradient from lookups.
            keep = (input_ids != self.padding_idx).expand_dims(-1)
            out = mint.where(keep, out, ops.stop_gradient(out))
        return out


def _rotate_half(x):
    half = x.shape[-1] // 2
    return mint.cat((-x[..., half:], x[..., :half]), -1)


class LlamaAttention(_Cell):
    def __init__(self, config: LlamaConfig, prec: _Precision, prefix: str):
        super().__init__(prec)
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
            self.w_qkv = Linear(h, q_out + 2 * kv_out, config.qkv_has_bias, prec, prefix + ".w_qkv")
        else:
            self.wq = Linear(h, q_out, config.qkv_has_bias, prec, prefix + ".wq")
            self.wk = Linear(h, kv_out, config.qkv_has_bias, prec, prefix + ".wk")
            self.wv = Linear(h, kv_out, config.qkv_has_bias, prec, prefix + ".wv")
        self.wo = Linear(q_out, h, config.out_proj_has_bias, prec, prefix + ".wo")

    def _split_qkv(self, qkv, b, s):
        """Fused per-group output -> q (b, heads, s, d), k and v (b, kv_heads, s, d)."""
        qkv = qkv.reshape(b, s, self.n_kv_heads, self.n_rep + 2, self.head_dim)
        # Query head g * n_rep + r is group g's r-th: HF's order, which _repeat_kv pairs with kv head g.
        q = qkv[:, :, :, : self.n_rep].reshape(b, s, self.num_heads, self.head_dim)
        k = qkv[:, :, :, self.n_rep]
        v = qkv[:, :, :, self.n_rep + 1]
        return q.swapaxes(1, 2), k.swapaxes(1, 2), v.swapaxes(1, 2)

    def _repeat_kv(self, x):
        # HF repeat_kv: each kv head repeated n_rep times consecutively.
        if self.n_rep == 1:
            return x
        b, n, s, d = x.shape
        x = mint.broadcast_to(x.expand_dims(2), (b, n, self.n_rep, s, d))
        return x.reshape(b, n * self.n_rep, s, d)

    def _rope(self, x, cos, sin):
        return self._r(self._r(x * cos) + self._r(_rotate_half(x) * sin))

    def construct(self, x, cos, sin, mask):
        b, s, _ = x.shape
        if self.qkv_concat:
            q, k, v = self._split_qkv(self.w_qkv(x), b, s)
        else:
            q = self.wq(x).reshape(b, s, self.num_heads, self.head_dim).swapaxes(1, 2)
            k = self.wk(x).reshape(b, s, self.n_kv_heads, self.head_dim).swapaxes(1, 2)
            v = self.wv(x).reshape(b, s, self.n_kv_heads, self.head_dim).swapaxes(1, 2)
        q = self._rope(q, cos, sin)
        k = self._repeat_kv(self._rope(k, cos, sin))
        v = self._repeat_kv(v)

        scores = self._r(self._r(mint.matmul(q, k.swapaxes(2, 3))) * self.scaling)
        scores = self._r(scores + mask)
        # HF eager: softmax in fp32, then back to the activation dtype.
        probs = self._r(mint.nn.functional.softmax(scores.astype(F32), dim=-1).astype(self.act))
        if self.training and self.dropout > 0:
            # mint's dropout has no CPU kernel.
            probs = ops.dropout(probs, p=self.dropout, training=True)
        out = self._r(mint.matmul(probs, v))
        out = out.swapaxes(1, 2).reshape(b, s, self.num_heads * self.head_dim)
        return self.wo(out)


class LlamaFeedForward(_Cell):
    def __init__(self, config: LlamaConfig, prec: _Precision, prefix: str):
        super().__init__(prec)
        h, i, bias = config.hidden_size, config.intermediate_size, config.mlp_bias
        self.ffn_concat = config.qkv_concat  # MindFormers fuses gate/up together with qkv
        self.intermediate_size = i
        if self.ffn_concat:
            # Rows interleaved gate_0, up_0, gate_1, up_1, ... (migrate.transforms "interleave_rows").
            self.w_gate_hidden = Linear(h, 2 * i, bias, prec, prefix + ".w_gate_hidden")
            self.w2 = Linear(i, h, bias, prec, prefix + ".w2")  # down
        else:
            self.w1 = Linear(h, i, bias, prec, prefix + ".w1")  # gate
            self.w2 = Linear(i, h, bias, prec, prefix + ".w2")  # down
            self.w3 = Linear(h, i, bias, prec, prefix + ".w3")  # up
        self.act_fn = _ACTIVATIONS[config.hidden_act]

    def construct(self, x):
        if self.ffn_concat:
            pairs = self.w_gate_hidden(x).reshape(x.shape[:-1] + (self.intermediate_size, 2))
            gate, up = pairs[..., 0], pairs[..., 1]
        else:
            gate, up = self.w1(x), self.w3(x)
        return self.w2(self._r(self._r(self.act_fn(gate)) * up))


class LlamaDecoderLayer(_Cell):
    def __init__(self, config: LlamaConfig, prec: _Precision, prefix: str, sliding: bool = False):
        super().__init__(prec)
        self.sliding = sliding  # attends through the sliding-window mask (Mistral, Qwen2 windowed layers)
        self.attention_norm = RMSNorm(config.hidden_size, config.rms_norm_eps, prec, prefix + ".attention_norm")
        self.attention = LlamaAttention(config, prec, prefix + ".attention")
        self.ffn_norm = RMSNorm(config.hidden_size, config.rms_norm_eps, prec, prefix + ".ffn_norm")
        self.feed_forward = LlamaFeedForward(config, prec, prefix + ".feed_forward")

    def construct(self, x, cos, sin, mask, window_mask):
        attn = self.attention(self.attention_norm(x), cos, sin, window_mask if self.sliding else mask)
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


class LlamaModel(_Cell):
    def __init__(self, config: LlamaConfig, prec: _Precision, prefix: str = "model"):
        super().__init__(prec)
        self.tok_embeddings = LlamaEmbedding(
            config.vocab_size, config.hidden_size, config.pad_token_id, prec, prefix + ".tok_embeddings"
        )
        self.sliding_window = config.sliding_window
        sliding = _sliding_layers(config)
        self.layers = nn.CellList(
            [LlamaDecoderLayer(config, prec, f"{prefix}.layers.{i}", sliding[i]) for i in range(config.num_layers)]
        )
        self.norm_out = RMSNorm(config.hidden_size, config.rms_norm_eps, prec, prefix + ".norm_out")
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
        self.min_value = _MIN[prec.dtype]

    def _inv_freq(self, seq_len):
        # seq_len is a Python int (a constant in GRAPH_MODE, where the numpy call runs at compile time).
        if self.rope_switch is None or seq_len <= self.rope_switch:
            return self.inv_freq
        if self.long_inv_freq is not None:
            return self.long_inv_freq
        theta, factor, dim = self.dynamic_rope
        return Tensor(dynamic_ntk_inv_freq(theta, factor, dim, self.rope_switch, seq_len), F32)

    def _rope(self, seq_len):
        # HF: fp32 positions * inv_freq, cos/sin in fp32, then cast to the activation dtype.
        # ops.arange: mint.arange has no CPU kernel.
        pos = ops.arange(0, seq_len, dtype=F32)
        freqs = pos.expand_dims(-1) * self._inv_freq(seq_len).expand_dims(0)
        emb = mint.cat((freqs, freqs), -1)
        cos = mint.cos(emb)
        sin = mint.sin(emb)
        if self.attention_scaling != 1.0:
            cos = cos * self.attention_scaling
            sin = sin * self.attention_scaling
        return self._r(cos.astype(self.act)), self._r(sin.astype(self.act))

    def _mask(self, batch, seq_len, attention_mask, window=None):
        # Additive mask (0 keep, dtype min drop) of shape (b or 1, 1, s, s), as HF eager builds it.
        idx = ops.arange(0, seq_len, dtype=ms.int32)
        keep = idx.expand_dims(0) <= idx.expand_dims(1)  # [q, k]: key at or before query
        if window is not None:
            # HF's sliding_window_overlay: key kept while kv_idx > q_idx - window.
            keep = mint.logical_and(keep, idx.expand_dims(0) > idx.expand_dims(1) - window)
        keep = keep.reshape(1, 1, seq_len, seq_len)
        if attention_mask is not None:
            keep = mint.logical_and(keep, attention_mask.astype(ms.bool_).reshape(batch, 1, 1, seq_len))
        # Arithmetic in fp32 (mint.full/where on bf16 lack CPU kernels); the cast is exact.
        return ((1.0 - keep.astype(F32)) * self.min_value).astype(self.act)

    def construct(self, input_ids, attention_mask=None, output_hidden_states=False, embedding_weight=None):
        b, s = input_ids.shape
        h = self.tok_embeddings(input_ids, embedding_weight)
        cos, sin = self._rope(s)
        mask = self._mask(b, s, attention_mask)
        window_mask = mask
        if self.sliding_window is not None:
            window_mask = self._mask(b, s, attention_mask, self.sliding_window)
        hidden = (h,)
        for layer in self.layers:
            h, attn, mlp = layer(h, cos, sin, mask, window_mask)
            if output_hidden_states == "detail":
                hidden = hidden + (attn, mlp, h)
            elif output_hidden_states:
                hidden = hidden + (h,)
        h = self.norm_out(h)
        return h, hidden + (h,)


class TiedHead(_Cell):
    """The LM head tied to the embedding table: logits = h · Eᵀ. Holds no parameters.

    A cell of its own (rather than an inline matmul) so that parallel code can
    swap it for a subclass that carries a shard strategy or a pipeline stage;
    the caller passes the table, already in the activation dtype.
    """

    def construct(self, h, weight):
        return self._r(mint.matmul(h, weight.T))


class LlamaForCausalLM(_Cell):
    """HF LlamaForCausalLM in MindSpore; see the module docstring for the call.

    `seed` makes the HF-style initialisation (normal(0, initializer_range) for
    linears and the embedding, ones for norms, zeros for biases) reproducible.
    """

    def __init__(self, config: LlamaConfig, seed: int = 0):
        if config.compute_dtype not in _DTYPES:
            raise MigrateError(
                f"compute_dtype {config.compute_dtype!r} is not supported; supported: {', '.join(_DTYPES)}"
            )
        check_activation(config.hidden_act)
        if config.head_dim % 2:
            raise MigrateError(f"head_dim must be even for RoPE, got {config.head_dim}")
        prec = _Precision(_DTYPES[config.compute_dtype], config.initializer_range, seed)
        super().__init__(prec)
        self.config = config
        self.vocab_size = config.vocab_size
        self.ignore_index = config.ignore_token_id
        self.tie_word_embeddings = config.tie_word_embeddings
        self.model = LlamaModel(config, prec, "model")
        if config.tie_word_embeddings:
            self.tied_head = TiedHead(prec)
        else:
            self.lm_head = Linear(config.hidden_size, config.vocab_size, False, prec, "lm_head")
        # Parameters carry their full path as name (checkpoints are keyed by it).
        for name, param in self.parameters_and_names():
            param.name = name

    @staticmethod
    def hidden_names(config: LlamaConfig, detail: bool = False) -> list[str]:
        """Names of the `hidden` entries, in order, for output_hidden_states True or "detail"."""
        names = ["model.tok_embeddings"]
        for i in range(config.num_layers):
            layer = f"model.layers.{i}"
            names += [f"{layer}.attention", f"{layer}.feed_forward", layer] if detail else [layer]
        return names + ["model.norm_out"]

    def _loss(self, logits, labels):
        # HF ForCausalLMLoss: fp32 logits, labels shifted left, ignore_index padded at the end.
        pad = labels[:, :1] * 0 + self.ignore_index  # mint.full/zeros_like lack CPU kernels
        shift = mint.cat((labels[:, 1:], pad), 1).reshape(-1)
        flat = logits.astype(F32).reshape(-1, self.vocab_size)
        # ops.cross_entropy: mint's (LogSoftmaxExt) has no CPU kernel in PyNative.
        return ops.cross_entropy(flat, shift, ignore_index=self.ignore_index, reduction="mean")

    def construct(self, input_ids, attention_mask=None, labels=None, output_hidden_states=False):
        if self.tie_word_embeddings:
            # One cast shared by lookup and head: in GRAPH_MODE two casts of a bf16
            # parameter need a bf16 TensorMove, which CPU lacks.
            weight = self._p(self.model.tok_embeddings.embedding_weight)
            h, hidden = self.model(input_ids, attention_mask, output_hidden_states, weight)
            logits = self.tied_head(h, weight)
        else:
            h, hidden = self.model(input_ids, attention_mask, output_hidden_states)
            logits = self.lm_head(h)
        loss = None
        if labels is not None:
            loss = self._loss(logits, labels)
        if self.emulate:
            # Hand out tensors of the compute dtype, as HF's model would.
            logits = logits.astype(self.cdtype)
            if output_hidden_states:
                cast = ()
                for x in hidden:
                    cast = cast + (x.astype(self.cdtype),)
                hidden = cast
        if not output_hidden_states:
            hidden = None
        return logits, loss, hidden
