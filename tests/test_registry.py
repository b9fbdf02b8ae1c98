"""The family registry: one entry per bundled model, read by convert, export, the planner
and the trainer; nothing else lists the bundled models. MindSpore-free."""
import pytest

from migrate.errors import MigrateError
from migrate.keymap import bundled_targets
from migrate.models.bert_config import BertConfig
from migrate.models.config import LlamaConfig
from migrate.models.gpt2_config import GPT2Config
from migrate.models.registry import (
    DEFAULT_MODEL_CLASS,
    FAMILIES,
    config_class,
    expected_shapes,
    family_of,
    load_model_config,
)

LLAMA = "migrate.models.llama:LlamaForCausalLM"
GPT2 = "migrate.models.gpt2:GPT2LMHeadModel"
BERT_MLM = "migrate.models.bert:BertForMaskedLM"
LLAMA2_7B = LlamaConfig(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_layers=32, num_heads=32)


def test_every_bundled_keymap_targets_a_registered_family():
    assert bundled_targets() <= set(FAMILIES)


def test_config_classes_come_from_the_registry(tmp_path):
    assert config_class(None) is LlamaConfig and DEFAULT_MODEL_CLASS == LLAMA
    assert {target: config_class(target) for target in FAMILIES} == {
        target: family.config_class for target, family in FAMILIES.items()}
    config = BertConfig(vocab_size=8, hidden_size=4, num_layers=1, num_heads=2, intermediate_size=8)
    config.extra["model_class"] = BERT_MLM
    config.save(tmp_path / "model.yaml")
    assert load_model_config(tmp_path) == config


def test_family_of_a_config():
    assert family_of(LLAMA2_7B) is FAMILIES[LLAMA]
    assert family_of(GPT2Config(vocab_size=8, hidden_size=4, num_layers=1, num_heads=2)) is FAMILIES[GPT2]
    bert = BertConfig(vocab_size=8, hidden_size=4, num_layers=1, num_heads=2, intermediate_size=8)
    with pytest.raises(MigrateError, match="not one of migrate's bundled models"):
        family_of(bert)  # BertModel or BertForMaskedLM: the config alone does not say
    bert.extra["model_class"] = BERT_MLM
    assert family_of(bert) is FAMILIES[BERT_MLM]


def test_only_the_llama_trains_and_declares_an_anatomy():
    assert [t for t, f in FAMILIES.items() if f.trains] == [LLAMA]
    gpt2 = GPT2Config(vocab_size=8, hidden_size=4, num_layers=1, num_heads=2)
    with pytest.raises(MigrateError, match="declares no layer anatomy"):
        FAMILIES[GPT2].flops_per_token(gpt2, 16)


def test_llama_parameters_and_flops_by_hand():
    h, i, v, layers, s = 4096, 11008, 32000, 32, 4096
    per_layer = 4 * h * h + 3 * h * i + 2 * h   # q, k, v, o; gate, up, down; two norms
    family = FAMILIES[LLAMA]
    assert family.parameter_count(LLAMA2_7B) == 2 * v * h + layers * per_layer + h == 6_738_415_616
    # PaLM: 6 N + 12 L s (heads * head_dim), N without the input table and the norms
    n = layers * (per_layer - 2 * h) + v * h
    assert family.flops_per_token(LLAMA2_7B, s) == 6 * n + 12 * layers * s * h == 46_084_915_200


def test_a_config_the_model_cannot_run_is_refused_without_mindspore():
    with pytest.raises(MigrateError, match="hidden_act 'quick_gelu' is not supported"):
        expected_shapes(GPT2Config(vocab_size=8, hidden_size=4, num_layers=1, num_heads=2, hidden_act="quick_gelu"),
                        GPT2)
    with pytest.raises(MigrateError, match="head_dim must be even"):
        expected_shapes(LlamaConfig(vocab_size=8, hidden_size=6, intermediate_size=8, num_layers=1, num_heads=2),
                        LLAMA)
