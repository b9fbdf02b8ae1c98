"""The bundled MindSpore BERT: what only it has (defaults without mask or token types,
its config's round trip, the settings it refuses, its initialisation). What every
family shares -- BertModel's and BertForMaskedLM's outputs, hidden states, gradients
and low precision against HF, the weights carried through keymaps/hf_bert.yaml -- is
one parametrised test in tests/test_model_parity.py.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers

from family_models import BERT_MLM, case, hf_forward, ms_config, ms_forward, to_numpy
from migrate.errors import MigrateError
from migrate.models.bert import BertConfig, BertForMaskedLM, BertModel


def test_defaults_no_mask_no_token_types():
    hf_model, ms_model, inputs, _ = case("bert_mlm", "base")
    ids = {"input_ids": inputs["input_ids"]}
    with torch.no_grad():
        ref = to_numpy(hf_forward(hf_model, ids).logits)
    logits, loss, _ = ms_forward(ms_model, ids)
    assert loss is None
    assert np.abs(logits.asnumpy() - ref).max() <= 1e-5


def test_config_round_trip(tmp_path):
    cfg = ms_config(BERT_MLM, transformers.BertConfig(**BERT_MLM.base))
    cfg.extra["model_class"] = "migrate.models.bert:BertForMaskedLM"
    cfg.save(tmp_path / "model.yaml")
    assert BertConfig.load(tmp_path) == cfg
    assert BertModel.config_class is BertConfig and BertForMaskedLM.config_class is BertConfig


@pytest.mark.parametrize("model,change,message", [
    (BertForMaskedLM, dict(is_decoder=True), "is_decoder"),
    (BertModel, dict(hidden_act="mish"), "hidden_act"),
    (BertModel, dict(compute_dtype="int8"), "compute_dtype"),
])
def test_unsupported_settings_raise(model, change, message):
    small = dict(vocab_size=16, hidden_size=8, num_layers=1, num_heads=2, intermediate_size=16)
    with pytest.raises(MigrateError, match=message):
        model(BertConfig(**small, **change))


def test_fresh_init_is_seeded_and_hf_like():
    cfg = BertConfig(vocab_size=64, hidden_size=32, num_layers=1, num_heads=4, intermediate_size=64,
                     initializer_range=0.05, pad_token_id=2)
    a = {n: p.asnumpy() for n, p in BertForMaskedLM(cfg, seed=3).parameters_and_names()}
    b = {n: p.asnumpy() for n, p in BertForMaskedLM(cfg, seed=3).parameters_and_names()}
    assert all(np.array_equal(a[n], b[n]) for n in a)
    assert np.all(a["bert.embeddings.word_embeddings.embedding_weight"][2] == 0)  # HF zeroes the pad row
    assert np.all(a["cls.transform.layernorm.weight"] == 1) and np.all(a["cls.decoder.bias"] == 0)
    assert abs(a["bert.encoder.layer.0.feed_forward.w1.weight"].std() - 0.05) < 0.005
