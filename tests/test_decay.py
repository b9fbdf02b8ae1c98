"""Weight-decay groups: HF Trainer's own rule on torch, the keymap carries it to MindSpore."""
import pytest
from transformers import Trainer
from transformers.models.llama.modeling_llama import LlamaRMSNorm
from transformers.pytorch_utils import ALL_LAYERNORM_LAYERS

from hf_fixtures import build_hf_model, hf_config
from migrate.errors import MigrateError
from migrate.keymap import Keymap
from migrate.models.config import LlamaConfig
from migrate.models.llama import LlamaForCausalLM as MsLlama
from migrate.train.decay import hf_decay_names, hf_name_decays, ms_decay_names


def trainer_decay(model) -> set[str]:
    """What HF Trainer.create_optimizer puts in the decayed group."""
    names = set(Trainer.get_decay_parameter_names(None, model))  # uses no Trainer state
    return {n for n, p in model.named_parameters() if n in names and p.requires_grad}


def ms_side(variant: str):
    keymap = Keymap.load("hf_llama")
    ms_config = LlamaConfig.from_dict(keymap.hf_to_ms_config(hf_config(variant).to_dict()))
    names = [p.name for p in MsLlama(ms_config).trainable_params()]
    return keymap, ms_config, names


@pytest.mark.parametrize("variant", ["mha", "bias", "tied"])
def test_hf_rule_is_trainers_rule(variant):
    model = build_hf_model(variant)
    decay = hf_decay_names(model)
    assert decay == trainer_decay(model)
    kept = set(dict(model.named_parameters())) - decay
    # Llama: norms (RMSNorm, excluded by name) and biases do not decay; everything else does.
    assert kept == {n for n in dict(model.named_parameters()) if n.endswith(("norm.weight", ".bias"))}
    assert {"model.norm.weight", "model.layers.0.input_layernorm.weight",
            "model.layers.1.post_attention_layernorm.weight"} <= kept
    assert "model.embed_tokens.weight" in decay
    assert ("lm_head.weight" in decay) == (variant != "tied")  # tied: one tensor, listed once


def test_llama_rmsnorm_is_not_a_layernorm_layer():
    # So HF's name patterns, not its layer-type rule, keep Llama's norms out of decay.
    assert LlamaRMSNorm not in ALL_LAYERNORM_LAYERS
    assert not hf_name_decays("model.layers.3.input_layernorm.weight") and not hf_name_decays("model.norm.weight")
    assert hf_name_decays("model.normalizer.weight") and hf_name_decays("model.layers.0.mlp.up_proj.weight")


@pytest.mark.parametrize("variant", ["mha", "bias", "tied"])
def test_mindspore_side_agrees_through_the_keymap(variant):
    model = build_hf_model(variant)
    keymap, ms_config, ms_names = ms_side(variant)
    ms_decay = ms_decay_names(ms_names, keymap, ms_config)
    active, _ = keymap.pairs(ms_config.to_dict())
    hf_decay = hf_decay_names(model)
    assert ms_decay == {p.dst for p in active if p.src in hf_decay}
    assert {n for n in ms_names if n not in ms_decay} == {
        n for n in ms_names if n.endswith(("attention_norm.weight", "ffn_norm.weight", "norm_out.weight", ".bias"))}
    # the golden run's own list gives the same answer
    assert ms_decay_names(ms_names, keymap, ms_config, hf_decay=hf_decay) == ms_decay


def test_extra_rule_applies_on_both_sides():
    model = build_hf_model("tied")
    keymap, ms_config, ms_names = ms_side("tied")
    hf = hf_decay_names(model, ["bias", "norm", "embedding"])
    ms = ms_decay_names(ms_names, keymap, ms_config, ["bias", "norm", "embedding"])
    assert "model.embed_tokens.weight" not in hf and "model.tok_embeddings.embedding_weight" not in ms
    assert len(hf) == len(ms) and hf_decay_names(model, []) == set(dict(model.named_parameters()))


def test_unpaired_mindspore_name_and_unknown_rule():
    keymap, ms_config, ms_names = ms_side("mha")
    with pytest.raises(MigrateError, match="pairs no HF parameter with MindSpore model.extra.weight"):
        ms_decay_names(ms_names + ["model.extra.weight"], keymap, ms_config)
    with pytest.raises(MigrateError, match="unknown no_decay rule 'biases'"):
        hf_name_decays("x.weight", ["biases"])
