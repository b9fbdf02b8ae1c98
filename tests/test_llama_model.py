"""The bundled MindSpore Llama: what only it has (calls without labels, bf16 gradients,
RoPE tables, the settings it refuses, its initialisation). What every family shares --
outputs, hidden states, gradients and low precision against HF -- is one parametrised
test in tests/test_model_parity.py, on the models of tests/family_models.py (each HF
model built from a config and torch.manual_seed, no downloads). Run with -s to see the
achieved figures.
"""
from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
import torch

from family_models import (
    LLAMA,
    build_hf,
    case,
    cosine,
    hf_forward,
    hf_in_ms_names,
    load_into,
    ms_config,
    ms_forward,
    ms_inputs,
    to_dtype,
    to_numpy,
)
from migrate.errors import MigrateError
from migrate.models.config import LlamaConfig
from migrate.models.llama import LlamaForCausalLM
from migrate.models.rope import rope_inv_freq


def test_no_labels_gives_no_loss():
    _, ms_model, inputs, ref = case("llama", "mha")
    logits, loss, hidden = ms_forward(ms_model, {**inputs, "labels": None})
    assert loss is None and hidden is None
    assert np.abs(logits.asnumpy() - ref["logits"]).max() <= 1e-5


def test_bf16_backward_tracks_torch():
    """bf16 training step on CPU (PyNative): grads in bf16, close to torch's bf16 grads."""
    hf_model = build_hf(LLAMA, dict(num_key_value_heads=2, tie_word_embeddings=True), seed=3)
    hf_model = to_dtype(hf_model, torch.bfloat16, LLAMA.low_precision.fp32_buffers)
    cfg = ms_config(LLAMA, hf_model.config, compute_dtype="bfloat16")
    ms_model = LlamaForCausalLM(cfg)
    load_into(ms_model, hf_model, LLAMA, cfg)
    inputs = LLAMA.batch(seed=3)
    hf_forward(hf_model, inputs).loss.backward()
    hf_grads = hf_in_ms_names(LLAMA, cfg, {n: to_numpy(p.grad) for n, p in hf_model.named_parameters()})

    params = ms_model.trainable_params()
    ids, _, labels = ms_inputs(ms_model, inputs)
    grad_fn = ms.value_and_grad(lambda ids_, labels_: ms_model(ids_, None, labels_)[1], None, params)
    _, grads = grad_fn(ids, labels)
    assert all(g.dtype == ms.bfloat16 for g in grads)
    ms_grads = {p.name: g.astype(ms.float32).asnumpy() for p, g in zip(params, grads, strict=True)}
    a = np.concatenate([ms_grads[n].ravel() for n in hf_grads])
    b = np.concatenate([hf_grads[n].ravel() for n in hf_grads])
    cos = cosine(a, b)
    print(f"\n[bf16 backward pynative] grads cosine {cos:.6f}")
    assert np.all(np.isfinite(a)) and cos >= 0.99


@pytest.mark.parametrize("name", ["mha", "linear_rope", "llama3_rope"])
def test_inv_freq_matches_hf(name):
    hf_model = case("llama", name)[0]
    cfg = ms_config(LLAMA, hf_model.config)
    inv_freq, scaling = rope_inv_freq(cfg.head_dim, cfg.theta, cfg.rope_scaling, cfg.seq_length)
    ref = hf_model.model.rotary_emb.inv_freq.numpy()
    assert scaling == hf_model.model.rotary_emb.attention_scaling
    np.testing.assert_array_max_ulp(inv_freq, ref, maxulp=1)


@pytest.mark.parametrize("change,message", [
    (dict(rope_scaling={"rope_type": "proportional", "factor": 2.0}),
     "default, linear, dynamic, yarn, longrope, llama3"),
    (dict(hidden_act="quick_gelu"), "hidden_act"),
    (dict(compute_dtype="float64"), "compute_dtype"),
])
def test_unsupported_settings_raise(change, message):
    small = dict(vocab_size=16, hidden_size=8, intermediate_size=16, num_layers=1, num_heads=2)
    with pytest.raises(MigrateError, match=message):
        LlamaForCausalLM(LlamaConfig(**small, **change))


def test_fresh_init_is_seeded_and_hf_like():
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=4,
                      qkv_has_bias=True, initializer_range=0.05, pad_token_id=2)
    a = {n: p.asnumpy() for n, p in LlamaForCausalLM(cfg, seed=3).parameters_and_names()}
    b = {n: p.asnumpy() for n, p in LlamaForCausalLM(cfg, seed=3).parameters_and_names()}
    c = LlamaForCausalLM(cfg, seed=4).model.tok_embeddings.embedding_weight.asnumpy()
    assert all(np.array_equal(a[n], b[n]) for n in a)
    assert not np.array_equal(a["model.tok_embeddings.embedding_weight"], c)
    assert np.all(a["model.tok_embeddings.embedding_weight"][2] == 0)  # HF zeroes the pad row
    assert np.all(a["model.norm_out.weight"] == 1) and np.all(a["model.layers.0.attention.wq.bias"] == 0)
    assert abs(a["model.layers.0.feed_forward.w1.weight"].std() - 0.05) < 0.005
    assert not np.array_equal(a["model.layers.0.attention.wq.weight"], a["model.layers.0.attention.wk.weight"])
