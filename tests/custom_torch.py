"""A user's own PyTorch Llama, not an HF class: its own names (`tok`, `blocks.N.attention.q`,
`blocks.N.mlp.gate`, `ln_f`, `lm`) and a dict output. Loaded from an HF folder's weights."""
from __future__ import annotations

import os

import torch
from torch import nn


class Norm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.scale, self.eps = nn.Parameter(torch.ones(dim)), eps

    def forward(self, x):
        return self.scale * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


class SelfAttention(nn.Module):
    def __init__(self, dim, heads, kv_heads, theta):
        super().__init__()
        self.heads, self.kv_heads, self.d = heads, kv_heads, dim // heads
        self.q = nn.Linear(dim, heads * self.d, bias=False)
        self.k = nn.Linear(dim, kv_heads * self.d, bias=False)
        self.v = nn.Linear(dim, kv_heads * self.d, bias=False)
        self.o = nn.Linear(heads * self.d, dim, bias=False)
        exponents = torch.arange(0, self.d, 2, dtype=torch.int64).float() / self.d
        self.register_buffer("inv_freq", 1.0 / theta ** exponents, persistent=False)

    def forward(self, x, mask):
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.heads, self.d).transpose(1, 2)
        k = self.k(x).view(b, s, self.kv_heads, self.d).transpose(1, 2)
        v = self.v(x).view(b, s, self.kv_heads, self.d).transpose(1, 2)
        freqs = torch.outer(torch.arange(s, dtype=torch.float32), self.inv_freq)
        emb = torch.cat([freqs, freqs], -1)
        cos, sin = emb.cos(), emb.sin()

        def rot(t):
            half = t.shape[-1] // 2
            return t * cos + torch.cat([-t[..., half:], t[..., :half]], -1) * sin
        q, k = rot(q), rot(k)
        rep = self.heads // self.kv_heads
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        probs = torch.softmax(q @ k.transpose(2, 3) * self.d ** -0.5 + mask, -1, dtype=torch.float32)
        return self.o((probs @ v).transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    def __init__(self, dim, inter):
        super().__init__()
        self.gate, self.up = nn.Linear(dim, inter, False), nn.Linear(dim, inter, False)
        self.down = nn.Linear(inter, dim, False)

    def forward(self, x):
        return self.down(nn.functional.silu(self.gate(x)) * self.up(x))


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln_a = Norm(c.hidden_size, c.rms_norm_eps)
        self.attention = SelfAttention(c.hidden_size, c.num_attention_heads, c.num_key_value_heads,
                                       c.rope_parameters["rope_theta"])
        self.ln_b = Norm(c.hidden_size, c.rms_norm_eps)
        self.mlp = MLP(c.hidden_size, c.intermediate_size)

    def forward(self, x, mask):
        x = x + self.attention(self.ln_a(x), mask)
        return x + self.mlp(self.ln_b(x))


class MyTorchLlama(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.config = c
        self.tok = nn.Embedding(c.vocab_size, c.hidden_size)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.num_hidden_layers))
        self.ln_f = Norm(c.hidden_size, c.rms_norm_eps)
        self.lm = nn.Linear(c.hidden_size, c.vocab_size, bias=False)

    def forward(self, input_ids, labels=None):
        s = input_ids.shape[1]
        mask = torch.full((s, s), torch.finfo(torch.float32).min).triu(1)
        h = self.tok(input_ids)
        for block in self.blocks:
            h = block(h, mask)
        logits = self.lm(self.ln_f(h))
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                                      labels[:, 1:].reshape(-1))
        return out


def from_hf(hf_dir) -> MyTorchLlama:
    from safetensors.torch import load_file
    from transformers import AutoConfig

    c = AutoConfig.from_pretrained(str(hf_dir))
    sd = load_file(os.path.join(str(hf_dir), "model.safetensors"))
    model = MyTorchLlama(c).eval()
    mine = {"tok.weight": sd["model.embed_tokens.weight"], "ln_f.scale": sd["model.norm.weight"],
            "lm.weight": sd.get("lm_head.weight", sd["model.embed_tokens.weight"])}
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        mine[f"blocks.{i}.ln_a.scale"] = sd[p + "input_layernorm.weight"]
        mine[f"blocks.{i}.ln_b.scale"] = sd[p + "post_attention_layernorm.weight"]
        for n in "qkvo":
            mine[f"blocks.{i}.attention.{n}.weight"] = sd[p + f"self_attn.{n}_proj.weight"]
        for n in ("gate", "up", "down"):
            mine[f"blocks.{i}.mlp.{n}.weight"] = sd[p + f"mlp.{n}_proj.weight"]
    model.load_state_dict(mine)
    return model


def gate_up_swap(model, layer):
    """The fault on the PyTorch side, by hooks: layer `layer`'s gate and up outputs exchanged."""
    mlp = model.blocks[layer].mlp
    mlp.gate.register_forward_hook(lambda m, args, out: nn.functional.linear(args[0], mlp.up.weight))
    mlp.up.register_forward_hook(lambda m, args, out: nn.functional.linear(args[0], mlp.gate.weight))


def make():
    """`tests/custom_torch.py:make`: the module on $HAND_PORT_HF's weights ($TORCH_FAULT=LAYER: gate/up swapped)."""
    model = from_hf(os.environ["HAND_PORT_HF"])
    if os.environ.get("TORCH_FAULT"):
        gate_up_swap(model, int(os.environ["TORCH_FAULT"]))
    return model
