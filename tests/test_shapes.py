"""The MindSpore-free shape functions (migrate.models.shapes) against the models they describe:
for every family and config flag, the same names, shapes and order as MindSpore's own build."""
import mindspore as ms
import numpy as np
import pytest

from migrate.models.bert import BertConfig
from migrate.models.config import LlamaConfig
from migrate.models.gpt2 import GPT2Config
from migrate.models.llama import LlamaForCausalLM
from migrate.models.loading import lazy_parameters
from migrate.models.registry import FAMILIES, build_model, expected_shapes, parameter_shapes

LLAMA = "migrate.models.llama:LlamaForCausalLM"
LLAMA_BASE = dict(vocab_size=48, hidden_size=32, intermediate_size=40, num_layers=2, num_heads=4, seq_length=16)
BERT_BASE = dict(vocab_size=50, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=24, seq_length=8,
                 type_vocab_size=3)
GPT2_BASE = dict(vocab_size=50, hidden_size=16, num_layers=2, num_heads=2, seq_length=8)

CASES = [
    (LLAMA, LlamaConfig(**LLAMA_BASE)),
    (LLAMA, LlamaConfig(**LLAMA_BASE, n_kv_heads=2, tie_word_embeddings=True)),
    (LLAMA, LlamaConfig(**LLAMA_BASE, n_kv_heads=1, qkv_has_bias=True, head_dim=12)),
    (LLAMA, LlamaConfig(**LLAMA_BASE, out_proj_has_bias=True, mlp_bias=True)),
    (LLAMA, LlamaConfig(**LLAMA_BASE, n_kv_heads=2, qkv_concat=True, qkv_has_bias=True)),
    (LLAMA, LlamaConfig(**LLAMA_BASE, qkv_concat=True, mlp_bias=True, tie_word_embeddings=True)),
    (LLAMA, LlamaConfig(**LLAMA_BASE, scale_embeddings=True, rms_norm_unit_offset=True, head_dim=16,
                        tie_word_embeddings=True)),  # Gemma's flags: other cells, the same parameters
    ("migrate.models.gpt2:GPT2LMHeadModel", GPT2Config(**GPT2_BASE)),
    ("migrate.models.gpt2:GPT2LMHeadModel", GPT2Config(**GPT2_BASE, intermediate_size=20, tie_word_embeddings=False)),
    ("migrate.models.bert:BertModel", BertConfig(**BERT_BASE)),
    ("migrate.models.bert:BertForMaskedLM", BertConfig(**BERT_BASE)),
    ("migrate.models.bert:BertForMaskedLM", BertConfig(**BERT_BASE, tie_word_embeddings=False)),
]


@pytest.mark.parametrize("target,config", CASES, ids=lambda v: v if isinstance(v, str) else "")
def test_shapes_equal_the_built_model(target, config):
    with lazy_parameters():
        built = parameter_shapes(build_model(config, target))
    assert list(expected_shapes(config, target).items()) == list(built.items())


@pytest.mark.parametrize("config", [config for target, config in CASES if target == LLAMA])
def test_the_llama_anatomy_counts_what_the_shapes_hold(config):
    # The planner and the trainer's MFU read the anatomy; the shapes are held to the built model above.
    family = FAMILIES[LLAMA]
    assert family.anatomy_of(config).total == family.parameter_count(config)


def test_every_bundled_model_class_has_a_case():
    assert set(FAMILIES) == {target for target, _ in CASES}


class LlamaWithScale(LlamaForCausalLM):
    """A user's own model class: one more parameter than the bundled Llama."""

    def __init__(self, config):
        super().__init__(config)
        self.scale = ms.Parameter(ms.Tensor(np.ones(3, np.float32)), name="scale")


def test_a_model_class_without_a_shape_function_is_built_by_mindspore():
    config = LlamaConfig(**LLAMA_BASE)
    # a class migrate does not bundle: imported on the caller's opt-in (trust=True)
    shapes = expected_shapes(config, f"{__name__}:LlamaWithScale", trust=True)
    assert shapes == {**FAMILIES[LLAMA].shapes(config), "scale": (3,)}
