"""Parameter names and shapes of the bundled models, computed from the config alone.

`migrate convert` checks coverage against these before any data moves. They are
computed here, without MindSpore, because importing MindSpore costs about 0.5 GB
of resident memory, more than the conversion's whole memory budget (issue #7).
Each family's entry in `migrate.models.registry` names its function here;
`tests/test_shapes.py` holds every function to the model it describes: for each
family and config flag the names and shapes must equal those of the model built
by MindSpore. A model class without an entry (a user's own `module:Class`) is
built lazily with MindSpore instead (`registry.expected_shapes`).
"""
from __future__ import annotations

Shapes = dict[str, tuple[int, ...]]


def llama_shapes(c) -> Shapes:
    h, i, d = c.hidden_size, c.intermediate_size, c.head_dim
    q_out, kv_out = c.num_heads * d, c.n_kv_heads * d
    out: Shapes = {"model.tok_embeddings.embedding_weight": (c.vocab_size, h)}

    def linear(name: str, n_in: int, n_out: int, bias: bool) -> None:
        out[f"{name}.weight"] = (n_out, n_in)
        if bias:
            out[f"{name}.bias"] = (n_out,)

    for n in range(c.num_layers):
        layer = f"model.layers.{n}"
        out[f"{layer}.attention_norm.weight"] = (h,)
        if c.qkv_concat:
            linear(f"{layer}.attention.w_qkv", h, q_out + 2 * kv_out, c.qkv_has_bias)
        else:
            for proj, width in (("wq", q_out), ("wk", kv_out), ("wv", kv_out)):
                linear(f"{layer}.attention.{proj}", h, width, c.qkv_has_bias)
        linear(f"{layer}.attention.wo", q_out, h, c.out_proj_has_bias)
        out[f"{layer}.ffn_norm.weight"] = (h,)
        if c.qkv_concat:
            linear(f"{layer}.feed_forward.w_gate_hidden", h, 2 * i, c.mlp_bias)
            linear(f"{layer}.feed_forward.w2", i, h, c.mlp_bias)
        else:
            linear(f"{layer}.feed_forward.w1", h, i, c.mlp_bias)
            linear(f"{layer}.feed_forward.w2", i, h, c.mlp_bias)
            linear(f"{layer}.feed_forward.w3", h, i, c.mlp_bias)
    out["model.norm_out.weight"] = (h,)
    if not c.tie_word_embeddings:
        out["lm_head.weight"] = (c.vocab_size, h)
    return out


def gpt2_shapes(c) -> Shapes:
    h, i = c.hidden_size, c.inner_size
    out: Shapes = {
        "backbone.embedding.word_embedding.embedding_table": (c.vocab_size, h),
        "backbone.embedding.position_embedding.embedding_table": (c.seq_length, h),
    }
    for n in range(c.num_layers):
        block = f"backbone.blocks.{n}"
        out.update({
            f"{block}.layernorm1.gamma": (h,), f"{block}.layernorm1.beta": (h,),
            **{f"{block}.attention.{d}.{kind}": (h, h) if kind == "weight" else (h,)
               for d in ("dense1", "dense2", "dense3", "projection") for kind in ("weight", "bias")},
            f"{block}.layernorm2.gamma": (h,), f"{block}.layernorm2.beta": (h,),
            f"{block}.output.mapping.weight": (h, i), f"{block}.output.mapping.bias": (i,),  # Conv1D: (in, out)
            f"{block}.output.projection.weight": (i, h), f"{block}.output.projection.bias": (h,),
        })
    out["backbone.layernorm.gamma"], out["backbone.layernorm.beta"] = (h,), (h,)
    if not c.tie_word_embeddings:
        out["lm_head.weight"] = (c.vocab_size, h)
    return out


def _bert_encoder_shapes(c, prefix: str) -> Shapes:
    h, i = c.hidden_size, c.intermediate_size
    out: Shapes = {
        f"{prefix}embeddings.word_embeddings.embedding_weight": (c.vocab_size, h),
        f"{prefix}embeddings.position_embeddings.embedding_weight": (c.seq_length, h),
        f"{prefix}embeddings.token_type_embeddings.embedding_weight": (c.type_vocab_size, h),
        f"{prefix}embeddings.layernorm.weight": (h,), f"{prefix}embeddings.layernorm.bias": (h,),
    }
    for n in range(c.num_layers):
        layer = f"{prefix}encoder.layer.{n}"
        for proj in ("wq", "wk", "wv", "wo"):
            out[f"{layer}.attention.{proj}.weight"], out[f"{layer}.attention.{proj}.bias"] = (h, h), (h,)
        out[f"{layer}.attention_norm.weight"], out[f"{layer}.attention_norm.bias"] = (h,), (h,)
        out[f"{layer}.feed_forward.w1.weight"], out[f"{layer}.feed_forward.w1.bias"] = (i, h), (i,)
        out[f"{layer}.feed_forward.w2.weight"], out[f"{layer}.feed_forward.w2.bias"] = (h, i), (h,)
        out[f"{layer}.ffn_norm.weight"], out[f"{layer}.ffn_norm.bias"] = (h,), (h,)
    return out


def bert_shapes(c) -> Shapes:
    h = c.hidden_size
    return {**_bert_encoder_shapes(c, ""), "pooler.dense.weight": (h, h), "pooler.dense.bias": (h,)}


def bert_mlm_shapes(c) -> Shapes:
    h = c.hidden_size
    out = _bert_encoder_shapes(c, "bert.")
    out.update({"cls.transform.dense.weight": (h, h), "cls.transform.dense.bias": (h,),
                "cls.transform.layernorm.weight": (h,), "cls.transform.layernorm.bias": (h,)})
    if not c.tie_word_embeddings:
        out["cls.decoder.weight"] = (c.vocab_size, h)
    out["cls.decoder.bias"] = (c.vocab_size,)
    return out
