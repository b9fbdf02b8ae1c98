"""Tiny HF Llama checkpoints built in the test from a config and a seed.

No download anywhere: every model here is created with random weights from
`torch.manual_seed`, then saved in one of the layouts HF uses on the hub.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

BASE = dict(
    vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
    rms_norm_eps=1e-6, tie_word_embeddings=False,
)

# Named variants covering what the converter must handle.
VARIANTS = {
    "mha": {},
    "gqa": dict(num_key_value_heads=2),
    "tied": dict(tie_word_embeddings=True, num_key_value_heads=2),
    "llama3_rope": dict(rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                      "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
                        rope_theta=500000.0),
    "bias": dict(attention_bias=True, mlp_bias=True, num_key_value_heads=2),
}

LAYOUTS = ("safetensors", "sharded_safetensors", "bin", "sharded_bin")


def hf_config(variant: str = "mha", **overrides) -> LlamaConfig:
    fields = {**BASE, **VARIANTS[variant], **overrides}
    return LlamaConfig(**fields)


def randomise_norms_and_biases(model, is_norm=lambda name: name.endswith("norm.weight")):
    """HF initialises norms to ones and biases to zeros; randomise them so a swapped
    or dropped norm/bias cannot hide behind a neutral value."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if is_norm(name):
                param.add_(0.1 * torch.randn_like(param))
            elif name.endswith(".bias"):
                param.copy_(0.05 * torch.randn_like(param))
    return model


def build_hf_model(variant: str = "mha", seed: int = 0, dtype=torch.float32, **overrides) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    model = randomise_norms_and_biases(LlamaForCausalLM(hf_config(variant, **overrides)).eval())
    return model.to(dtype)


def save_hf_model(model, folder: Path, layout: str = "safetensors") -> Path:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if layout == "safetensors":
        model.save_pretrained(folder)
    elif layout == "sharded_safetensors":
        model.save_pretrained(folder, max_shard_size="20KB")
        assert (folder / "model.safetensors.index.json").is_file()
    elif layout in ("bin", "sharded_bin"):
        # What save_pretrained records, written by hand for the legacy layout.
        model.config.architectures = [type(model).__name__]
        model.config.dtype = next(model.parameters()).dtype
        model.config.save_pretrained(folder)
        # Tied weights are stored once, as save_pretrained does (lm_head, BERT's decoder).
        state, seen = {}, set()
        for k, v in model.state_dict().items():
            if v.data_ptr() not in seen:
                seen.add(v.data_ptr())
                state[k] = v.contiguous()
        if layout == "bin":
            torch.save(state, folder / "pytorch_model.bin")
        else:
            _save_sharded_bin(state, folder, shards=3)
    else:
        raise ValueError(layout)
    return folder


def _save_sharded_bin(state: dict, folder: Path, shards: int) -> None:
    names = list(state)
    weight_map = {}
    for i in range(shards):
        part = names[i::shards]
        file = f"pytorch_model-{i + 1:05d}-of-{shards:05d}.bin"
        torch.save({n: state[n] for n in part}, folder / file)
        weight_map.update({n: file for n in part})
    index = {"metadata": {"total_size": sum(t.numel() * t.element_size() for t in state.values())},
             "weight_map": weight_map}
    (folder / "pytorch_model.bin.index.json").write_text(json.dumps(index, indent=2))


def hf_state(folder: Path) -> dict[str, torch.Tensor]:
    """All tensors of an HF folder, read back through HF's own loader."""
    model = LlamaForCausalLM.from_pretrained(folder)
    return model.state_dict()
