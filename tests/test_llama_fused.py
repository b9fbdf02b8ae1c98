"""Bundled Llama with MindFormers' fused layout (qkv_concat: attention.w_qkv, feed_forward.w_gate_hidden).

Tiny HF Llamas (config + torch.manual_seed, no downloads): q/k/v and gate/up are
fused with migrate.transforms, loaded into the bundled model with qkv_concat=True,
and its logits and gradients compared with HF's. Run with -s for the figures.
"""
from __future__ import annotations

import functools

import mindspore as ms
import numpy as np
import pytest
import torch

from hf_fixtures import build_hf_model
from migrate.models.config import LlamaConfig
from migrate.models.llama import LlamaForCausalLM
from migrate.transforms import LAYOUTS

QKV, GATE_UP = LAYOUTS["qkv_groups"], LAYOUTS["interleave_rows"]
MODES = {"pynative": ms.PYNATIVE_MODE, "graph": ms.GRAPH_MODE}
# hf_fixtures variants: 4 heads, hidden 32, 2 layers; "bias" is GQA (2 kv heads) with attention and MLP biases.
CASES = {
    "mha": ("mha", {}),
    "gqa": ("gqa", {}),
    "mha_bias": ("mha", dict(attention_bias=True, mlp_bias=True)),
    "gqa_bias": ("bias", {}),
}
TOP = {  # HF name -> bundled name, outside the layers
    "model.embed_tokens.weight": "model.tok_embeddings.embedding_weight",
    "model.norm.weight": "model.norm_out.weight",
    "lm_head.weight": "lm_head.weight",
}
LAYER = {  # HF suffix -> bundled suffix inside model.layers.N, for the tensors that stay unfused
    "input_layernorm.weight": "attention_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.o_proj.weight": "attention.wo.weight",
    "self_attn.o_proj.bias": "attention.wo.bias",
    "mlp.down_proj.weight": "feed_forward.w2.weight",
    "mlp.down_proj.bias": "feed_forward.w2.bias",
}
# Fused bundled suffix -> (layout, HF suffixes in the layout's source order).
FUSED = {
    "attention.w_qkv.{p}": (QKV, ["self_attn.q_proj.{p}", "self_attn.k_proj.{p}", "self_attn.v_proj.{p}"]),
    "feed_forward.w_gate_hidden.{p}": (GATE_UP, ["mlp.gate_proj.{p}", "mlp.up_proj.{p}"]),
}


def ms_config(hf_cfg, qkv_concat: bool = True) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=hf_cfg.vocab_size, hidden_size=hf_cfg.hidden_size, intermediate_size=hf_cfg.intermediate_size,
        num_layers=hf_cfg.num_hidden_layers, num_heads=hf_cfg.num_attention_heads,
        n_kv_heads=hf_cfg.num_key_value_heads, seq_length=hf_cfg.max_position_embeddings,
        rms_norm_eps=hf_cfg.rms_norm_eps, theta=hf_cfg.rope_parameters["rope_theta"],
        tie_word_embeddings=hf_cfg.tie_word_embeddings, qkv_has_bias=hf_cfg.attention_bias,
        out_proj_has_bias=hf_cfg.attention_bias, mlp_bias=hf_cfg.mlp_bias, qkv_concat=qkv_concat,
    )


def fused_state(hf_state: dict[str, np.ndarray], cfg: LlamaConfig) -> dict[str, np.ndarray]:
    """HF tensors -> bundled fused names, fusing q/k/v and gate/up with the transforms."""
    out = {}
    for name, value in hf_state.items():
        if name in TOP:
            out[TOP[name]] = value
        elif name.startswith("model.layers."):
            _, _, i, suffix = name.split(".", 3)
            if suffix in LAYER:
                out[f"model.layers.{i}.{LAYER[suffix]}"] = value
    for i in range(cfg.num_layers):
        layer = f"model.layers.{i}."
        for target, (layout, sources) in FUSED.items():
            for p in ("weight", "bias"):
                names = [layer + s.format(p=p) for s in sources]
                if all(n in hf_state for n in names):
                    (out[layer + target.format(p=p)],) = layout.forward([hf_state[n] for n in names], cfg)
    return out


