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


def _write(folder, text: str):
    path = folder / "km.yaml"
    path.write_text(text)
    return str(path)


BASE_KEYMAP = """
family: test_rows
target: migrate.models.llama:LlamaForCausalLM
config: {}
vars: {p: "pre."}
params:
  "{p}a.{layer}.w": "x.{layer}.w"
  qkv:
    from: ["{p}q.{layer}", "{p}k.{layer}", "{p}v.{layer}"]
    to: "x.{layer}.qkv"
    layout: qkv_groups
  split:
    from: "{p}c"
    to: [c1, c2, c3]
    layout: [transpose, split_thirds]
  "{p}b": {to: b, when: "!tie_word_embeddings"}
ignore:
  - {name: "{p}buffer", when: flag}
"""


def test_fused_rows_vars_and_negated_conditions(tmp_path):
    km = Keymap.load(_write(tmp_path, BASE_KEYMAP))
    groups, tied = km.groups({"num_layers": 2, "tie_word_embeddings": False, "flag": True})
    by_dst = {g.dst: g for g in groups}
    assert by_dst[("x.1.qkv",)].src == ("pre.q.1", "pre.k.1", "pre.v.1")
    assert by_dst[("x.1.qkv",)].layout == "qkv_groups"
    assert by_dst[("c1", "c2", "c3")].layout == "transpose+split_thirds"
    assert ("b",) in by_dst and not tied
    assert km.ignored({"num_layers": 2, "flag": True}) == {"pre.buffer"}
    assert km.ignored({"num_layers": 2, "flag": False}) == set()
    # pairs() lists the renames only; fused rows have no single partner
    assert {(p.src, p.dst) for p in km.pairs({"num_layers": 1, "tie_word_embeddings": True})[0]} == {
        ("pre.a.0.w", "x.0.w")}


@pytest.mark.parametrize("row, message", [
    ("  bad: {from: [a, b], to: c}\n", "needs a layout"),
    ("  bad: {from: [a, b], to: c, layout: no_such_layout}\n", "unknown layout"),
    ("  bad: {from: [a], to: [c], layout: transpose, tied_to: z}\n", "tied_to applies to renames only"),
    # a target beyond the layout's outputs would count as filled and never be written
    ("  bad: {from: [q, k, v], to: [c, d], layout: qkv_groups}\n",
     r"layout qkv_groups maps 3 source\(s\) to 1 target\(s\); the row names 3 -> 2"),
    ("  bad: {from: [q, k], to: c, layout: qkv_groups}\n", r"the row names 2 -> 1"),
    ("  bad: {from: c, to: [c1, c2], layout: split_thirds}\n", r"the row names 1 -> 2"),
    ("  bad: {to: c, layout: split_thirds}\n", r"the row names 1 -> 1"),
])
def test_bad_fused_rows_are_refused(tmp_path, row, message):
    text = "family: t\ntarget: m:C\nconfig: {}\nparams:\n" + row
    with pytest.raises(MigrateError, match=message):
        Keymap.load(_write(tmp_path, text))


def test_targets_extend_and_rename():
    km = Keymap.load("hf_llama")
    assert list(km.targets()) == ["qkv_concat", "mcore"]
    mcore = km.with_target("mcore")
    assert mcore.target_name == "mcore" and mcore.constants["qkv_concat"] is True
    ms = mcore.hf_to_ms_config(hf_config("gqa").to_dict())
    names = mcore.checkpoint_names(ms)
    assert names["model.layers.1.attention.w_qkv.weight"] == "decoder.layers.1.self_attention.linear_qkv.weight"
    assert names["lm_head.weight"] == "output_layer.weight"
    layouts = {g.layout for g in mcore.groups(ms)[0]}
    assert layouts == {None, "qkv_groups", "interleave_rows"}
    # model.yaml records the target; a keymap re-read from it applies the same one
    again = Keymap.load("hf_llama").for_model({**ms, "keymap_target": "mcore"})
    assert again.target_name == "mcore"
    with pytest.raises(MigrateError, match="no target 'fused'"):
        km.with_target("fused")
