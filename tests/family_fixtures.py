"""Tiny HF models of the other Llama-like families, built from a config and a seed."""
from __future__ import annotations

import torch
from hf_fixtures import save_hf_model

SMALL = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-6)


def build_family_model(family: str, seed: int = 0, **overrides):
    from transformers import MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

    classes = {"hf_qwen2": (Qwen2Config, Qwen2ForCausalLM), "hf_mistral": (MistralConfig, MistralForCausalLM)}
    config_cls, model_cls = classes[family]
    torch.manual_seed(seed)
    model = model_cls(config_cls(**{**SMALL, **overrides})).eval()
    with torch.no_grad():  # non-trivial norms and biases, so a dropped one shows
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.add_(0.1 * torch.randn_like(param))
            elif name.endswith(".bias"):
                param.copy_(0.05 * torch.randn_like(param))
    return model


__all__ = ["build_family_model", "save_hf_model"]