def unfuse_grads(ms_grads: dict[str, np.ndarray], cfg: LlamaConfig) -> dict[str, np.ndarray]:
    """Fused-name gradients -> HF names, splitting fused ones with the inverse transforms."""
    back = {hf: ms_grads[ms_name] for hf, ms_name in TOP.items() if ms_name in ms_grads}
    for i in range(cfg.num_layers):
        for hf_suffix, ms_suffix in LAYER.items():
            if f"model.layers.{i}.{ms_suffix}" in ms_grads:
                back[f"model.layers.{i}.{hf_suffix}"] = ms_grads[f"model.layers.{i}.{ms_suffix}"]
    for i in range(cfg.num_layers):
        layer = f"model.layers.{i}."
        for target, (layout, sources) in FUSED.items():
            for p in ("weight", "bias"):
                if layer + target.format(p=p) in ms_grads:
                    parts = layout.inverse([ms_grads[layer + target.format(p=p)]], cfg)
                    back.update({layer + s.format(p=p): g for s, g in zip(sources, parts, strict=True)})
    return back


def build_hf(case: str, seed: int = 0):
    variant, overrides = CASES[case]
    model = build_hf_model(variant, seed=seed, **overrides)
    model.config._attn_implementation = "eager"  # HF's reference path: fp32 softmax, additive mask
    return model


def load(model: LlamaForCausalLM, state: dict[str, np.ndarray]) -> None:
    params = {p.name: p for p in model.get_parameters()}
    assert set(params) == set(state), set(params) ^ set(state)
    for name, value in state.items():
        assert tuple(params[name].shape) == value.shape, name
        params[name].set_data(ms.Tensor(value).astype(params[name].dtype))


def ids_for(vocab: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, vocab, size=(2, 12), dtype=np.int64)


@functools.cache
def case(name: str):
    hf_model = build_hf(name)
    cfg = ms_config(hf_model.config)
    hf_state = {k: v.detach().numpy() for k, v in hf_model.state_dict().items()}
    model = LlamaForCausalLM(cfg)
    load(model, fused_state(hf_state, cfg))
    ids = ids_for(cfg.vocab_size)
    with torch.no_grad():
        out = hf_model(input_ids=torch.from_numpy(ids), labels=torch.from_numpy(ids))
    return model, hf_state, ids, out.logits.numpy(), float(out.loss)


def run(model, ids):
    t = ms.Tensor(ids.astype(np.int32))
    logits, loss, _ = model(t, None, t)
    return logits.asnumpy(), float(loss.asnumpy())


def test_parameter_names_and_shapes():
    model, hf_state, *_ = case("gqa_bias")
    cfg = model.config
    shapes = {p.name: tuple(p.shape) for p in model.get_parameters()}
    hd, nh, nkv, i = cfg.head_dim, cfg.num_heads, cfg.n_kv_heads, cfg.intermediate_size
    assert shapes["model.layers.0.attention.w_qkv.weight"] == ((nh + 2 * nkv) * hd, cfg.hidden_size)
    assert shapes["model.layers.0.attention.w_qkv.bias"] == ((nh + 2 * nkv) * hd,)
    assert shapes["model.layers.1.feed_forward.w_gate_hidden.weight"] == (2 * i, cfg.hidden_size)
    assert shapes["model.layers.1.feed_forward.w_gate_hidden.bias"] == (2 * i,)
    assert not any(n.split(".")[-2] in ("wq", "wk", "wv", "w1", "w3") for n in shapes)
    unfused = {p.name for p in LlamaForCausalLM(ms_config(build_hf("gqa_bias").config, False)).get_parameters()}
    renamed = {n.replace("w_qkv", "wq").replace("w_gate_hidden", "w1") for n in shapes}
    assert renamed <= unfused and len(unfused) - len(shapes) == 6 * cfg.num_layers  # wk, wv, w3 + biases
    # The config field round-trips through model.yaml's dict.
    assert LlamaConfig.from_dict(cfg.to_dict()).qkv_concat is True


