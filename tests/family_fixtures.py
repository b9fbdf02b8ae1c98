"""Tiny HF models of the other families, built from a config and a seed (no downloads)."""
from __future__ import annotations

import torch

from hf_fixtures import save_hf_model

SMALL = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-6)
GPT2_SMALL = dict(vocab_size=128, n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=1, eos_token_id=2)
BERT_SMALL = dict(vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                  max_position_embeddings=64, type_vocab_size=2, pad_token_id=0)


def _classes(family: str):
    import transformers as t

    return {
        "hf_qwen2": (t.Qwen2Config, t.Qwen2ForCausalLM, SMALL),
        "hf_mistral": (t.MistralConfig, t.MistralForCausalLM, SMALL),
        "hf_gemma": (t.GemmaConfig, t.GemmaForCausalLM, {**SMALL, "head_dim": 16}),  # HF's default is 256
        "hf_gpt2": (t.GPT2Config, t.GPT2LMHeadModel, GPT2_SMALL),
        "hf_bert": (t.BertConfig, t.BertModel, BERT_SMALL),
        "hf_bert_mlm": (t.BertConfig, t.BertForMaskedLM, BERT_SMALL),
    }[family]


def build_family_model(family: str, seed: int = 0, **overrides):
    """`family`: hf_qwen2, hf_mistral, hf_gemma, hf_gpt2, hf_bert (BertModel) or hf_bert_mlm (BertForMaskedLM)."""
    config_cls, model_cls, base = _classes(family)
    torch.manual_seed(seed)
    model = model_cls(config_cls(**{**base, **overrides})).eval()
    with torch.no_grad():  # non-trivial norms and biases, so a dropped or swapped one shows
        for name, param in model.named_parameters():
            if name.endswith(("norm.weight", "LayerNorm.weight")) or ".ln_" in name and name.endswith(".weight"):
                param.add_(0.1 * torch.randn_like(param))
            elif name.endswith("bias"):
                param.copy_(0.05 * torch.randn_like(param))
    return model


__all__ = ["build_family_model", "save_hf_model"]
