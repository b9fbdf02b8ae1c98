"""MindSpore BERT that reproduces HF transformers' BertModel and BertForMaskedLM.

    model = BertModel(config)
    last_hidden_state, pooled_output, hidden = model(input_ids, attention_mask=None,
                                                     token_type_ids=None, output_hidden_states=False)
    model = BertForMaskedLM(config)
    logits, loss, hidden = model(input_ids, attention_mask=None, token_type_ids=None,
                                 labels=None, output_hidden_states=False)

Post-LayerNorm encoder with bidirectional attention; `attention_mask` (1 keep, 0 pad)
becomes HF eager's additive mask (dtype min on padded keys); None means no mask, and
`token_type_ids` None means all zeros. BertForMaskedLM's loss is HF's: cross entropy
over every position (no shift), labels == ignore_token_id (-100) ignored.

Parameter names follow HF's module tree in this project's Llama vocabulary, and every
weight keeps torch.nn.Linear's (out, in) layout, so conversion is renames only:

    embeddings.{word,position,token_type}_embeddings.embedding_weight   (HF ...weight)
    embeddings.layernorm.weight/bias                                     (HF embeddings.LayerNorm)
    encoder.layer.N.attention.wq/wk/wv.weight/bias                       (HF attention.self.query/key/value)
    encoder.layer.N.attention.wo.weight/bias                             (HF attention.output.dense)
    encoder.layer.N.attention_norm.weight/bias                           (HF attention.output.LayerNorm)
    encoder.layer.N.feed_forward.w1.weight/bias                          (HF intermediate.dense)
    encoder.layer.N.feed_forward.w2.weight/bias                          (HF output.dense)
    encoder.layer.N.ffn_norm.weight/bias                                 (HF output.LayerNorm)
    pooler.dense.weight/bias                                             (BertModel only)
    cls.transform.dense.weight/bias, cls.transform.layernorm.weight/bias (HF cls.predictions.transform.*)
    cls.decoder.bias      (HF cls.predictions.bias; untied: cls.predictions.decoder.bias)
    cls.decoder.weight    (untied only; tied, the decoder uses the word-embedding table)

A standalone BertModel has no prefix (as HF's BertModel); inside BertForMaskedLM it sits
under `bert.` (no pooler, as HF).

`hidden` is None unless output_hidden_states is True: the embeddings output and each
layer's output (HF's hidden_states), plus, for BertForMaskedLM, the MLM transform's
output (`cls.transform`, the last normed tensor before the decoder). "detail" adds each
layer's attention output (wo, before residual and LayerNorm) and MLP output (w2, before
residual and LayerNorm); `hidden_names(...)` names the entries. Precision handling as
in `migrate.models.base` (fp32 exact; bf16/fp16 emulated on CPU).
"""
from __future__ import annotations

import mindspore as ms
from mindspore import mint, nn, ops

from migrate.errors import MigrateError
from migrate.models.base import MIN_VALUE, Build, ModelCell, hidden_names, name_parameters
from migrate.models.bert_config import BertConfig  # noqa: F401 (re-exported: mindspore-free for convert)
from migrate.models.common import Activation, Embedding, LayerNorm, Linear, masked_lm_loss, padding_mask


class BertEmbeddings(ModelCell):
    def __init__(self, config: BertConfig, build: Build, prefix: str):
        super().__init__(build.precision)
        h = config.hidden_size
        self.word_embeddings = Embedding(config.vocab_size, h, build, prefix + ".word_embeddings",
                                         padding_idx=config.pad_token_id)
        self.position_embeddings = Embedding(config.seq_length, h, build, prefix + ".position_embeddings")
        self.token_type_embeddings = Embedding(config.type_vocab_size, h, build, prefix + ".token_type_embeddings")
        self.layernorm = LayerNorm(h, config.layer_norm_eps, build, prefix + ".layernorm")
        self.dropout = config.hidden_dropout_prob

    def construct(self, input_ids, token_type_ids=None, word_table=None):
        seq_len = input_ids.shape[1]
        if token_type_ids is None:
            token_type_ids = input_ids * 0  # mint.zeros_like has no CPU kernel
        positions = ops.arange(0, seq_len, dtype=ms.int32)
        # HF order: (words + token types) + positions.
        h = self._r(self.word_embeddings(input_ids, word_table) + self.token_type_embeddings(token_type_ids))
        h = self._r(h + self.position_embeddings(positions).expand_dims(0))
        return self._dropout(self.layernorm(h), self.dropout)


