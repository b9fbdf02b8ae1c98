"""A Llama hand-ported to MindSpore the way a user writes one: its own module tree and names
(`embed`, `blocks.N.attn.qkv` fused [q; k; v], `blocks.N.ffn.gate_up` fused [gate; up], its
own RoPE, mask and loss cells), nothing from migrate. Loaded from an HF state dict.

`FAULT_HOOKS` reproduces each of `migrate diff --list-faults` on this model with forward
hooks (the way a user would perturb their own port), never through migrate's seams.
"""
from __future__ import annotations

import os
from types import SimpleNamespace

import mindspore as ms
import numpy as np
from mindspore import nn, ops

F32 = ms.float32
MIN = float(np.finfo(np.float32).min)


class RMSNorm(nn.Cell):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = ms.Parameter(ms.Tensor(np.ones(dim, np.float32)), name="weight")
        self.eps = eps

    def construct(self, x):
        var = ops.mean(x * x, -1, keep_dims=True)
        return self.weight * (x * ops.rsqrt(var + self.eps))


class RotaryTable(nn.Cell):
    """cos, sin of shape (seq, head_dim) for positions 0..seq-1."""

    def __init__(self, head_dim, theta):
        super().__init__()
        self.head_dim, self.theta = head_dim, theta
        self.inv_freq = ms.Tensor(inv_freq(head_dim, theta))

    def construct(self, seq_len):
        pos = ops.arange(0, seq_len, dtype=F32)
        freqs = ops.outer(pos, self.inv_freq)
        emb = ops.cat((freqs, freqs), -1)
        return ops.cos(emb), ops.sin(emb)


def inv_freq(head_dim, theta):
    exponents = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / head_dim
    return (1.0 / (theta ** exponents)).astype(np.float32)


class Rotate(nn.Cell):
    """x * cos + rotate_half(x) * sin, HF's halves convention."""

    def construct(self, x, cos, sin):
        half = x.shape[-1] // 2
        rotated = ops.cat((-x[..., half:], x[..., :half]), -1)
        return x * cos + rotated * sin


class ExpandKV(nn.Cell):
    """(b, kv_heads, s, d) -> (b, heads, s, d), each kv head repeated for its query group."""

    def __init__(self, n_rep):
        super().__init__()
        self.n_rep = n_rep

    def construct(self, x):
        if self.n_rep == 1:
            return x
        b, h, s, d = x.shape
        return ops.broadcast_to(x[:, :, None], (b, h, self.n_rep, s, d)).reshape(b, h * self.n_rep, s, d)


