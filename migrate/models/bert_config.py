"""`model.yaml` of the bundled BERT (`migrate.models.bert`), importable without
MindSpore so that `migrate convert` can build it without loading the framework."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from migrate.models.config import ConfigIO, HeadsFromHidden


@dataclass
class BertConfig(HeadsFromHidden, ConfigIO):
    """HF's name is in the comment where it differs."""

    vocab_size: int
    hidden_size: int
    num_layers: int                          # num_hidden_layers
    num_heads: int                           # num_attention_heads
    intermediate_size: int
    seq_length: int = 512                    # max_position_embeddings
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    is_decoder: bool = False                 # not supported: True is refused
    add_cross_attention: bool = False        # not supported: True is refused
    tie_word_embeddings: bool = True
    initializer_range: float = 0.02
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    pad_token_id: int | None = 0             # word-embedding padding_idx, as HF
    ignore_token_id: int = -100
    compute_dtype: str = "float32"           # float32 | float16 | bfloat16
    extra: dict[str, Any] = field(default_factory=dict)  # unknown fields, kept verbatim
