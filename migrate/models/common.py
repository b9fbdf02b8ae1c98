"""Pieces shared by the bundled GPT-2 and BERT models.

The precision policy (`_Precision`, `_Cell`: parameters in the compute dtype;
on CPU low precision is emulated with fp32 activations rounded once per op where
HF's model would hold a tensor of that dtype) and torch-layout `Linear` come
from `migrate.models.llama`; this module adds what those two families need on
top: LayerNorm, embedding lookups, HF's activations, additive attention masks,
HF's losses and a config mixin for `model.yaml`.
"""
from __future__ import annotations

import math
import zlib

import mindspore as ms
from mindspore import Parameter, mint, ops
from mindspore.common.initializer import initializer

from migrate.errors import MigrateError
from migrate.models.config import ConfigIO  # noqa: F401 (re-exported for the GPT-2 / BERT configs)
from migrate.models.llama import _DTYPES, _MIN, F32, Linear, _Cell, _Precision, _SeededNormal  # noqa: F401 (re-exported)


def check_dtype(compute_dtype: str) -> None:
    if compute_dtype not in _DTYPES:
        raise MigrateError(f"compute_dtype {compute_dtype!r} is not supported; supported: {', '.join(_DTYPES)}")


# ---------------------------------------------------------------- parameters

def normal_param(prec: _Precision, name: str, shape, std: float | None = None,
                 zero_row: int | None = None) -> Parameter:
    """Normal(0, std) parameter seeded from (model seed, name); std defaults to initializer_range."""
    std = prec.std if std is None else std
    seed = zlib.crc32(f"{prec.seed}:{name}".encode())
    return Parameter(initializer(_SeededNormal(std, seed, zero_row), shape, prec.dtype), name=name)


class LinearInOut(_Cell):
    """A dense layer whose weight is stored (in, out): HF's Conv1D and MindFormers'
    legacy `_Linear(transpose_b=False)` layout. y = x @ W + b."""

    def __init__(self, in_features: int, out_features: int, prec: _Precision, prefix: str, std: float | None = None):
        super().__init__(prec)
        self.weight = normal_param(prec, prefix + ".weight", (in_features, out_features), std)
        self.bias = prec.const(prefix + ".bias", (out_features,), "zeros")

    def construct(self, x):
        return self._r(mint.matmul(x, self._p(self.weight)) + self._p(self.bias))


class LayerNorm(_Cell):
    """torch.nn.LayerNorm over the last axis: biased variance, eps inside the sqrt,
    computed in fp32 and rounded once (torch's CPU kernel for half types does the same).
    `names` are the attribute (hence parameter) names of scale and shift."""

    def __init__(self, size: int, eps: float, prec: _Precision, prefix: str, names=("weight", "bias")):
        super().__init__(prec)
        self.eps = eps
        self.scale_name, self.shift_name = names
        # mint's layer_norm (LayerNormExt) has no CPU kernel: written out here.
        setattr(self, names[0], prec.const(f"{prefix}.{names[0]}", (size,), "ones"))
        setattr(self, names[1], prec.const(f"{prefix}.{names[1]}", (size,), "zeros"))

    def construct(self, x):
        scale = getattr(self, self.scale_name)
        shift = getattr(self, self.shift_name)
        h = x.astype(F32)
        mean = mint.mean(h, -1, keepdim=True)
        d = h - mean
        var = mint.mean(d * d, -1, keepdim=True)
        out = d * mint.rsqrt(var + self.eps) * scale.astype(F32) + shift.astype(F32)
        return self._r(out.astype(self.act))


class Embedding(_Cell):
    """Lookup table; `padding_idx` as torch's: that row gets no gradient from lookups."""

    def __init__(self, num: int, size: int, prec: _Precision, prefix: str, attr: str = "embedding_weight",
                 padding_idx: int | None = None):
        super().__init__(prec)
        self.attr = attr
        self.padding_idx = padding_idx
        setattr(self, attr, normal_param(prec, f"{prefix}.{attr}", (num, size), zero_row=padding_idx))

    def table(self):
        """The table in the activation dtype (cast once; share it when the head is tied)."""
        return self._p(getattr(self, self.attr))

    def construct(self, ids, weight=None):
        if weight is None:
            weight = self.table()
        # ops.gather, not mint.nn.Embedding: the latter's backward fails on CPU.
        out = ops.gather(weight, ids, 0)
        if self.padding_idx is not None:
            keep = (ids != self.padding_idx).expand_dims(-1)
            out = mint.where(keep, out, ops.stop_gradient(out))
        return out