class Attention(nn.Cell):
    def __init__(self, c):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = c.heads, c.kv_heads, c.hidden // c.heads
        self.q_size, self.kv_size = self.heads * self.head_dim, self.kv_heads * self.head_dim
        self.qkv = nn.Dense(c.hidden, self.q_size + 2 * self.kv_size, has_bias=False)
        self.proj = nn.Dense(self.q_size, c.hidden, has_bias=False)
        self.rope = Rotate()
        self.expand_kv = ExpandKV(self.heads // self.kv_heads)
        self.scale = self.head_dim ** -0.5

    def construct(self, x, cos, sin, mask):
        b, s, _ = x.shape
        qkv = self.qkv(x)
        q = qkv[..., :self.q_size].reshape(b, s, self.heads, self.head_dim).swapaxes(1, 2)
        k = qkv[..., self.q_size:self.q_size + self.kv_size].reshape(b, s, self.kv_heads, self.head_dim).swapaxes(1, 2)
        v = qkv[..., self.q_size + self.kv_size:].reshape(b, s, self.kv_heads, self.head_dim).swapaxes(1, 2)
        q, k = self.rope(q, cos, sin), self.rope(k, cos, sin)
        k, v = self.expand_kv(k), self.expand_kv(v)
        scores = ops.matmul(q, k.swapaxes(2, 3)) * self.scale + mask
        probs = ops.softmax(scores, -1)
        out = ops.matmul(probs, v).swapaxes(1, 2).reshape(b, s, self.q_size)
        return self.proj(out)


class FFN(nn.Cell):
    def __init__(self, c):
        super().__init__()
        self.inter = c.inter
        self.gate_up = nn.Dense(c.hidden, 2 * c.inter, has_bias=False)
        self.down = nn.Dense(c.inter, c.hidden, has_bias=False)

    def construct(self, x):
        gu = self.gate_up(x)
        gate, up = gu[..., :self.inter], gu[..., self.inter:]
        return self.down(ops.silu(gate) * up)


class Block(nn.Cell):
    def __init__(self, c):
        super().__init__()
        self.norm1 = RMSNorm(c.hidden, c.eps)
        self.attn = Attention(c)
        self.norm2 = RMSNorm(c.hidden, c.eps)
        self.ffn = FFN(c)

    def construct(self, x, cos, sin, mask):
        h = x + self.attn(self.norm1(x), cos, sin, mask)
        return h + self.ffn(self.norm2(h))


class Mask(nn.Cell):
    """Additive (b, 1, s, s): 0 where a query sees a key, the float32 minimum elsewhere."""

    def construct(self, attention_mask, b, s):
        causal = ms.Tensor(np.tril(np.ones((s, s), np.float32)))[None, None]
        keep = causal if attention_mask is None else causal * attention_mask.astype(F32)[:, None, None, :]
        return (1.0 - keep) * MIN


class ShiftedLoss(nn.Cell):
    def construct(self, logits, labels):
        logits, labels = logits[:, :-1], labels[:, 1:]
        return cross_entropy(logits, labels)


def cross_entropy(logits, labels):
    """Mean over the labels that are not -100. Through ops.cross_entropy: a hand-written
    log_softmax + gather_elements over the same sliced views gave a wrong loss (NaN, or off by
    ~4.85) in about one suite run in five under load, for every later test of the process, while the
    logits were right to the last bit; never alone. migrate's own models, on ops.cross_entropy,
    never did (docs/DESIGN.md, "The test suite")."""
    vocab = logits.shape[-1]
    return ops.cross_entropy(logits.astype(F32).reshape(-1, vocab), labels.astype(ms.int32).reshape(-1),
                             ignore_index=-100, reduction="mean")


class Head(nn.Cell):
    def __init__(self, c):
        super().__init__()
        self.weight = ms.Parameter(ms.Tensor(np.zeros((c.vocab, c.hidden), np.float32)), name="weight")

    def construct(self, h):
        return ops.matmul(h, self.weight.T)


class HandLlama(nn.Cell):
    def __init__(self, c):
        super().__init__()
        self.config = SimpleNamespace(vocab_size=c.vocab, pad_token_id=0)
        self.c = c
        self.embed_weight = ms.Parameter(ms.Tensor(np.zeros((c.vocab, c.hidden), np.float32)), name="embed_weight")
        self.embed = Embed()
        self.rotary = RotaryTable(c.hidden // c.heads, c.theta)
        self.mask = Mask()
        self.blocks = nn.CellList([Block(c) for _ in range(c.layers)])
        self.norm = RMSNorm(c.hidden, c.eps)
        self.head = Head(c)
        self.loss = ShiftedLoss()

    def construct(self, input_ids, attention_mask=None, labels=None):
        b, s = input_ids.shape
        h = self.embed(self.embed_weight, input_ids)
        cos, sin = self.rotary(s)
        mask = self.mask(attention_mask, b, s)
        for block in self.blocks:
            h = block(h, cos, sin, mask)
        logits = self.head(self.norm(h))
        if labels is None:
            return logits
        return logits, self.loss(logits, labels)


class Embed(nn.Cell):
    def construct(self, table, ids):
        return ops.gather(table, ids, 0)


def config_of(hf_config) -> SimpleNamespace:
    return SimpleNamespace(vocab=hf_config.vocab_size, hidden=hf_config.hidden_size, inter=hf_config.intermediate_size,
                           layers=hf_config.num_hidden_layers, heads=hf_config.num_attention_heads,
                           kv_heads=hf_config.num_key_value_heads, eps=hf_config.rms_norm_eps,
                           theta=float(getattr(hf_config, "rope_theta", None)
                                       or hf_config.rope_parameters["rope_theta"]),
                           tied=hf_config.tie_word_embeddings)


def from_hf(hf_dir) -> HandLlama:
    """Port an HF Llama folder: fuse q/k/v and gate/up the way this port lays them out."""
    from safetensors.numpy import load_file
    from transformers import AutoConfig

    c = config_of(AutoConfig.from_pretrained(str(hf_dir)))
    sd = load_file(os.path.join(str(hf_dir), "model.safetensors"))
    model = HandLlama(c)
    model.embed_weight.set_data(ms.Tensor(sd["model.embed_tokens.weight"]))
    for i, block in enumerate(model.blocks):
        p = f"model.layers.{i}."
        block.norm1.weight.set_data(ms.Tensor(sd[p + "input_layernorm.weight"]))
        block.norm2.weight.set_data(ms.Tensor(sd[p + "post_attention_layernorm.weight"]))
        qkv = np.concatenate([sd[p + f"self_attn.{n}_proj.weight"] for n in "qkv"])
        block.attn.qkv.weight.set_data(ms.Tensor(qkv))
        block.attn.proj.weight.set_data(ms.Tensor(sd[p + "self_attn.o_proj.weight"]))
        gate_up = np.concatenate([sd[p + "mlp.gate_proj.weight"], sd[p + "mlp.up_proj.weight"]])
        block.ffn.gate_up.weight.set_data(ms.Tensor(gate_up))
        block.ffn.down.weight.set_data(ms.Tensor(sd[p + "mlp.down_proj.weight"]))
    model.norm.weight.set_data(ms.Tensor(sd["model.norm.weight"]))
    head = sd["model.embed_tokens.weight"] if c.tied else sd["lm_head.weight"]
    model.head.weight.set_data(ms.Tensor(head))
    model.set_train(False)
    return model


# ---------------------------------------------------------------- faults, by hooks

def _np(t):
    return t.asnumpy()


def _swap_cols(out, a, b, n):
    x = _np(out).copy()
    x[..., a:a + n], x[..., b:b + n] = x[..., b:b + n].copy(), x[..., a:a + n].copy()
    return ms.Tensor(x)


def _qk_swap(model, layer):
    attn = model.blocks[layer].attn
    attn.qkv.register_forward_hook(lambda cell, args, out: _swap_cols(out, 0, attn.q_size, attn.kv_size))


def _gate_up_swap(model, layer):
    ffn = model.blocks[layer].ffn
    ffn.gate_up.register_forward_hook(lambda cell, args, out: _swap_cols(out, 0, ffn.inter, ffn.inter))


def _rms_eps(model, layer):
    def hook(cell, args, out):
        x = _np(args[0]).astype(np.float64)
        y = x / np.sqrt((x * x).mean(-1, keepdims=True) + cell.eps * 10)
        return ms.Tensor((_np(cell.weight) * y).astype(np.float32))
    for _, cell in model.cells_and_names():
        if isinstance(cell, RMSNorm):
            cell.register_forward_hook(hook)


def _rope_interleaved(model, layer):
    def hook(cell, args, out):
        x, cos, sin = (_np(a) for a in args)
        d = x.shape[-1]
        idx = np.repeat(np.arange(d // 2), 2)
        partner = np.arange(d) ^ 1
        sign = np.tile(np.array([-1.0, 1.0], np.float32), d // 2)
        return ms.Tensor(x * cos[..., idx] + x[..., partner] * sign * sin[..., idx])
    for block in model.blocks:
        block.attn.rope.register_forward_hook(hook)


def _rope_theta(model, layer):
    def hook(cell, args, out):
        theta = 10000.0 if cell.theta != 10000.0 else 100000.0
        freqs = np.outer(np.arange(args[0], dtype=np.float32), inv_freq(cell.head_dim, theta))
        emb = np.concatenate([freqs, freqs], -1)
        return ms.Tensor(np.cos(emb)), ms.Tensor(np.sin(emb))
    model.rotary.register_forward_hook(hook)


def _gqa_repeat(model, layer):
    def hook(cell, args, out):
        return ms.Tensor(np.concatenate([_np(args[0])] * cell.n_rep, 1))
    for block in model.blocks:
        block.attn.expand_kv.register_forward_hook(hook)


def _untied_head(model, layer):
    rng = np.random.default_rng(1)
    w = (0.02 * rng.standard_normal(_np(model.head.weight).shape)).astype(np.float32)
    model.head.register_forward_hook(lambda cell, args, out: ms.Tensor(_np(args[0]) @ w.T))


def _mask_fill(model, layer):
    model.mask.register_forward_hook(lambda cell, args, out: ms.Tensor(np.where(_np(out) < -1.0, -5.0, _np(out))
                                                                       .astype(np.float32)))


def _loss_no_shift(model, layer):
    model.loss.register_forward_hook(lambda cell, args, out: cross_entropy(args[0], args[1]))


def _nan_mlp(model, layer):
    """Not a porting fault: a NaN in one MLP output, to see statistics mode name it."""
    def hook(cell, args, out):
        x = _np(out).copy()
        x[0, -1, :3] = np.nan
        return ms.Tensor(x)
    model.blocks[layer].ffn.register_forward_hook(hook)


FAULT_HOOKS = {"nan_mlp": _nan_mlp, "qk_swap": _qk_swap, "gate_up_swap": _gate_up_swap, "rms_eps": _rms_eps,
               "rope_interleaved": _rope_interleaved, "rope_theta": _rope_theta, "gqa_repeat": _gqa_repeat,
               "untied_head": _untied_head, "mask_fill": _mask_fill, "loss_no_shift": _loss_no_shift}


def make():
    """`migrate dump tests/hand_port_ms.py:make`: the port of $HAND_PORT_HF, with the fault
    $HAND_PORT_FAULT (NAME[@LAYER]) hooked in when set."""
    model = from_hf(os.environ["HAND_PORT_HF"])
    fault = os.environ.get("HAND_PORT_FAULT")
    if fault:
        name, _, layer = fault.partition("@")
        FAULT_HOOKS[name](model, int(layer or 0))
    return model
