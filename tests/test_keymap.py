"""The keymap is data: templates expand per layer, config maps both ways."""
import pytest
from hf_fixtures import hf_config

from migrate.errors import MigrateError
from migrate.keymap import Keymap, available


def test_llama_keymap_is_registered():
    assert "hf_llama" in available()


def test_pairs_expand_per_layer_and_drop_tied_head():
    km = Keymap.load("hf_llama")
    ms = km.hf_to_ms_config(hf_config("tied").to_dict())
    pairs, tied = km.pairs(ms)
    dst = {p.dst for p in pairs}
    assert "model.layers.1.feed_forward.w1.weight" in dst
    assert "lm_head.weight" not in dst
    assert [t.src for t in tied] == ["lm_head.weight"]
    # 2 layers x 9 per-layer tensors + embedding + final norm
    assert len(pairs) == 2 * 9 + 2


def test_bias_entries_follow_config_flags():
    km = Keymap.load("hf_llama")
    ms = km.hf_to_ms_config(hf_config("bias").to_dict())
    assert ms["qkv_has_bias"] is True and ms["out_proj_has_bias"] is True and ms["mlp_bias"] is True
    dst = {p.dst for p in km.pairs(ms)[0]}
    assert {"model.layers.0.attention.wo.bias", "model.layers.0.feed_forward.w2.bias"} <= dst


def test_config_round_trip_keeps_rope_parameters():
    km = Keymap.load("hf_llama")
    hf = hf_config("llama3_rope").to_dict()
    ms = km.hf_to_ms_config(hf)
    assert ms["theta"] == 500000.0
    assert ms["rope_scaling"]["rope_type"] == "llama3" and "rope_theta" not in ms["rope_scaling"]
    back = km.ms_to_hf_config(ms)
    assert back["rope_parameters"] == hf["rope_parameters"]
    assert back["num_hidden_layers"] == hf["num_hidden_layers"]


def test_unknown_keymap_names_known_ones():
    with pytest.raises(MigrateError, match="known: .*hf_llama"):
        Keymap.load("hf_nonexistent")
