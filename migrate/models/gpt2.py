"""MindSpore GPT-2 causal LM that reproduces HF transformers' GPT2LMHeadModel.

Parameter names and layouts are MindFormers' legacy GPT-2 ones
(mindformers/models/gpt2: `backbone.embedding...`, `backbone.blocks.N...`), so a
checkpoint saved from this model also loads into MindFormers:

- q, k, v (`attention.dense1/2/3`) are separate, stored (out, in) like torch.nn.Linear:
  HF's fused Conv1D `c_attn` weight (in, 3*out) is split into thirds along its output
  axis (dim 1) and each third transposed; its bias is split into thirds.
- `attention.projection`, `output.mapping` and `output.projection` are stored (in, out),
  MindFormers' `_Linear(transpose_b=False)` layout, which is HF's Conv1D layout: HF's
  attn.c_proj, mlp.c_fc and mlp.c_proj copy over unchanged (rename only).
- LayerNorms are `gamma`/`beta`; the LM head is tied to the token embedding (HF GPT-2
  always ties); an untied config gets an `lm_head.weight` (vocab, hidden).

    model = GPT2LMHeadModel(config)
    logits, loss, hidden = model(input_ids, attention_mask=None, labels=None,
                                 output_hidden_states=False)

`loss` is None without labels. `hidden` is None unless output_hidden_states is True
(embedding output, each block's output, final LayerNorm output) or "detail"
(additionally each block's attention and MLP outputs before their residual add);
`GPT2LMHeadModel.hidden_names(...)` names the entries. Precision handling as in
`migrate.models.base` (fp32 exact; bf16/fp16 emulated on CPU). A KV cache plugs in as in
the Llama (`migrate.models.kv_cache`): the model's `cache` argument, `cache.update(layer_idx, k, v)`
between the projections and the scores, learned positions looked up at `position_ids`.
"""
from __future__ import annotations

import math

import mindspore as ms
from mindspore import mint, nn, ops

from migrate.errors import MigrateError
from migrate.models.base import F32, Build, ModelCell
from migrate.models.common import Activation, CausalLM, CausalMask, Embedding, LayerNorm, Linear, LinearInOut
from migrate.models.gpt2_config import GPT2Config  # noqa: F401 (re-exported: mindspore-free for convert)


class GPT2Embedding(ModelCell):
    def __init__(self, config: GPT2Config, build: Build, prefix: str):
        super().__init__(build.precision)
        h = config.hidden_size
        self.word_embedding = Embedding(config.vocab_size, h, build, prefix + ".word_embedding", "embedding_table")
        self.position_embedding = Embedding(config.seq_length, h, build, prefix + ".position_embedding",
                                            "embedding_table")
        self.dropout = config.embedding_dropout_prob

    def construct(self, input_ids, word_table=None, positions=None):
        """`positions` (b, s): per-row positions (a KV-cache step); default 0 .. s - 1 for every row."""
        if positions is None:
            positions = ops.arange(0, input_ids.shape[1], dtype=ms.int32).expand_dims(0)
        h = self._r(self.word_embedding(input_ids, word_table) + self.position_embedding(positions))
        return self._dropout(h, self.dropout)


class GPT2Attention(ModelCell):
    def __init__(self, config: GPT2Config, layer_idx: int, build: Build, prefix: str, proj_std: float):
        super().__init__(build.precision)
        h = config.hidden_size
        self.num_heads = config.num_heads
        self.head_dim = config.head_dim
        scaling = 1.0
        if config.scale_attn_weights:
            scaling = self.head_dim ** -0.5
        if config.scale_attn_by_inverse_layer_idx:
            scaling /= float(layer_idx + 1)
        self.scaling = scaling
        self.upcast = config.reorder_and_upcast_attn
        self.attn_dropout = config.attention_dropout_rate
        self.resid_dropout = config.hidden_dropout_rate
        self.dense1 = Linear(h, h, True, build, prefix + ".dense1")  # q
        self.dense2 = Linear(h, h, True, build, prefix + ".dense2")  # k
        self.dense3 = Linear(h, h, True, build, prefix + ".dense3")  # v
        self.projection = LinearInOut(h, h, build, prefix + ".projection", std=proj_std)
        self.layer_idx = layer_idx  # which layer of a KV cache this attention reads and writes

    def construct(self, x, mask, cache=None):
        """The output, with or without `cache` (a `KVCache`, updated in place)."""
        b, s, _ = x.shape
        q = self.dense1(x).reshape(b, s, self.num_heads, self.head_dim).swapaxes(1, 2)
        k = self.dense2(x).reshape(b, s, self.num_heads, self.head_dim).swapaxes(1, 2)
        v = self.dense3(x).reshape(b, s, self.num_heads, self.head_dim).swapaxes(1, 2)
        if cache is not None:
            k, v = cache.update(self.layer_idx, k, v)
        if self.upcast:
            # HF _upcast_and_reordered_attn: scores, mask and softmax in fp32, one cast at the end.
            scores = mint.matmul(q.astype(F32), k.astype(F32).swapaxes(2, 3)) * self.scaling
            scores = scores + mask.astype(F32)
            probs = self._r(mint.nn.functional.softmax(scores, dim=-1).astype(self.act))
        else:
            # HF eager_attention_forward: matmul, scale, mask, softmax, each in the activation dtype.
            scores = self._r(self._r(mint.matmul(q, k.swapaxes(2, 3))) * self.scaling)
            scores = self._r(scores + mask)
            probs = self._r(mint.nn.functional.softmax(scores.astype(F32), dim=-1).astype(self.act))
        probs = self._dropout(probs, self.attn_dropout)
        out = self._r(mint.matmul(probs, v))
        out = self.projection(out.swapaxes(1, 2).reshape(b, s, self.num_heads * self.head_dim))
        return self._dropout(out, self.resid_dropout)


