"""The order a divergence travels through a training state: backward.

A step's gradients are computed from the loss back to the embedding, and each moment and parameter is
updated from its own gradient, so a fault shows first in the last layers' moments. Entries are ranked:
the counters and the learning rate (what every later number depends on), then the LM head and the final
norm, then the decoder layers from the last to the first -- in a layer the MLP before the attention, as
backward reaches them -- and the embeddings last; per parameter its first moment, its second moment,
then the parameter the two updated.
"""
from __future__ import annotations

import re

from migrate.judge.report.entries import layer_of

# Forward position of a parameter inside a decoder layer, by the words HF's families name it with.
_IN_LAYER = ((re.compile(r"input_layernorm|ln_1|attention_norm"), 0),
             (re.compile(r"(q_proj|query|c_attn|qkv)"), 1.0),   # q, k, v run side by side; backward meets v first
             (re.compile(r"(k_proj|key)"), 1.1),
             (re.compile(r"(v_proj|value)"), 1.2),
             (re.compile(r"(o_proj|attn\.c_proj|attn.*dense|attention\.output)"), 2),
             (re.compile(r"post_attention_layernorm|ln_2|ffn_norm|pre_feedforward"), 3),
             (re.compile(r"(gate_proj|up_proj|c_fc|intermediate|fc1|w1|w3)"), 4),
             (re.compile(r"(down_proj|mlp\.c_proj|output\.dense|fc2|w2)"), 5))
_EMBED = re.compile(r"embed|wte|wpe|word_embeddings|position_embeddings|token_type")
PARTS = ("exp_avg", "exp_avg_sq", "param")


def forward_in_layer(name: str) -> float:
    """Where in its layer's forward a parameter acts; a LoRA B after its A (h = x A^T B^T)."""
    rank = next((rank for pattern, rank in _IN_LAYER if pattern.search(name)), 6)
    return rank + (0.01 if ".lora_B." in name else 0.0)


def backward_key(name: str) -> tuple:
    """Sort key of a parameter's HF name, smaller first, in backward order."""
    layer = layer_of(name)
    if layer is not None:
        return (1, -layer, -forward_in_layer(name), name)
    if _EMBED.search(name):
        return (2, 0, 0, name)
    return (0, 0, 0, name)   # the LM head, the final norm: the first the loss's gradient reaches


def backward_order(names) -> list[str]:
    return sorted(names, key=backward_key)