# ---------------------------------------------------------------- activations

ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "silu", "swish", "tanh")
_GELU_NEW_C = math.sqrt(2.0 / math.pi)


class Activation(_Cell):
    """HF's ACT2FN[name]. gelu_new is written op by op as HF writes it
    (NewGELUActivation), so low-precision rounding falls where HF's does."""

    def __init__(self, name: str, prec: _Precision, field: str = "hidden_act"):
        super().__init__(prec)
        if name not in ACTIVATIONS:
            raise MigrateError(f"{field} {name!r} is not supported; supported: {', '.join(ACTIVATIONS)}")
        self.name = name

    def construct(self, x):
        if self.name == "gelu_new":
            r = self._r
            half = r(0.5 * x)
            inner = r(x + r(0.044715 * r(x * x * x)))
            return r(half * r(1.0 + r(mint.tanh(r(_GELU_NEW_C * inner)))))
        if self.name == "gelu":
            # mint's gelu (GeluExt) has no CPU kernel in PyNative.
            return self._r(ops.gelu(x, approximate="none"))
        if self.name == "gelu_pytorch_tanh":
            return self._r(ops.gelu(x, approximate="tanh"))
        if self.name == "relu":
            return mint.nn.functional.relu(x)
        if self.name == "tanh":
            return self._r(mint.tanh(x))
        return self._r(mint.nn.functional.silu(x))


# ---------------------------------------------------------------- masks

def causal_mask(batch: int, seq_len: int, attention_mask, min_value: float, dtype):
    """HF eager's additive causal mask (0 keep, dtype min drop), (b or 1, 1, s, s)."""
    # ops.arange: mint.arange has no CPU kernel.
    idx = ops.arange(0, seq_len, dtype=ms.int32)
    keep = (idx.expand_dims(0) <= idx.expand_dims(1)).reshape(1, 1, seq_len, seq_len)
    if attention_mask is not None:
        keep = mint.logical_and(keep, attention_mask.astype(ms.bool_).reshape(batch, 1, 1, seq_len))
    # Arithmetic in fp32 (mint.full/where on bf16 lack CPU kernels); the cast is exact.
    return ((1.0 - keep.astype(F32)) * min_value).astype(dtype)


def padding_mask(batch: int, seq_len: int, attention_mask, min_value: float, dtype):
    """HF eager's bidirectional additive mask, (b, 1, 1, s): padded keys get dtype min."""
    keep = attention_mask.astype(F32).reshape(batch, 1, 1, seq_len)
    return ((1.0 - keep) * min_value).astype(dtype)


# ---------------------------------------------------------------- losses

def causal_lm_loss(logits, labels, vocab_size: int, ignore_index: int):
    """HF ForCausalLMLoss: fp32 logits, labels shifted left, ignore_index padded at the end."""
    pad = labels[:, :1] * 0 + ignore_index  # mint.full/zeros_like lack CPU kernels
    shift = mint.cat((labels[:, 1:], pad), 1).reshape(-1)
    flat = logits.astype(F32).reshape(-1, vocab_size)
    # ops.cross_entropy: mint's (LogSoftmaxExt) has no CPU kernel in PyNative.
    return ops.cross_entropy(flat, shift, ignore_index=ignore_index, reduction="mean")


def masked_lm_loss(logits, labels, vocab_size: int, ignore_index: int):
    """torch CrossEntropyLoss over every position (no shift), ignoring ignore_index."""
    flat = logits.astype(F32).reshape(-1, vocab_size)
    return ops.cross_entropy(flat, labels.reshape(-1), ignore_index=ignore_index, reduction="mean")


def cast_outputs(cell: _Cell, tensors: tuple) -> tuple:
    """Emulated low precision: hand out tensors of the compute dtype, as HF's model would."""
    out = ()
    for x in tensors:
        out = out + (x.astype(cell.cdtype),)
    return out