class BertAttention(ModelCell):
    """Self-attention up to and including the output dense (wo); residual and
    LayerNorm are the layer's."""

    def __init__(self, config: BertConfig, build: Build, prefix: str):
        super().__init__(build.precision)
        h = config.hidden_size
        self.num_heads = config.num_heads
        self.head_dim = config.head_dim
        self.scaling = self.head_dim ** -0.5
        self.dropout = config.attention_probs_dropout_prob
        self.wq = Linear(h, h, True, build, prefix + ".wq")
        self.wk = Linear(h, h, True, build, prefix + ".wk")
        self.wv = Linear(h, h, True, build, prefix + ".wv")
        self.wo = Linear(h, h, True, build, prefix + ".wo")

    def construct(self, x, mask):
        b, s, _ = x.shape
        q = self.wq(x).reshape(b, s, self.num_heads, self.head_dim).swapaxes(1, 2)
        k = self.wk(x).reshape(b, s, self.num_heads, self.head_dim).swapaxes(1, 2)
        v = self.wv(x).reshape(b, s, self.num_heads, self.head_dim).swapaxes(1, 2)
        scores = self._r(self._r(mint.matmul(q, k.swapaxes(2, 3))) * self.scaling)
        if mask is not None:
            scores = self._r(scores + mask)
        probs = self._r(mint.nn.functional.softmax(scores.astype(ms.float32), dim=-1).astype(self.act))
        probs = self._dropout(probs, self.dropout)
        out = self._r(mint.matmul(probs, v))
        return self.wo(out.swapaxes(1, 2).reshape(b, s, self.num_heads * self.head_dim))


class BertFeedForward(ModelCell):
    def __init__(self, config: BertConfig, build: Build, prefix: str):
        super().__init__(build.precision)
        h, i = config.hidden_size, config.intermediate_size
        self.w1 = Linear(h, i, True, build, prefix + ".w1")  # HF intermediate.dense
        self.w2 = Linear(i, h, True, build, prefix + ".w2")  # HF output.dense
        self.act_fn = Activation(config.hidden_act, build.precision)

    def construct(self, x):
        return self.w2(self.act_fn(self.w1(x)))


class BertLayer(ModelCell):
    def __init__(self, config: BertConfig, build: Build, prefix: str):
        super().__init__(build.precision)
        h, eps = config.hidden_size, config.layer_norm_eps
        self.attention = BertAttention(config, build, prefix + ".attention")
        self.attention_norm = LayerNorm(h, eps, build, prefix + ".attention_norm")  # HF attention.output.LayerNorm
        self.feed_forward = BertFeedForward(config, build, prefix + ".feed_forward")
        self.ffn_norm = LayerNorm(h, eps, build, prefix + ".ffn_norm")              # HF output.LayerNorm
        self.dropout = config.hidden_dropout_prob

    def construct(self, x, mask):
        attn = self._dropout(self.attention(x, mask), self.dropout)
        h = self.attention_norm(self._r(attn + x))
        mlp = self._dropout(self.feed_forward(h), self.dropout)
        return self.ffn_norm(self._r(mlp + h)), attn, mlp


class BertEncoder(nn.Cell):
    def __init__(self, config: BertConfig, build: Build, prefix: str):
        super().__init__()
        self.layer = nn.CellList([BertLayer(config, build, f"{prefix}.layer.{i}") for i in range(config.num_layers)])


class BertPooler(ModelCell):
    """HF BertPooler: dense + tanh on the first ([CLS]) token."""

    def __init__(self, config: BertConfig, build: Build, prefix: str):
        super().__init__(build.precision)
        self.dense = Linear(config.hidden_size, config.hidden_size, True, build, prefix + ".dense")

    def construct(self, h):
        return self._r(mint.tanh(self.dense(h[:, 0])))


class BertModel(ModelCell):
    """HF BertModel (encoder + optional pooler); see the module docstring for the call.

    `seed` makes the HF-style initialisation reproducible: normal(0, initializer_range)
    for embeddings (pad row zeroed) and dense weights, zeros for biases, ones/zeros for
    LayerNorms.
    """

    config_class = BertConfig
    OUTPUTS = ("last_hidden_state", "pooler_output")  # what construct returns before `hidden`, by HF's names
    # the cells the hidden entries come from (`CausalLM.HIDDEN`); no final norm: the last layer's output is it
    HIDDEN = ("embeddings", "encoder.layer", ("attention", "feed_forward"), None)

    def __init__(self, config: BertConfig, seed: int = 0, add_pooling_layer: bool = True,
                 _build: Build | None = None, _prefix: str = ""):
        if _build is None:
            _build = _model_build(config, seed)
        super().__init__(_build.precision)
        self.config = config
        self.embeddings = BertEmbeddings(config, _build, _prefix + "embeddings")
        self.encoder = BertEncoder(config, _build, _prefix + "encoder")
        self.pooler = BertPooler(config, _build, _prefix + "pooler") if add_pooling_layer else None
        self.max_positions = config.seq_length
        self.min_value = MIN_VALUE[_build.dtype]
        name_parameters(self)

    @staticmethod
    def hidden_names(config: BertConfig, detail: bool = False, prefix: str = "") -> list[str]:
        """Names of the `hidden` entries, in order, for output_hidden_states True or "detail"."""
        embedding, layers, parts, _ = BertModel.HIDDEN
        return hidden_names(prefix + embedding, prefix + layers, config.num_layers, parts, detail)

    def encode(self, input_ids, attention_mask=None, token_type_ids=None, output_hidden_states=False,
               word_table=None):
        """(last hidden state, hidden tuple) in the activation dtype."""
        b, s = input_ids.shape
        if s > self.max_positions:
            raise ValueError("sequence longer than the position table")
        h = self.embeddings(input_ids, token_type_ids, word_table)
        mask = None
        if attention_mask is not None:
            mask = padding_mask(b, s, attention_mask, self.min_value, self.act)
        hidden = (h,)
        for layer in self.encoder.layer:
            h, attn, mlp = layer(h, mask)
            hidden = self._keep_hidden(hidden, output_hidden_states, attn, mlp, h)
        return h, hidden

    def construct(self, input_ids, attention_mask=None, token_type_ids=None, output_hidden_states=False):
        h, hidden = self.encode(input_ids, attention_mask, token_type_ids, output_hidden_states)
        pooled = None
        if self.pooler is not None:
            pooled = self.pooler(h)
        return self._hand_out(h), self._hand_out(pooled), self._hidden_out(hidden, output_hidden_states)


