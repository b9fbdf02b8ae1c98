"""Known conversion and porting faults, injected into the MindSpore side.

`migrate diff --inject NAME[@LAYER]` shows what each fault looks like in a
report; the tests use the same registry to prove every fault is caught and
located. Each fault is a `Fault` that applies itself to a loaded `MSSide`
through the bundled Llama's seams (`migrate.models.llama`'s docstring): it
swaps parameter data, sets a seam's attribute (a norm's eps, the mask's fill
value, the rotary tables), or replaces every cell of one type by a faulty
subclass (the rotary, the kv repeat, the norm, the loss). Cells are found by
type, so a fault reaches the same place whatever kernels or precision policy
the model carries. Sources: ../shared/PITFALLS.md.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import mindspore as ms
import numpy as np
from mindspore import mint, nn

from migrate.errors import MigrateError
from migrate.models.base import ModelCell
from migrate.models.common import CausalMask, CrossEntropy, ShiftedCrossEntropy
from migrate.models.llama import LlamaFeedForward, RepeatKV, RMSNorm, UnitOffsetRMSNorm
from migrate.models.registry import build_model
from migrate.models.rope import rope_inv_freq
from migrate.models.rotary import RotaryEmbedding, RotateHalf


@dataclass(frozen=True)
class Fault:
    name: str
    description: str
    block: str                 # where the first divergence must be found ("grad": the first gradient divergence)
    per_layer: bool            # True: hits the chosen layer; False: shows from layer 0 (or has no layer)
    needs: tuple[str, ...]     # conditions on the run: padded, low_precision, tied, gqa, grads
    inject: Callable           # (side, layer) -> None: changes side.model in place (or replaces it)

    def apply(self, side, layer: int) -> None:
        self.inject(side, layer)


# ---------------------------------------------------------------- finding seams by type

def cells_of(model, kind) -> list:
    return [cell for _, cell in model.cells_and_names() if isinstance(cell, kind)]


def replace_cells(model, kind, make) -> None:
    """Put make(cell) in place of every cell of type `kind`; parameters keep their names."""
    cells = dict(model.cells_and_names())
    for name, cell in list(cells.items()):
        if isinstance(cell, kind):
            parent, _, attr = name.rpartition(".")
            setattr(cells[parent], attr, make(cell))
    # Cell.__setattr__ prefixes a new child's parameter names; put back the full paths.
    for name, param in model.parameters_and_names():
        param.name = name


# ---------------------------------------------------------------- faulty cells

class InterleavedRotary(RotateHalf):
    """Rotates adjacent pairs (Meta's .pth convention) on weights laid out for HF's halves."""

    def __init__(self, like: RotateHalf, head_dim: int):
        super().__init__(like.precision)
        # Index gathers only: stack/strided slicing lack CPU kernels in PyNative.
        self.freq_index = ms.Tensor(np.repeat(np.arange(head_dim // 2), 2).astype(np.int32))  # 0,0,1,1,...
        self.partner = ms.Tensor((np.arange(head_dim) ^ 1).astype(np.int32))                 # 1,0,3,2,...
        self.sign = ms.Tensor(np.tile(np.array([-1.0, 1.0], np.float32), head_dim // 2))    # -x_odd, +x_even

    def construct(self, x, cos, sin):
        c = ms.ops.gather(cos, self.freq_index, cos.ndim - 1)
        s = ms.ops.gather(sin, self.freq_index, sin.ndim - 1)
        rotated = ms.ops.gather(x, self.partner, x.ndim - 1) * self.sign.astype(x.dtype)
        return self._r(self._r(x * c) + self._r(rotated * s))


class TiledKV(RepeatKV):
    """k/v heads repeated as [0,1,0,1] instead of HF's [0,0,1,1]."""

    groups_queries = False  # pairs query heads with kv heads otherwise than HF's groups

    def construct(self, x):
        if self.n_rep == 1:
            return x
        return mint.cat([x] * self.n_rep, 1)


class NoUpcastRMSNorm(RMSNorm):
    """RMSNorm computed in the low-precision dtype, without HF's fp32 upcast (a Gemma norm
    keeps its 1 + weight, then in the low dtype too)."""

    def __init__(self, like: RMSNorm):
        ModelCell.__init__(self, like.precision)  # built around the norm's own weight
        self.weight = like.weight
        self.eps = like.eps
        self.unit_offset = isinstance(like, UnitOffsetRMSNorm)

    def construct(self, x):
        h = self._r(x * x)
        variance = self._r(mint.mean(h, -1, keepdim=True))
        h = self._r(x * self._r(mint.rsqrt(self._r(variance + self.eps))))
        weight = self._p(self.weight)
        if self.unit_offset:
            weight = self._r(1.0 + weight)
        return self._r(weight * h)


class ScaleGrad(nn.Cell):
    """Identity forward; the gradient flowing back through it is multiplied by `factor`."""

    def __init__(self, factor: float):
        super().__init__()
        self.factor = factor

    def construct(self, x):
        return x

    def bprop(self, x, out, dout):
        return (dout * self.factor,)


class GradScaledFeedForward(LlamaFeedForward):
    """The layer's MLP with its output gradient scaled: a backward-only fault (the forward is
    bit-identical), the kind a hand-written bprop or a wrong loss-scale unscale leaves."""

    def __init__(self, like: LlamaFeedForward, factor: float):
        ModelCell.__init__(self, like.precision)  # built around the MLP's own weights
        for name, cell in like.name_cells().items():
            setattr(self, name, cell)
        self.ffn_concat, self.intermediate_size, self.act_fn = like.ffn_concat, like.intermediate_size, like.act_fn
        self.scale = ScaleGrad(factor)

    def construct(self, x):
        return self.scale(super().construct(x))


# ---------------------------------------------------------------- the faults

def _layers(side):
    return side.model.model.layers


def _swap(a, b, rows: int | None = None):
    x, y = a.asnumpy().copy(), b.asnumpy().copy()
    rows = rows or min(len(x), len(y))
    x[:rows], y[:rows] = y[:rows].copy(), x[:rows].copy()
    a.set_data(ms.Tensor(x, a.dtype))
    b.set_data(ms.Tensor(y, b.dtype))


def _qk_swap(side, layer):
    attn = _layers(side)[layer].attention
    # With GQA, k has fewer rows than q: swap the rows they share.
    _swap(attn.wq.weight, attn.wk.weight)


def _gate_up_swap(side, layer):
    ff = _layers(side)[layer].feed_forward
    _swap(ff.w1.weight, ff.w3.weight)


def _rope_interleaved(side, layer):
    replace_cells(side.model, RotateHalf, lambda cell: InterleavedRotary(cell, side.config.head_dim))


def _gqa_tile(side, layer):
    replace_cells(side.model, RepeatKV, lambda cell: TiledKV(cell.n_rep))


def _rms_eps(side, layer):
    """rms_norm_eps ten times too large (the 1e-5 vs 1e-6 mix-up)."""
    for norm in cells_of(side.model, RMSNorm):
        norm.eps = norm.eps * 10


def _rmsnorm_no_upcast(side, layer):
    replace_cells(side.model, RMSNorm, NoUpcastRMSNorm)


def _mask_fill(side, layer):
    """Padding filled with a small finite value instead of the dtype minimum."""
    for mask in cells_of(side.model, CausalMask):
        mask.fill_value = -5.0


def _untied_head(side, layer):
    """lm_head not tied to the embedding: a freshly initialised head."""
    config = side.config
    config.tie_word_embeddings = False
    model = build_model(config, trust=getattr(side, "trust", False))  # MSSide carries --trust-model-class
    loaded = {p.name: p for p in side.model.get_parameters()}
    for p in model.get_parameters():
        if p.name in loaded:
            p.set_data(loaded[p.name].value())
    model.set_train(False)
    side.model = model


def _loss_no_shift(side, layer):
    """Cross-entropy on unshifted labels: position t predicts token t."""
    replace_cells(side.model, ShiftedCrossEntropy, lambda cell: CrossEntropy(cell.vocab_size, cell.ignore_index))


def _mlp_grad_scale(side, layer):
    """Layer `layer`'s MLP gradient 1 % too large in the backward pass."""
    parent = _layers(side)[layer]
    parent.feed_forward = GradScaledFeedForward(parent.feed_forward, 1.01)
    for name, param in side.model.parameters_and_names():
        param.name = name


def _rope_theta(side, layer):
    """RoPE base left at 10000 when the model says otherwise (or 10x off when it is 10000)."""
    c = side.config
    theta = 10000.0 if c.theta != 10000.0 else 100000.0
    inv_freq, _ = rope_inv_freq(c.head_dim, theta, c.rope_scaling, c.seq_length)
    for rotary in cells_of(side.model, RotaryEmbedding):
        rotary.inv_freq = ms.Tensor(np.asarray(inv_freq, np.float32))


FAULTS = {f.name: f for f in (
    Fault("qk_swap", "q and k projection weights swapped in one layer", "attention", True, (), _qk_swap),
    Fault("rope_interleaved", "rotary applied to interleaved pairs instead of halves", "attention", False, (),
          _rope_interleaved),
    Fault("rms_eps", "RMSNorm eps 10x the config's", "attention", False, (), _rms_eps),
    Fault("untied_head", "lm_head untied from a tied embedding (random head)", "logits", False, ("tied",),
          _untied_head),
    Fault("gqa_repeat", "k/v heads repeated in the wrong order for GQA", "attention", False, ("gqa",), _gqa_tile),
    Fault("gate_up_swap", "MLP gate and up projections swapped in one layer", "mlp", True, (), _gate_up_swap),
    Fault("mask_fill", "attention padding filled with -5 instead of the dtype minimum", "attention", False,
          ("padded",), _mask_fill),
    Fault("rmsnorm_no_upcast", "low-precision RMSNorm without the fp32 upcast", "attention", False,
          ("low_precision",), _rmsnorm_no_upcast),
    Fault("loss_no_shift", "loss computed without HF's label shift", "loss", False, (), _loss_no_shift),
    Fault("rope_theta", "RoPE base (rope_theta) not taken from the config", "attention", False, (), _rope_theta),
)}


# Faults only the backward pass shows (`migrate diff --grads`): located by the first gradient divergence.
GRAD_FAULTS = {f.name: f for f in (
    Fault("mlp_grad_scale", "one layer's MLP gradient scaled by 1.01 in the backward pass (forward untouched)",
          "grad", True, ("grads",), _mlp_grad_scale),
)}


def all_faults() -> dict[str, Fault]:
    return {**FAULTS, **GRAD_FAULTS}


def parse_fault(spec: str) -> tuple[Fault, int | None]:
    name, _, layer = spec.partition("@")
    known = all_faults()
    if name not in known:
        raise MigrateError(f"unknown fault {name!r}; known: {', '.join(known)}")
    if layer and not layer.isdigit():
        raise MigrateError(f"fault layer must be a number: {spec!r}")
    return known[name], int(layer) if layer else None


def check_fault(fault: Fault, config, dtype: str, padded: bool, layer: int | None, grads: bool = False) -> int:
    """Validate the run suits the fault; returns the layer it targets."""
    if getattr(config, "qkv_concat", True):  # GPT-2/BERT configs have no such field
        raise MigrateError("fault injection patches the bundled Llama with separate q/k/v and gate/up "
                           "weights; this model is another one (or fused)")
    if "tied" in fault.needs and not config.tie_word_embeddings:
        raise MigrateError(f"fault {fault.name} needs a model with tie_word_embeddings")
    if "gqa" in fault.needs and config.n_kv_heads == config.num_heads:
        raise MigrateError(f"fault {fault.name} needs a GQA model (n_kv_heads < num_heads)")
    if "padded" in fault.needs and not padded:
        raise MigrateError(f"fault {fault.name} shows only on a padded batch: add --padded")
    if "low_precision" in fault.needs and dtype == "fp32":
        raise MigrateError(f"fault {fault.name} shows only in low precision: add --dtype bf16")
    if "grads" in fault.needs and not grads:
        raise MigrateError(f"fault {fault.name} shows only in the backward pass: add --grads")
    if layer is None:
        layer = config.num_layers // 2 if fault.per_layer else 0
    if not 0 <= layer < config.num_layers:
        raise MigrateError(f"fault layer {layer} out of range (model has {config.num_layers} layers)")
    return layer
