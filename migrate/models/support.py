"""What the bundled models can run, decided without MindSpore: `migrate convert`
refuses a config they cannot run before any byte is written, instead of
converting it and failing later in `migrate diff` or training.

The activation tables are the models' own (`tests/test_rope_types.py` holds them
equal to `migrate.models.llama._ACTIVATIONS` and `migrate.models.common.ACTIVATIONS`).
"""
from __future__ import annotations

from migrate.errors import MigrateError
from migrate.safeyaml import quote

LLAMA = "migrate.models.llama:LlamaForCausalLM"
# HF ACT2FN names the bundled Llama computes as HF does.
LLAMA_ACTIVATIONS = ("silu", "swish", "relu", "relu2", "gelu", "gelu_pytorch_tanh", "gelu_new")
# The same for the bundled GPT-2 and BERT (migrate.models.common.Activation).
COMMON_ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "silu", "swish", "tanh")
ACTIVATIONS = {
    LLAMA: LLAMA_ACTIVATIONS,
    "migrate.models.gpt2:GPT2LMHeadModel": COMMON_ACTIVATIONS,
    "migrate.models.bert:BertModel": COMMON_ACTIVATIONS,
    "migrate.models.bert:BertForMaskedLM": COMMON_ACTIVATIONS,
}


def check_activation(name, supported=LLAMA_ACTIVATIONS, field: str = "hidden_act") -> None:
    if name not in supported:
        raise MigrateError(f"{field} {quote(name)} is not supported; supported: {', '.join(supported)}")


def check_runnable(config, target: str) -> None:
    """MigrateError naming the field and value of `config` that bundled model `target`
    cannot run; nothing for a model class migrate does not bundle (it knows its own)."""
    if target in ACTIVATIONS and hasattr(config, "hidden_act"):
        check_activation(config.hidden_act, ACTIVATIONS[target])
    if target == LLAMA:
        from migrate.models.rope import rope_frequencies

        if config.head_dim % 2:
            raise MigrateError(f"head_dim must be even for RoPE, got {config.head_dim}")
        rope_frequencies(config.head_dim, config.theta, config.rope_scaling, config.seq_length)
