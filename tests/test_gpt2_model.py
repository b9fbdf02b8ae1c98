"""The bundled MindSpore GPT-2: what only it has (dropout, its config's round trip, the
settings it refuses, its initialisation). What every family shares -- outputs, hidden
states, gradients and low precision against HF's GPT2LMHeadModel, the weights carried
through keymaps/hf_gpt2.yaml (HF's fused Conv1D c_attn split into q/k/v and transposed)
-- is one parametrised test in tests/test_model_parity.py.
"""
from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest

from family_models import GPT2, build_hf, case, ms_config, ms_forward
from migrate.errors import MigrateError
from migrate.models.gpt2 import GPT2Config, GPT2LMHeadModel


def test_dropout_only_in_training():
    _, ms_model, inputs, ref = case("gpt2", "base")
    inputs = {**inputs, "labels": None}
    assert ms_model.config.attention_dropout_rate > 0
    ms_model.set_train(True)
    try:
        ms.set_seed(0)
        train_logits = ms_forward(ms_model, inputs)[0].asnumpy()
    finally:
        ms_model.set_train(False)
    eval_logits = ms_forward(ms_model, inputs)[0].asnumpy()
    assert np.abs(train_logits - ref["logits"]).max() > 1e-3
    assert np.abs(eval_logits - ref["logits"]).max() <= 1e-5


def test_config_round_trip(tmp_path):
    cfg = ms_config(GPT2, build_hf(GPT2, {}).config)
    cfg.extra["model_class"] = "migrate.models.gpt2:GPT2LMHeadModel"
    cfg.save(tmp_path / "model.yaml")
    back = GPT2Config.load(tmp_path)
    # n_inner=None stays None (so export writes back what HF said); the MLP width is 4 * hidden.
    assert back == cfg and back.intermediate_size is None and back.inner_size == 4 * cfg.hidden_size
    assert GPT2LMHeadModel.config_class is GPT2Config
    with pytest.raises(MigrateError, match="incomplete"):
        GPT2Config.from_dict({"vocab_size": 8})


@pytest.mark.parametrize("change,message", [
    (dict(hidden_act="quick_gelu"), "hidden_act"),
    (dict(compute_dtype="float64"), "compute_dtype"),
    (dict(add_cross_attention=True), "add_cross_attention"),
    (dict(num_heads=3), "multiple of num_heads"),  # refused by the config itself
])
def test_unsupported_settings_raise(change, message):
    small = dict(vocab_size=16, hidden_size=8, num_layers=1, num_heads=2)
    with pytest.raises(MigrateError, match=message):
        GPT2LMHeadModel(GPT2Config(**{**small, **change}))


def test_fresh_init_is_seeded_and_hf_like():
    cfg = GPT2Config(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, initializer_range=0.05)
    a = {n: p.asnumpy() for n, p in GPT2LMHeadModel(cfg, seed=3).parameters_and_names()}
    b = {n: p.asnumpy() for n, p in GPT2LMHeadModel(cfg, seed=3).parameters_and_names()}
    assert all(np.array_equal(a[n], b[n]) for n in a)
    assert np.all(a["backbone.layernorm.gamma"] == 1) and np.all(a["backbone.blocks.0.attention.dense1.bias"] == 0)
    assert abs(a["backbone.blocks.0.output.mapping.weight"].std() - 0.05) < 0.005
    assert abs(a["backbone.blocks.0.output.projection.weight"].std() - 0.05 / 2) < 0.003  # / sqrt(2 * 2 layers)
