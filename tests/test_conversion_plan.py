"""The conversion plan: a keymap resolved once for one model config, read by convert,
export, `keymap check`, load_model, the decay pairing and `migrate diff`."""
import numpy as np
import pytest

from hf_fixtures import hf_config
from migrate.errors import MigrateError
from migrate.keymap import Keymap
from migrate.models.conversion_plan import ConversionPlan


def plan_for(variant: str, target: str | None = None, keymap: str = "hf_llama") -> ConversionPlan:
    km = Keymap.load(keymap).with_target(target)
    return ConversionPlan.for_source(km, km.hf_to_ms_config(hf_config(variant).to_dict()))


def test_the_config_records_class_and_target():
    plan = plan_for("gqa", "mcore")
    assert plan.config.extra == {"model_class": "migrate.models.llama:LlamaForCausalLM", "keymap_target": "mcore"}
    assert plan.model_class == plan.keymap.target and plan.config.qkv_concat


@pytest.mark.parametrize("variant,target", [("mha", None), ("tied", None), ("bias", "qkv_concat"), ("gqa", "mcore")])
def test_rows_fill_every_expected_parameter_once(variant, target):
    plan = plan_for(variant, target)
    filled = [d for g in plan.groups for d in g.dst]
    assert sorted(filled) == sorted(plan.expected) and set(plan.sources) == set(plan.expected)
    assert [t.src for t in plan.tied] == (["lm_head.weight"] if variant == "tied" else [])
    assert plan.ignored >= {"model.rotary_emb.inv_freq"}


def test_fused_sources_and_arrays_in_model_names():
    plan = plan_for("gqa", "qkv_concat")
    q, k, v = (f"model.layers.0.self_attn.{p}_proj.weight" for p in "qkv")
    assert plan.sources["model.layers.0.attention.w_qkv.weight"] == (q, k, v)
    c = plan.config
    arrays = {q: np.zeros((c.num_heads * c.head_dim, c.hidden_size), np.float32),
              k: np.ones((c.n_kv_heads * c.head_dim, c.hidden_size), np.float32),
              v: np.full((c.n_kv_heads * c.head_dim, c.hidden_size), 2, np.float32)}
    fused = plan.in_model_names(arrays)
    assert list(fused) == ["model.layers.0.attention.w_qkv.weight"]  # rows with a source missing are left out
    assert fused["model.layers.0.attention.w_qkv.weight"].shape == ((c.num_heads + 2 * c.n_kv_heads) * c.head_dim,
                                                                     c.hidden_size)


def test_checkpoint_names_must_name_every_parameter_once():
    assert plan_for("gqa").written_name()("lm_head.weight") == "lm_head.weight"
    plan = plan_for("gqa", "mcore")
    assert plan.written_name()("lm_head.weight") == "output_layer.weight"
    names = dict(plan.checkpoint_names)
    del names["lm_head.weight"]
    plan.checkpoint_names = names
    with pytest.raises(MigrateError, match="target mcore gives no checkpoint name to lm_head.weight"):
        plan.written_name()
    plan.checkpoint_names = {**names, "lm_head.weight": "output_layer.weight",
                             "model.norm_out.weight": "output_layer.weight"}
    with pytest.raises(MigrateError, match="target mcore writes output_layer.weight twice"):
        plan.written_name()


def test_convert_sets_the_compute_dtype_the_weights_decide():
    plan = plan_for("mha")
    rows = plan.groups
    plan.set_compute_dtype("bfloat16")
    assert plan.config.compute_dtype == plan.fields["compute_dtype"] == "bfloat16" and plan.groups is rows
