"""What the bundled models can run, decided without MindSpore: `migrate convert`
refuses a config they cannot run before any byte is written, instead of
converting it and failing later in `migrate diff` or training.

Each family's entry in `migrate.models.registry` names its table and checks. The
activation tables are the models' own (`tests/test_rope_types.py` holds them
equal to `migrate.models.llama._ACTIVATIONS` and `migrate.models.common.ACTIVATIONS`).
"""
from __future__ import annotations

from migrate.errors import MigrateError
from migrate.models.rope import rope_frequencies
from migrate.safeyaml import quote

# HF ACT2FN names the bundled Llama computes as HF does.
LLAMA_ACTIVATIONS = ("silu", "swish", "relu", "relu2", "gelu", "gelu_pytorch_tanh", "gelu_new")
# The same for the bundled GPT-2 and BERT (migrate.models.common.Activation).
COMMON_ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "silu", "swish", "tanh")


def check_activation(name, supported=LLAMA_ACTIVATIONS, field: str = "hidden_act") -> None:
    if name not in supported:
        raise MigrateError(f"{field} {quote(name)} is not supported; supported: {', '.join(supported)}")


def check_llama_rope(config) -> None:
    """MigrateError naming the RoPE setting of a Llama config that the bundled Llama cannot run."""
    if config.head_dim % 2:
        raise MigrateError(f"head_dim must be even for RoPE, got {config.head_dim}")
    rope_frequencies(config.head_dim, config.theta, config.rope_scaling, config.seq_length)