@pytest.mark.slow
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("name", list(CASES))
def test_logits_match_hf(name, mode):
    model, _, ids, hf_logits, hf_loss = case(name)
    ms.set_context(mode=MODES[mode])
    logits, loss = run(model, ids)
    max_abs = float(np.abs(logits - hf_logits).max())
    loss_rel = abs(loss - hf_loss) / hf_loss
    print(f"\n[fused {name:>8} {mode:>8}] logits max|diff| {max_abs:.2e}  loss rel diff {loss_rel:.2e}")
    assert max_abs <= 1e-5
    assert loss_rel <= 1e-6


def test_fused_matches_unfused_model():
    """Same weights, fused or not: the bundled model gives the same logits."""
    model, hf_state, ids, *_ = case("gqa_bias")
    cfg = ms_config(build_hf("gqa_bias").config, qkv_concat=False)
    plain = LlamaForCausalLM(cfg)
    params = {p.name: p for p in plain.get_parameters()}
    state = fused_state(hf_state, model.config)
    grads_like = unfuse_grads(state, model.config)  # fused names -> HF names via the inverse transforms
    assert set(grads_like) == set(hf_state)
    assert all(np.array_equal(grads_like[n], hf_state[n]) for n in hf_state)
    for name, value in state.items():
        if name in params:
            params[name].set_data(ms.Tensor(value))
    for i in range(cfg.num_layers):
        for p in ("weight", "bias"):
            layer = f"model.layers.{i}."
            for ms_s, hf_s in (("attention.wq", "self_attn.q_proj"), ("attention.wk", "self_attn.k_proj"),
                               ("attention.wv", "self_attn.v_proj"), ("feed_forward.w1", "mlp.gate_proj"),
                               ("feed_forward.w3", "mlp.up_proj")):
                params[f"{layer}{ms_s}.{p}"].set_data(ms.Tensor(hf_state[f"{layer}{hf_s}.{p}"]))
    a, _ = run(model, ids)
    b, _ = run(plain, ids)
    print(f"\n[fused vs unfused] logits max|diff| {np.abs(a - b).max():.2e}")
    assert np.abs(a - b).max() <= 1e-6


@pytest.mark.slow
@pytest.mark.parametrize("name,mode", [("gqa_bias", "graph"), ("mha", "pynative")])
def test_gradients_match_torch(name, mode):
    hf_model = build_hf(name, seed=1)
    cfg = ms_config(hf_model.config)
    hf_state = {k: v.detach().numpy().copy() for k, v in hf_model.state_dict().items()}
    model = LlamaForCausalLM(cfg)
    load(model, fused_state(hf_state, cfg))
    ids = ids_for(cfg.vocab_size, seed=1)

    hf_model.train()
    out = hf_model(input_ids=torch.from_numpy(ids), labels=torch.from_numpy(ids))
    out.loss.backward()
    hf_grads = {n: p.grad.numpy() for n, p in hf_model.named_parameters()}

    ms.set_context(mode=MODES[mode])
    model.set_train(True)
    params = model.trainable_params()

    def loss_fn(ids_, labels_):
        return model(ids_, None, labels_)[1]

    t = ms.Tensor(ids.astype(np.int32))
    loss, grads = ms.value_and_grad(loss_fn, None, params)(t, t)
    ms_grads = unfuse_grads({p.name: g.asnumpy() for p, g in zip(params, grads, strict=True)}, cfg)
    assert set(ms_grads) == set(hf_grads)
    worst, worst_name = max((float(np.abs(ms_grads[n] - hf_grads[n]).max()), n) for n in hf_grads)
    loss_rel = abs(float(loss.asnumpy()) - out.loss.item()) / out.loss.item()
    print(f"\n[fused backward {name} {mode}] grads max|diff| {worst:.2e} ({worst_name}), "
          f"loss rel diff {loss_rel:.2e}, max|grad| {max(np.abs(g).max() for g in hf_grads.values()):.2e}")
    assert worst <= 1e-5
    assert loss_rel <= 1e-6