class GPT2MLP(ModelCell):
    def __init__(self, config: GPT2Config, build: Build, prefix: str, proj_std: float):
        super().__init__(build.precision)
        h, i = config.hidden_size, config.inner_size
        self.mapping = LinearInOut(h, i, build, prefix + ".mapping")            # HF mlp.c_fc
        self.projection = LinearInOut(i, h, build, prefix + ".projection", std=proj_std)  # HF mlp.c_proj
        self.act_fn = Activation(config.hidden_act, build.precision, "hidden_act (HF activation_function)")
        self.dropout = config.hidden_dropout_rate

    def construct(self, x):
        return self._dropout(self.projection(self.act_fn(self.mapping(x))), self.dropout)


class GPT2Block(ModelCell):
    def __init__(self, config: GPT2Config, layer_idx: int, build: Build, prefix: str):
        super().__init__(build.precision)
        # HF's GPT-2 scheme: residual-path projections start at std / sqrt(2 * n_layer).
        proj_std = config.initializer_range / math.sqrt(2 * config.num_layers)
        eps, h, ln = config.layer_norm_eps, config.hidden_size, ("gamma", "beta")
        self.layernorm1 = LayerNorm(h, eps, build, prefix + ".layernorm1", ln)
        self.attention = GPT2Attention(config, layer_idx, build, prefix + ".attention", proj_std)
        self.layernorm2 = LayerNorm(h, eps, build, prefix + ".layernorm2", ln)
        self.output = GPT2MLP(config, build, prefix + ".output", proj_std)

    def construct(self, x, mask, cache=None):
        """(output, attention output, MLP output), with or without `cache` (a `KVCache`)."""
        attn = self.attention(self.layernorm1(x), mask, cache)
        h = self._r(attn + x)
        mlp = self.output(self.layernorm2(h))
        return self._r(h + mlp), attn, mlp


class GPT2Model(ModelCell):
    def __init__(self, config: GPT2Config, build: Build, prefix: str = "backbone"):
        super().__init__(build.precision)
        self.seq_length = config.seq_length
        self.embedding = GPT2Embedding(config, build, prefix + ".embedding")
        self.blocks = nn.CellList(
            [GPT2Block(config, i, build, f"{prefix}.blocks.{i}") for i in range(config.num_layers)]
        )
        self.layernorm = LayerNorm(config.hidden_size, config.layer_norm_eps, build, prefix + ".layernorm",
                                   ("gamma", "beta"))
        self.mask = CausalMask(build)

    def construct(self, input_ids, attention_mask=None, output_hidden_states=False, word_table=None, cache=None,
                  position_ids=None):
        """(final hidden, hidden states), with or without `cache` (a `KVCache`; `attention_mask`
        then covers its slots). `position_ids` (b, s): each token's position (default 0 .. s - 1)."""
        b, s = input_ids.shape
        if s > self.seq_length:
            raise ValueError(f"sequence length {s} exceeds the position table ({self.seq_length})")
        h = self.embedding(input_ids, word_table, position_ids)
        mask = self.mask(b, s, attention_mask, cache=cache)
        hidden = (h,)
        for block in self.blocks:
            h, attn, mlp = block(h, mask, cache)
            hidden = self._keep_hidden(hidden, output_hidden_states, attn, mlp, h)
        h = self.layernorm(h)
        return h, hidden + (h,)


class GPT2LMHeadModel(CausalLM):
    """HF GPT2LMHeadModel in MindSpore; see the module docstring for the call.

    `seed` makes the HF-style initialisation reproducible: normal(0, initializer_range)
    for embeddings and dense weights, normal(0, initializer_range / sqrt(2 * num_layers))
    for the two residual projections, zeros for biases, ones/zeros for LayerNorms.
    """

    config_class = GPT2Config
    LEARNED_POSITIONS = True  # positions past seq_length have no embedding (a generation limit)
    DECODER = "backbone"
    HIDDEN = ("backbone.embedding", "backbone.blocks", ("attention", "output"), "backbone.layernorm")

    def __init__(self, config: GPT2Config, seed: int = 0):
        build = Build(config.compute_dtype, config.initializer_range, seed)
        if config.add_cross_attention:
            raise MigrateError("add_cross_attention is not supported by the bundled GPT-2")
        super().__init__(build.precision)
        self.backbone = GPT2Model(config, build, "backbone")
        self._complete(config, build)

    def word_embedding(self):
        return self.backbone.embedding.word_embedding