def _model_build(config: BertConfig, seed: int) -> Build:
    build = Build(config.compute_dtype, config.initializer_range, seed)
    if config.is_decoder or config.add_cross_attention:
        raise MigrateError("is_decoder / add_cross_attention are not supported by the bundled BERT")
    return build


class BertPredictionHeadTransform(ModelCell):
    def __init__(self, config: BertConfig, build: Build, prefix: str):
        super().__init__(build.precision)
        h = config.hidden_size
        self.dense = Linear(h, h, True, build, prefix + ".dense")
        self.act_fn = Activation(config.hidden_act, build.precision)
        self.layernorm = LayerNorm(h, config.layer_norm_eps, build, prefix + ".layernorm")

    def construct(self, x):
        return self.layernorm(self.act_fn(self.dense(x)))


class BertDecoder(ModelCell):
    """Logits = x @ W.T + bias; W is the word-embedding table when tied (no parameter here)."""

    def __init__(self, config: BertConfig, build: Build, prefix: str):
        super().__init__(build.precision)
        if not config.tie_word_embeddings:
            self.weight = build.normal(prefix + ".weight", (config.vocab_size, config.hidden_size))
        self.bias = build.const(prefix + ".bias", (config.vocab_size,), "zeros")

    def construct(self, x, weight):
        return self._r(mint.nn.functional.linear(x, weight, self._p(self.bias)))


class BertMLMHead(nn.Cell):
    """HF BertOnlyMLMHead / BertLMPredictionHead."""

    def __init__(self, config: BertConfig, build: Build, prefix: str):
        super().__init__()
        self.transform = BertPredictionHeadTransform(config, build, prefix + ".transform")
        self.decoder = BertDecoder(config, build, prefix + ".decoder")


class BertForMaskedLM(ModelCell):
    """HF BertForMaskedLM; see the module docstring for the call."""

    config_class = BertConfig
    HIDDEN = ("bert.embeddings", "bert.encoder.layer", ("attention", "feed_forward"), "cls.transform")

    def __init__(self, config: BertConfig, seed: int = 0):
        build = _model_build(config, seed)
        super().__init__(build.precision)
        self.config = config
        self.vocab_size = config.vocab_size
        self.ignore_index = config.ignore_token_id
        self.tie_word_embeddings = config.tie_word_embeddings
        self.bert = BertModel(config, seed, add_pooling_layer=False, _build=build, _prefix="bert.")
        self.cls = BertMLMHead(config, build, "cls")
        name_parameters(self)

    @staticmethod
    def hidden_names(config: BertConfig, detail: bool = False) -> list[str]:
        """Names of the `hidden` entries, in order, for output_hidden_states True or "detail"."""
        return BertModel.hidden_names(config, detail, "bert.") + ["cls.transform"]

    def construct(self, input_ids, attention_mask=None, token_type_ids=None, labels=None,
                  output_hidden_states=False):
        if self.tie_word_embeddings:
            # One cast shared by lookup and decoder (see GPT2LMHeadModel.construct).
            table = self.bert.embeddings.word_embeddings.table()
            h, hidden = self.bert.encode(input_ids, attention_mask, token_type_ids, output_hidden_states, table)
        else:
            h, hidden = self.bert.encode(input_ids, attention_mask, token_type_ids, output_hidden_states)
            table = self._p(self.cls.decoder.weight)
        t = self.cls.transform(h)
        logits = self.cls.decoder(t, table)
        loss = None
        if labels is not None:
            # HF's CrossEntropyLoss runs in the logits dtype: one rounding of the result.
            loss = self._r(masked_lm_loss(logits, labels, self.vocab_size, self.ignore_index))
        if output_hidden_states:
            hidden = hidden + (t,)
        return self._hand_out(logits), loss, self._hidden_out(hidden, output_hidden_states)
