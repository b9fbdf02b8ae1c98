"""Bundled MindSpore GPT-2 vs HF transformers' GPT2LMHeadModel, on tiny random models.

Each HF model is built here from a config and torch.manual_seed (no downloads); its
weights are copied into the MindSpore model by the helpers below (HF's fused Conv1D
c_attn split into q/k/v and transposed; the other Conv1D weights keep their (in, out)
layout, which is MindFormers' for projection/mapping). Run with -s to see the figures.
"""
from __future__ import annotations

import functools

import mindspore as ms
import numpy as np
import pytest
import torch
import transformers

from migrate.errors import MigrateError
from migrate.models.gpt2 import GPT2Config, GPT2LMHeadModel

BATCH, SEQ, VOCAB = 2, 16, 128
MODES = {"pynative": ms.PYNATIVE_MODE, "graph": ms.GRAPH_MODE}

BASE = dict(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64, initializer_range=0.1,
            bos_token_id=1, eos_token_id=2)
CONFIGS = {
    "base": {},
    "padded": {},
    # 1 / (layer_idx + 1) alone (scale_attn_weights off); with the default scaling it
    # is in the backward test.
    "layer_scaled": dict(scale_attn_weights=False, scale_attn_by_inverse_layer_idx=True),
    "upcast": dict(reorder_and_upcast_attn=True),
    "gelu_untied": dict(activation_function="gelu", n_inner=48, layer_norm_epsilon=1e-3, tie_word_embeddings=False),
}

# HF GPT2Config field -> bundled GPT2Config field.
CONFIG_MAP = {
    "vocab_size": "vocab_size", "n_embd": "hidden_size", "n_layer": "num_layers", "n_head": "num_heads",
    "n_inner": "intermediate_size", "n_positions": "seq_length", "layer_norm_epsilon": "layer_norm_eps",
    "activation_function": "hidden_act", "embd_pdrop": "embedding_dropout_prob",
    "resid_pdrop": "hidden_dropout_rate", "attn_pdrop": "attention_dropout_rate",
    "scale_attn_weights": "scale_attn_weights", "scale_attn_by_inverse_layer_idx": "scale_attn_by_inverse_layer_idx",
    "reorder_and_upcast_attn": "reorder_and_upcast_attn", "tie_word_embeddings": "tie_word_embeddings",
    "initializer_range": "initializer_range", "bos_token_id": "bos_token_id", "eos_token_id": "eos_token_id",
    "pad_token_id": "pad_token_id",
}


def build_hf(fields: dict, seed: int = 0) -> transformers.GPT2LMHeadModel:
    cfg = transformers.GPT2Config(**{**BASE, **fields})
    cfg._attn_implementation = "eager"  # HF's reference path: explicit additive mask
    torch.manual_seed(seed)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    # LayerNorms start at ones/zeros and biases at zeros: randomise them so a swapped
    # or dropped one cannot hide behind a neutral value.
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".ln_" in name and name.endswith(".weight"):
                param.add_(0.1 * torch.randn_like(param))
            elif name.endswith(".bias"):
                param.copy_(0.05 * torch.randn_like(param))
    return model


def ms_config(hf_cfg, compute_dtype: str = "float32") -> GPT2Config:
    fields = {ms_key: getattr(hf_cfg, hf_key) for hf_key, ms_key in CONFIG_MAP.items()}
    return GPT2Config.from_dict({**fields, "compute_dtype": compute_dtype})


# ---- weight transforms, HF -> MindSpore (the converter's job; written out here for the test)

def split_c_attn(value: np.ndarray) -> list[np.ndarray]:
    """HF Conv1D c_attn weight (in, 3*out) or bias (3*out,) -> q, k, v: thirds of the
    output axis; weights transposed to torch.nn.Linear's (out, in)."""
    parts = np.split(value, 3, axis=-1)
    return [np.ascontiguousarray(p.T) if p.ndim == 2 else p for p in parts]


