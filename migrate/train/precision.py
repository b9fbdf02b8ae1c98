"""Mixed precision for the MindSpore trainer, with the golden side's semantics.

bf16 / fp16: torch.autocast over fp32 weights
---------------------------------------------
The golden script trains the HF model in fp32 under `torch.autocast("cpu",
dtype)`: parameters (and so the AdamW master weights) stay fp32; every
matmul-class op (linear, matmul) casts its inputs to the low dtype, runs with
fp32 accumulation and hands out a low-precision result; everything else
(embedding, RMSNorm, residual adds, RoPE products, softmax, the loss) runs in
fp32 by type promotion. `autocast_model(model, dtype)` gives the bundled fp32
model exactly that op-by-op policy: it swaps the classes of its Linear,
attention, MLP, tied-head and LM cells for subclasses whose `construct`
rounds (fp32 -> dtype -> fp32) at the points where autocast holds a
low-precision tensor:

  * Linear:      round(linear(round(x), round(W), round(b)))
  * attention:   scores = round(round(matmul(round(q), round(k)^T)) * scaling)
                 (+ the fp32 mask, fp32 softmax), out = round(matmul(round(p), v))
  * MLP:         w2(round(round(act(w1 x)) * w3 x))
  * tied head:   round(matmul(round(h), round(E)^T))

The rounding is a pair of casts, so MindSpore's autodiff rounds the gradient
at the same points (the backward of a cast is a cast back), which is what
autocast's low-precision backward matmuls do. Parameters never change dtype:
the optimizer updates the fp32 weights, like torch.

The subclasses restate the bundled model's `construct` methods (both the
separate and the fused qkv / gate-up layouts) with only the rounding points
changed; `rounding=False` must reproduce the plain model exactly, and a test
holds them to that for both layouts.

Rounding is emulated because MindSpore's CPU backend lacks most bf16 kernels;
the numbers are those of fp32 math rounded once per op, which is also what
torch's CPU bf16 kernels compute.

fp16: dynamic loss scaling
--------------------------
`DynamicLossScaler` restates torch.amp.GradScaler (the golden's scaler): the
scale lives in fp32; gradients are unscaled by fp32(1 / fp64(scale)); a step
whose unscaled gradients hold an inf/nan is skipped (no optimizer step, no
scheduler step) and the scale is multiplied by backoff_factor; after
growth_interval consecutive good steps it is multiplied by growth_factor.
"""
from __future__ import annotations

import math

import mindspore as ms
import numpy as np
from mindspore import mint

from migrate.errors import MigrateError
from migrate.models import llama as L

F32 = ms.float32
LOW = {"bf16": ms.bfloat16, "fp16": ms.float16}


class _Autocast:
    """Mixin: `_ac` rounds an fp32 tensor to the autocast dtype and back."""

    def _ac(self, x):
        if self.ac_round:
            return x.astype(self.ac_dtype).astype(F32)
        return x


class AutocastLinear(_Autocast, L.Linear):
    def construct(self, x):
        bias = None if self.bias is None else self._ac(self.bias)
        return self._ac(mint.nn.functional.linear(self._ac(x), self._ac(self.weight), bias))


class AutocastAttention(_Autocast, L.LlamaAttention):
    def construct(self, x, cos, sin, mask):
        b, s, _ = x.shape
        if self.qkv_concat:
            q, k, v = self._split_qkv(self.w_qkv(x), b, s)
        else:
            q = self.wq(x).reshape(b, s, self.num_heads, self.head_dim).swapaxes(1, 2)
            k = self.wk(x).reshape(b, s, self.n_kv_heads, self.head_dim).swapaxes(1, 2)
            v = self.wv(x).reshape(b, s, self.n_kv_heads, self.head_dim).swapaxes(1, 2)
        # RoPE: low-precision q/k times fp32 cos/sin promotes to fp32 under autocast.
        q = self._rope(q, cos, sin)
        k = self._repeat_kv(self._rope(k, cos, sin))
        v = self._repeat_kv(v)
        scores = self._ac(self._ac(mint.matmul(self._ac(q), self._ac(k).swapaxes(2, 3))) * self.scaling)
        scores = scores + mask  # low + fp32 mask -> fp32
        # HF: softmax in fp32, cast to the low dtype, then dropout on the low-precision
        # probabilities (its 1/(1-p) rescale rounds once more).
        probs = self._ac(mint.nn.functional.softmax(scores, dim=-1))
        if self.training and self.dropout > 0:
            probs = self._ac(ms.ops.dropout(probs, p=self.dropout, training=True))
        out = self._ac(mint.matmul(probs, v))
        out = out.swapaxes(1, 2).reshape(b, s, self.num_heads * self.head_dim)
        return self.wo(out)


