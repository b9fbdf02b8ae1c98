"""`model.yaml` of the bundled GPT-2 (`migrate.models.gpt2`), importable without
MindSpore so that `migrate convert` can build it without loading the framework."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from migrate.models.config import ConfigIO, HeadsFromHidden


@dataclass
class GPT2Config(HeadsFromHidden, ConfigIO):
    """Field names follow MindFormers' GPT2Config (and this project's LlamaConfig)
    where one exists; HF's name is in the comment."""

    vocab_size: int                          # vocab_size
    hidden_size: int                         # n_embd
    num_layers: int                          # n_layer
    num_heads: int                           # n_head
    intermediate_size: int | None = None     # n_inner; None (as HF): 4 * hidden_size, see `inner_size`
    seq_length: int = 1024                   # n_positions (rows of the position table)
    layer_norm_eps: float = 1e-5             # layer_norm_epsilon
    hidden_act: str = "gelu_new"             # activation_function
    embedding_dropout_prob: float = 0.1      # embd_pdrop
    hidden_dropout_rate: float = 0.1         # resid_pdrop
    attention_dropout_rate: float = 0.1      # attn_pdrop
    scale_attn_weights: bool = True
    scale_attn_by_inverse_layer_idx: bool = False
    reorder_and_upcast_attn: bool = False
    add_cross_attention: bool = False        # not supported: True is refused
    tie_word_embeddings: bool = True
    initializer_range: float = 0.02
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    pad_token_id: int | None = None
    ignore_token_id: int = -100
    compute_dtype: str = "float32"           # float32 | float16 | bfloat16
    extra: dict[str, Any] = field(default_factory=dict)  # unknown fields, kept verbatim

    @property
    def inner_size(self) -> int:
        """The MLP width: intermediate_size, or 4 * hidden_size when unset (HF's n_inner=None).
        None is kept as such so that export writes back what HF's config said."""
        return self.intermediate_size or 4 * self.hidden_size