def param_map(cfg: GPT2Config) -> list[tuple[str, str, int | None]]:
    """(HF name, MindSpore name, third of c_attn or None) for every MindSpore parameter."""
    rows = [("transformer.wte.weight", "backbone.embedding.word_embedding.embedding_table", None),
            ("transformer.wpe.weight", "backbone.embedding.position_embedding.embedding_table", None),
            ("transformer.ln_f.weight", "backbone.layernorm.gamma", None),
            ("transformer.ln_f.bias", "backbone.layernorm.beta", None)]
    if not cfg.tie_word_embeddings:
        rows.append(("lm_head.weight", "lm_head.weight", None))
    for i in range(cfg.num_layers):
        hf, ms_ = f"transformer.h.{i}.", f"backbone.blocks.{i}."
        for kind in ("weight", "bias"):
            rows += [(f"{hf}attn.c_attn.{kind}", f"{ms_}attention.dense{j + 1}.{kind}", j) for j in range(3)]
            rows += [(f"{hf}attn.c_proj.{kind}", f"{ms_}attention.projection.{kind}", None),
                     (f"{hf}mlp.c_fc.{kind}", f"{ms_}output.mapping.{kind}", None),
                     (f"{hf}mlp.c_proj.{kind}", f"{ms_}output.projection.{kind}", None)]
        for hf_ln, ms_ln in (("ln_1", "layernorm1"), ("ln_2", "layernorm2")):
            rows += [(f"{hf}{hf_ln}.weight", f"{ms_}{ms_ln}.gamma", None),
                     (f"{hf}{hf_ln}.bias", f"{ms_}{ms_ln}.beta", None)]
    return rows


def to_numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().float().numpy()


def hf_to_ms(arrays: dict[str, np.ndarray], cfg: GPT2Config) -> dict[str, np.ndarray]:
    """MindSpore name -> array, from HF name -> array (parameters or their gradients)."""
    out = {}
    for hf_name, ms_name, third in param_map(cfg):
        value = arrays[hf_name]
        out[ms_name] = split_c_attn(value)[third] if third is not None else value
    return out


def load_into(ms_model: GPT2LMHeadModel, hf_model, cfg: GPT2Config) -> None:
    state = {k: to_numpy(v) for k, v in hf_model.state_dict().items()}
    params = dict(ms_model.parameters_and_names())
    values = hf_to_ms(state, cfg)
    assert set(values) == set(params), "MindSpore parameter names differ from the table"
    consumed = {hf for hf, _, _ in param_map(cfg)}
    # GPT-2 ties lm_head to wte: HF's state dict carries it, the bundled model does not.
    assert set(state) - consumed == ({"lm_head.weight"} if cfg.tie_word_embeddings else set())
    for name, value in values.items():
        assert tuple(params[name].shape) == value.shape, name
        params[name].set_data(ms.Tensor(value).astype(params[name].dtype))


def batch(seed: int = 0, padded: bool = False):
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, VOCAB, size=(BATCH, SEQ), dtype=np.int64)
    mask = np.ones((BATCH, SEQ), dtype=np.int64)
    if padded:
        mask[0, :4] = 0   # left padding: rows 0..3 of sample 0 attend to nothing
        mask[1, -3:] = 0  # right padding
        ids[mask == 0] = 0
    labels = np.where(mask == 1, ids, -100)
    if padded:
        labels[0, :5] = -100  # HF's output at a fully-masked row is ill-defined: keep it out
    return ids, mask, labels


@functools.lru_cache(maxsize=None)
def case(name: str):
    """(HF model, MindSpore model, inputs, HF logits, HF loss), built once per config."""
    hf_model = build_hf(CONFIGS[name])
    cfg = ms_config(hf_model.config)
    ms_model = GPT2LMHeadModel(cfg)
    load_into(ms_model, hf_model, cfg)
    padded = name == "padded"
    ids, mask, labels = batch(padded=padded)
    with torch.no_grad():
        out = hf_model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask) if padded else None,
                       labels=torch.from_numpy(labels))
    return hf_model, ms_model, (ids, mask, labels), to_numpy(out.logits), float(out.loss)


def run_ms(ms_model, ids, mask, labels, use_mask: bool, **kwargs):
    return ms_model(ms.Tensor(ids.astype(np.int32)), ms.Tensor(mask.astype(np.int32)) if use_mask else None,
                    ms.Tensor(labels.astype(np.int32)) if labels is not None else None, **kwargs)


@pytest.mark.parametrize("name,mode", [(n, "pynative") for n in CONFIGS] + [("padded", "graph")])
def test_matches_hf(name, mode):
    _, ms_model, (ids, mask, labels), hf_logits, hf_loss = case(name)
    ms.set_context(mode=MODES[mode])
    padded = name == "padded"
    logits, loss, hidden = run_ms(ms_model, ids, mask, labels, padded)
    assert hidden is None
    keep = mask.astype(bool) if padded else np.ones(ids.shape, bool)
    max_abs = float(np.abs(logits.asnumpy() - hf_logits)[keep].max())
    loss_rel = abs(float(loss.asnumpy()) - hf_loss) / abs(hf_loss)
    print(f"\n[gpt2 {name:>17} {mode:>8}] logits max|diff| {max_abs:.2e}  loss rel diff {loss_rel:.2e}"
          f"  (|logits| max {np.abs(hf_logits).max():.2f}, loss {hf_loss:.4f})")
    assert max_abs <= 1e-5
    assert loss_rel <= 1e-6


