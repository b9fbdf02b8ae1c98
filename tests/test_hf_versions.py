"""transformers 4.x beside 5.x (pyproject's `torch` extra takes 4.45 on): the config spellings and the
dtype argument that differ, each bridged in migrate.hf_config. The suite runs transformers 5; the
real 4.57.1 side (convert, export, dump, the golden run) runs in `make test-envs` (tests/envs)."""
from __future__ import annotations

import pytest
import torch
import transformers

from migrate.hf_config import dtype_kwargs, join_rope, split_rope

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 16}


def test_a_4x_config_reads_as_5x_spells_it():
    # LlamaConfig.to_dict() under 4.57.1: theta and scaling apart; under 5.x joined (checked in the
    # 5.x venv against AutoConfig: these are its rope_parameters for the same config.json).
    assert join_rope({"rope_theta": 5e5, "rope_scaling": None, "hidden_size": 64}) == {
        "hidden_size": 64, "rope_parameters": {"rope_type": "default", "rope_theta": 5e5}}
    assert join_rope({"rope_theta": 5e5, "rope_scaling": dict(LLAMA3)})["rope_parameters"] == {
        **LLAMA3, "rope_theta": 5e5}
    legacy = join_rope({"rope_theta": 1e4, "rope_scaling": {"type": "linear", "factor": 2.0}})["rope_parameters"]
    assert legacy == {"type": "linear", "factor": 2.0, "rope_type": "linear", "rope_theta": 1e4}
    # already 5.x, or no RoPE at all (GPT-2, BERT): left as they are
    assert join_rope({"rope_parameters": {"rope_theta": 1.0}}) == {"rope_parameters": {"rope_theta": 1.0}}
    assert join_rope({"n_positions": 1024}) == {"n_positions": 1024}


@pytest.mark.parametrize("rope", [{"rope_type": "default", "rope_theta": 5e5}, {**LLAMA3, "rope_theta": 5e5}],
                         ids=["default", "llama3"])
def test_a_written_config_spells_rope_as_4x_reads_it_and_back(rope):
    fields = split_rope({"model_type": "llama", "rope_parameters": dict(rope)})
    assert "rope_parameters" not in fields and fields["rope_theta"] == 5e5  # 4.x would keep its 10000 otherwise
    assert fields["rope_scaling"] == (None if rope["rope_type"] == "default" else LLAMA3)
    assert join_rope(fields) == {"model_type": "llama", "rope_parameters": rope}


def test_the_dtype_argument_follows_the_installed_version(monkeypatch):
    monkeypatch.setattr(transformers, "__version__", "4.46.3")  # `dtype=` became a config field there
    assert dtype_kwargs(torch.bfloat16) == {"torch_dtype": torch.bfloat16}
    monkeypatch.setattr(transformers, "__version__", "4.57.1")
    assert dtype_kwargs(torch.bfloat16) == {"dtype": torch.bfloat16}
    monkeypatch.setattr(transformers, "__version__", "5.0.0.dev0")
    assert dtype_kwargs(torch.float32) == {"dtype": torch.float32}


def _get_parameter_names_446(model, forbidden_layer_types):
    """transformers 4.46.3's trainer_pt_utils.get_parameter_names, verbatim: no name patterns."""
    result = []
    for name, child in model.named_children():
        result += [
            f"{name}.{n}"
            for n in _get_parameter_names_446(child, forbidden_layer_types)
            if not isinstance(child, tuple(forbidden_layer_types))
        ]
    result += list(model._parameters.keys())
    return result


@pytest.fixture(scope="module")
def biased_llama():
    from hf_fixtures import build_hf_model

    return build_hf_model("gqa", attention_bias=True)


def test_decay_names_are_the_same_under_4x_get_parameter_names(biased_llama, monkeypatch):
    import transformers.trainer_pt_utils as pt_utils

    from migrate.train.decay import hf_decay_names

    want = hf_decay_names(biased_llama)
    assert any(n.endswith("q_proj.bias") for n, _ in biased_llama.named_parameters())
    assert not any(n.endswith(("bias", "norm.weight")) for n in want) and len(want) > 3
    monkeypatch.setattr(pt_utils, "get_parameter_names", _get_parameter_names_446)
    assert hf_decay_names(biased_llama) == want


def test_the_golden_loss_is_the_same_under_4x_loss_function(biased_llama):
    """4.46.3's ForCausalLMLoss shifts inside and takes no shift_labels; 4.45 has no loss_function."""
    from types import SimpleNamespace

    from transformers.loss.loss_utils import fixed_cross_entropy

    from train_setup import load_golden

    causal_loss = load_golden().causal_loss
    def loss_446(logits, labels, vocab_size, num_items_in_batch=None, ignore_index=-100, **kwargs):
        shift_logits = logits.float()[..., :-1, :].contiguous().view(-1, vocab_size)
        shift_labels = labels[..., 1:].contiguous().view(-1)
        return fixed_cross_entropy(shift_logits, shift_labels, num_items_in_batch, ignore_index, **kwargs)

    rows = torch.randint(0, biased_llama.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = biased_llama(input_ids=rows[:, :-1]).logits
    targets = rows[:, 1:].contiguous()
    want = causal_loss(biased_llama, logits, targets)
    old = SimpleNamespace(loss_function=loss_446, config=biased_llama.config)
    assert causal_loss(old, logits, targets).item() == pytest.approx(want.item(), rel=1e-7)
    older = SimpleNamespace(config=biased_llama.config)
    assert causal_loss(older, logits, targets).item() == pytest.approx(want.item(), rel=1e-7)