class AutocastFeedForward(_Autocast, L.LlamaFeedForward):
    def construct(self, x):
        if self.ffn_concat:
            pairs = self.w_gate_hidden(x).reshape(x.shape[:-1] + (self.intermediate_size, 2))
            gate, up = pairs[..., 0], pairs[..., 1]
        else:
            gate, up = self.w1(x), self.w3(x)
        return self.w2(self._ac(self._ac(self.act_fn(gate)) * up))


class AutocastTiedHead(_Autocast, L.TiedHead):
    def construct(self, h, weight):
        return self._ac(mint.matmul(self._ac(h), self._ac(weight).T))


class AutocastCausalLM(_Autocast, L.LlamaForCausalLM):
    def construct(self, input_ids, attention_mask=None, labels=None, output_hidden_states=False):
        if self.tie_word_embeddings:
            weight = self.model.tok_embeddings.embedding_weight
            h, hidden = self.model(input_ids, attention_mask, output_hidden_states, weight)
            logits = self.tied_head(h, weight)
        else:
            h, hidden = self.model(input_ids, attention_mask, output_hidden_states)
            logits = self.lm_head(h)
        loss = None
        if labels is not None:
            loss = self._loss(logits, labels)
        if not output_hidden_states:
            hidden = None
        return logits, loss, hidden


_SWAPS = ((L.Linear, AutocastLinear), (L.LlamaAttention, AutocastAttention),
          (L.LlamaFeedForward, AutocastFeedForward), (L.TiedHead, AutocastTiedHead),
          (L.LlamaForCausalLM, AutocastCausalLM))


def autocast_model(model, dtype: str, rounding: bool = True):
    """Give an fp32 bundled model torch.autocast's policy for `dtype` (bf16 | fp16), in place."""
    if dtype not in LOW:
        raise MigrateError(f"autocast dtype must be one of {', '.join(LOW)}, got {dtype!r}")
    if getattr(model, "emulate", False) or model.model.tok_embeddings.embedding_weight.dtype != F32:
        raise MigrateError("autocast needs the model in fp32 (load it with compute_dtype float32)")
    for _, cell in model.cells_and_names():
        for base, sub in _SWAPS:
            if type(cell) is base:
                cell.__class__ = sub
                cell.ac_dtype = LOW[dtype]
                cell.ac_round = rounding
    return model


def compute_dtype(cell):
    """The dtype a bundled-model cell computes in, read from the cell: what its results are
    rounded to (autocast's dtype, or the model's own compute dtype when emulating it on CPU),
    else its activation dtype."""
    if getattr(cell, "ac_round", False):
        return cell.ac_dtype
    if getattr(cell, "emulate", False):
        return cell.cdtype
    return cell.act


class DynamicLossScaler:
    """torch.amp.GradScaler's dynamic loss scale, stepped by the trainer (see the module docstring)."""

    def __init__(self, init_scale: float = 65536.0, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000):
        self._scale = np.float32(init_scale)
        self.growth_factor = float(growth_factor)
        self.backoff_factor = float(backoff_factor)
        self.growth_interval = int(growth_interval)
        self.growth_tracker = 0

    @classmethod
    def from_config(cls, ls) -> "DynamicLossScaler":
        return cls(ls.init_scale, ls.growth_factor, ls.backoff_factor, ls.growth_interval)

    @property
    def scale(self) -> float:
        return float(self._scale)

    @property
    def inv_scale(self) -> float:
        """GradScaler.unscale_: fp32(1 / fp64(scale))."""
        return float(np.float32(1.0 / np.float64(self._scale)))

    def update(self, found_inf: bool) -> None:
        """GradScaler.update: torch's _amp_update_scale_ CPU kernel (fp32 scale times a double factor)."""
        with np.errstate(over="ignore"):
            self._update(found_inf)

    def _update(self, found_inf: bool) -> None:
        if found_inf:
            self._scale = np.float32(np.float64(self._scale) * self.backoff_factor)
            self.growth_tracker = 0
            return
        self.growth_tracker += 1
        if self.growth_tracker == self.growth_interval:
            grown = np.float32(np.float64(self._scale) * self.growth_factor)
            if math.isfinite(float(grown)):  # torch keeps the old scale if growth overflows
                self._scale = grown
            self.growth_tracker = 0

    def state_dict(self) -> dict:
        return {"scale": float(self._scale), "growth_factor": self.growth_factor,
                "backoff_factor": self.backoff_factor, "growth_interval": self.growth_interval,
                "growth_tracker": self.growth_tracker}

    def load_state_dict(self, state: dict) -> None:
        self._scale = np.float32(state["scale"])
        self.growth_factor = float(state["growth_factor"])
        self.backoff_factor = float(state["backoff_factor"])
        self.growth_interval = int(state["growth_interval"])
        self.growth_tracker = int(state["growth_tracker"])