def test_hidden_states_and_detail_match_hf():
    hf_model, ms_model, (ids, mask, _), _, _ = case("base")
    cfg = ms_model.config
    captured = {}
    hooks = []
    for i, block in enumerate(hf_model.transformer.h):
        hooks.append(block.attn.register_forward_hook(
            lambda m, a, out, i=i: captured.__setitem__(f"backbone.blocks.{i}.attention", out[0])))
        hooks.append(block.mlp.register_forward_hook(
            lambda m, a, out, i=i: captured.__setitem__(f"backbone.blocks.{i}.output", out)))
    try:
        with torch.no_grad():
            out = hf_model(input_ids=torch.from_numpy(ids), output_hidden_states=True)
    finally:
        for h in hooks:
            h.remove()
    # HF: embeddings, blocks 0..N-2, ln_f (N+1 entries); ours adds block N-1 before ln_f.
    hf_hidden = [to_numpy(x) for x in out.hidden_states]
    names = GPT2LMHeadModel.hidden_names(cfg)
    _, _, hidden = run_ms(ms_model, ids, mask, None, False, output_hidden_states=True)
    assert len(hidden) == len(names) == cfg.num_layers + 2
    pairs = list(zip(hidden[:-2], hf_hidden[:-1])) + [(hidden[-1], hf_hidden[-1])]
    worst = max(float(np.abs(a.asnumpy() - b).max()) for a, b in pairs)

    detail_names = GPT2LMHeadModel.hidden_names(cfg, detail=True)
    _, _, detail = run_ms(ms_model, ids, mask, None, False, output_hidden_states="detail")
    assert len(detail) == len(detail_names) == 3 * cfg.num_layers + 2
    by_name = dict(zip(detail_names, detail))
    for key, ref in captured.items():
        worst = max(worst, float(np.abs(by_name[key].asnumpy() - to_numpy(ref)).max()))
    for a, b in zip(hidden, [by_name[n] for n in names]):
        assert np.array_equal(a.asnumpy(), b.asnumpy())
    print(f"\n[gpt2 hidden/detail] max|diff| vs HF {worst:.2e}")
    assert worst <= 1e-5


def test_backward_matches_torch_graph_mode():
    hf_model = build_hf(dict(scale_attn_by_inverse_layer_idx=True), seed=1)
    cfg = ms_config(hf_model.config)
    ms_model = GPT2LMHeadModel(cfg)
    load_into(ms_model, hf_model, cfg)
    ids, mask, labels = batch(seed=1, padded=True)
    # Dropout off on both sides (the configs' pdrop is 0.1): compare gradients, not masks.
    out = hf_model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                   labels=torch.from_numpy(labels))
    out.loss.backward()
    hf_loss = out.loss.item()
    hf_grads = hf_to_ms({n: to_numpy(p.grad) for n, p in hf_model.named_parameters()}, cfg)

    ms.set_context(mode=ms.GRAPH_MODE)
    params = ms_model.trainable_params()

    def loss_fn(ids_, mask_, labels_):
        return ms_model(ids_, mask_, labels_)[1]

    grad_fn = ms.value_and_grad(loss_fn, None, params)
    loss, grads = grad_fn(ms.Tensor(ids.astype(np.int32)), ms.Tensor(mask.astype(np.int32)),
                          ms.Tensor(labels.astype(np.int32)))
    worst, worst_name = 0.0, ""
    for p, g in zip(params, grads):
        diff = float(np.abs(g.asnumpy() - hf_grads[p.name]).max())
        if diff >= worst:
            worst, worst_name = diff, p.name
    loss_rel = abs(float(loss.asnumpy()) - hf_loss) / hf_loss
    print(f"\n[gpt2 backward graph] grads max|diff| {worst:.2e} ({worst_name}), loss rel diff {loss_rel:.2e}, "
          f"max|grad| {max(np.abs(g).max() for g in hf_grads.values()):.2e}")
    assert len(params) == len(hf_grads)
    assert worst <= 1e-5
    assert loss_rel <= 1e-6


def test_dropout_only_in_training():
    _, ms_model, (ids, mask, labels), hf_logits, _ = case("base")
    assert ms_model.config.attention_dropout_rate > 0
    ms_model.set_train(True)
    try:
        ms.set_seed(0)
        train_logits = run_ms(ms_model, ids, mask, None, False)[0].asnumpy()
    finally:
        ms_model.set_train(False)
    eval_logits = run_ms(ms_model, ids, mask, None, False)[0].asnumpy()
    assert np.abs(train_logits - hf_logits).max() > 1e-3
    assert np.abs(eval_logits - hf_logits).max() <= 1e-5


def test_bf16_tracks_torch():
    hf_model = build_hf({}, seed=2).to(torch.bfloat16)
    cfg = ms_config(hf_model.config, compute_dtype="bfloat16")
    ms_model = GPT2LMHeadModel(cfg)
    load_into(ms_model, hf_model, cfg)
    assert all(p.dtype == ms.bfloat16 for p in ms_model.get_parameters())
    ids, mask, labels = batch(seed=2)
    with torch.no_grad():
        out = hf_model(input_ids=torch.from_numpy(ids), labels=torch.from_numpy(labels))
    logits, loss, _ = run_ms(ms_model, ids, mask, labels, False)
    assert logits.dtype == ms.bfloat16
    a = logits.astype(ms.float32).asnumpy().ravel().astype(np.float64)
    b = to_numpy(out.logits).ravel().astype(np.float64)
    cos = float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))
    loss_rel = abs(float(loss.asnumpy()) - float(out.loss)) / float(out.loss)
    print(f"\n[gpt2 bf16 pynative] logits cosine {cos:.7f}, max|diff| {np.abs(a - b).max():.2e}, "
          f"bit-equal {np.mean(a == b):.1%}, loss rel diff {loss_rel:.2e}")
    assert cos >= 0.999
    # Measured: loss rel 3.7e-5 (at most 5.2e-5 over seeds 0-3), bit-equal 74.5 %. Skipping the
    # per-op rounding gives loss rel 2.1e-4 and 28.6 % bit-equal.
    assert loss_rel <= 1e-4
    assert np.mean(a == b) >= 0.5


def test_config_round_trip(tmp_path):
    cfg = ms_config(build_hf({}).config)
    cfg.extra["model_class"] = "migrate.models.gpt2:GPT2LMHeadModel"
    cfg.save(tmp_path / "model.yaml")
    back = GPT2Config.load(tmp_path)
    # n_inner=None stays None (so export writes back what HF said); the MLP width is 4 * hidden.
    assert back == cfg and back.intermediate_size is None and back.inner_size == 4 * cfg.hidden_size
    assert GPT2LMHeadModel.config_class is GPT2Config
    with pytest.raises(MigrateError, match="incomplete"):
        GPT2Config.from_dict({"vocab_size": 8})


def test_unsupported_settings_raise():
    base = dict(vocab_size=16, hidden_size=8, num_layers=1, num_heads=2)
    with pytest.raises(MigrateError, match="hidden_act"):
        GPT2LMHeadModel(GPT2Config(**base, hidden_act="quick_gelu"))
    with pytest.raises(MigrateError, match="compute_dtype"):
        GPT2LMHeadModel(GPT2Config(**base, compute_dtype="float64"))
    with pytest.raises(MigrateError, match="add_cross_attention"):
        GPT2LMHeadModel(GPT2Config(**base, add_cross_attention=True))
    with pytest.raises(MigrateError, match="multiple of num_heads"):
        GPT2Config(**{**base, "num_heads": 3})


def test_fresh_init_is_seeded_and_hf_like():
    cfg = GPT2Config(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, initializer_range=0.05)
    a = {n: p.asnumpy() for n, p in GPT2LMHeadModel(cfg, seed=3).parameters_and_names()}
    b = {n: p.asnumpy() for n, p in GPT2LMHeadModel(cfg, seed=3).parameters_and_names()}
    assert all(np.array_equal(a[n], b[n]) for n in a)
    assert np.all(a["backbone.layernorm.gamma"] == 1) and np.all(a["backbone.blocks.0.attention.dense1.bias"] == 0)
    assert abs(a["backbone.blocks.0.output.mapping.weight"].std() - 0.05) < 0.005
    assert abs(a["backbone.blocks.0.output.projection.weight"].std() - 0.05 / 2) < 0.003  # / sqrt(2 * 2 layers)
