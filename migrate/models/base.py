"""The base every bundled model's cells stand on: dtypes, seeded parameters and the precision policy.

    build = Build(config.compute_dtype, config.initializer_range, seed)
    weight = build.normal("model.layers.0.attention.wq.weight", (out, in))
    class MyCell(ModelCell): ...          # computes under build.precision

Precision policy
----------------
A `PrecisionPolicy` says which dtype parameters are held in, which dtype activations
are carried in between ops, and at which named *rounding sites* a result is
rounded (fp32 -> low -> fp32) to a low dtype. Every `ModelCell` computes under
one policy; `ModelCell.use_precision` swaps it in place (the trainer's
`migrate.train.precision.autocast_model` does so for torch.autocast's policy).
In GRAPH_MODE swap before the first call: a compiled graph keeps the
constants it read.

A cell marks its sites with `self._r(x, site)` (round a result) and
`self._p(param, site)` (a parameter as the math takes it). The sites:

  op            the result of any op HF's model holds in the low dtype (norms,
                RoPE products, residual adds, the masked scores, ...)
  matmul_in     the activation entering a matmul-class op (linear, q·kᵀ, tied head)
  matmul_param  the parameter entering a matmul-class op (weight, bias, tied table)
  matmul_out    the result of a matmul-class op (linear, q·kᵀ, probs·v, tied head)
  scaled        attention scores times the scaling
  probs         softmax probabilities cast to the activation dtype
  dropout       attention probabilities after dropout
  mlp_act       the MLP's activation of the gate
  mlp_gate      activation(gate) * up

`EMULATED_SITES`: low precision on CPU, where MindSpore lacks most bf16
kernels. Parameters are held in the low dtype, activations in fp32, and every
op result HF would hold in the low dtype is rounded once -- what torch's CPU
kernels compute (fp32 math, one rounding per op). Matmul inputs are already
rounded, so their sites are left out. On other devices low precision runs
natively (`name` "native": no rounding at all).
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass

import mindspore as ms
import numpy as np
from mindspore import Parameter, nn, ops
from mindspore.common.initializer import Initializer, initializer

from migrate.dtype_names import PRECISIONS
from migrate.errors import MigrateError
from migrate.models.mode import launch_synchronously_on_cpu

launch_synchronously_on_cpu()  # before any model runs a kernel: MindSpore takes it only then (see there)

F32 = ms.float32
DTYPES = {p.compute: getattr(ms, p.compute) for p in PRECISIONS.values()}  # "bfloat16" -> ms.bfloat16
# torch.finfo(dtype).min; all exact in fp32.
MIN_VALUE = {ms.float32: -3.4028234663852886e38, ms.float16: -65504.0, ms.bfloat16: -3.3895313892515355e38}

SITES = ("op", "matmul_in", "matmul_param", "matmul_out", "scaled", "probs", "dropout", "mlp_act", "mlp_gate")
EMULATED_SITES = ("op", "matmul_out", "scaled", "probs", "mlp_act", "mlp_gate")


@dataclass(frozen=True)
class PrecisionPolicy:
    """How a cell computes: parameter dtype, activation dtype, and where it rounds to `low`."""

    name: str                   # "fp32" | "native" | "emulated" | "autocast"
    params: object              # dtype the parameters are held in
    act: object                 # dtype activations are carried in between ops
    low: object = None          # dtype rounded to at `sites` (None: never rounds)
    sites: tuple[str, ...] = ()

    def __post_init__(self):
        unknown = set(self.sites) - set(SITES)
        if unknown:
            raise ValueError(f"unknown rounding sites {sorted(unknown)}; known: {', '.join(SITES)}")

    @property
    def emulate(self) -> bool:
        """Parameters held in a low dtype, math in fp32 (low precision emulated on CPU)."""
        return self.params != self.act

    def computes_in(self, sites) -> object:
        """The dtype a cell with these rounding sites computes in: `low` where the policy rounds at
        any of them (every cell, when it emulates low-precision parameters), else the activation dtype."""
        if self.low is not None and (self.emulate or set(sites) & set(self.sites)):
            return self.low
        return self.act


def model_precision(dtype) -> PrecisionPolicy:
    """The policy of a model built in `dtype`: fp32 exact; low precision natively where the
    device has the kernels, emulated on fp32 math on CPU."""
    if dtype == F32:
        return PrecisionPolicy("fp32", F32, F32)
    if ms.get_context("device_target") == "CPU":
        return PrecisionPolicy("emulated", dtype, F32, dtype, EMULATED_SITES)
    return PrecisionPolicy("native", dtype, dtype)


def check_dtype(compute_dtype: str) -> None:
    if compute_dtype not in DTYPES:
        raise MigrateError(f"compute_dtype {compute_dtype!r} is not supported; supported: {', '.join(DTYPES)}")


class SeededNormal(Initializer):
    """Normal(0, sigma) from a per-parameter numpy seed.

    An Initializer (not a ready tensor) keeps parameter creation lazy, so loaders
    can skip it; the seed makes a fresh model reproducible without global state.
    """

    def __init__(self, sigma: float, seed: int, zero_row: int | None = None):
        super().__init__(sigma=sigma, seed=seed)
        self.sigma = sigma
        self._np_seed = seed
        self.zero_row = zero_row

    def _initialize(self, arr):
        rng = np.random.default_rng(self._np_seed)
        arr[...] = rng.normal(0.0, self.sigma, arr.shape).astype(arr.dtype)
        if self.zero_row is not None:
            arr[self.zero_row] = 0  # HF zeroes the embedding's padding_idx row


class Build:
    """What building a model's cells needs: the parameters' dtype and seeded initialisation
    (normal(0, std) seeded from (model seed, parameter name)), and the precision policy."""

    def __init__(self, compute_dtype: str, std: float, seed: int):
        check_dtype(compute_dtype)
        self.dtype = DTYPES[compute_dtype]
        self.std, self.seed = std, seed
        self.precision = model_precision(self.dtype)

    def normal(self, name: str, shape, zero_row: int | None = None, std: float | None = None) -> Parameter:
        seed = zlib.crc32(f"{self.seed}:{name}".encode())
        init = SeededNormal(self.std if std is None else std, seed, zero_row)
        return Parameter(initializer(init, shape, self.dtype), name=name)

    def const(self, name: str, shape, value: str) -> Parameter:
        return Parameter(initializer(value, shape, self.dtype), name=name)


class ModelCell(nn.Cell):
    """A cell of a bundled model: computes under a `PrecisionPolicy`.

    `SITES` names the rounding sites the cell's construct uses (what
    `PrecisionPolicy.computes_in` reads back); "op" by default.
    """

    SITES: tuple[str, ...] = ("op",)

    def __init__(self, precision: PrecisionPolicy):
        super().__init__()
        self.use_precision(precision)

    def use_precision(self, precision: PrecisionPolicy) -> None:
        """Compute under `precision` from now on (in GRAPH_MODE: before the first call)."""
        self.precision = precision
        # Plain attributes: GRAPH_MODE reads them as constants.
        self.emulate = precision.emulate
        self.act = precision.act
        self.low = precision.low if precision.low is not None else precision.act
        self.round_at = precision.sites

    def _r(self, x, site="op"):
        """Round a result to the low dtype where the policy rounds at `site`."""
        if site in self.round_at:
            return x.astype(self.low).astype(F32)
        return x

    def _p(self, param, site=None):
        """A parameter as the math takes it: in the activation dtype, rounded where the policy rounds at `site`."""
        if self.emulate:
            param = param.astype(F32)
        if site is None:
            return param
        return self._r(param, site)

    def _dropout(self, x, p: float):
        """torch's dropout while training (ops.dropout: mint's has no CPU kernel)."""
        if self.training and p > 0:
            return ops.dropout(x, p=p, training=True)
        return x

    def _keep_hidden(self, hidden: tuple, output_hidden_states, attn, mlp, h) -> tuple:
        """`hidden` with one layer's entries added: its output, preceded with "detail" by its
        attention and MLP outputs (before their residual add)."""
        if output_hidden_states == "detail":
            return hidden + (attn, mlp, h)
        if output_hidden_states:
            return hidden + (h,)
        return hidden

    def _hand_out(self, x):
        """An output tensor (or None) in the dtype HF's model hands out: the compute dtype when emulated."""
        if self.emulate and x is not None:
            return x.astype(self.low)
        return x

    def _hidden_out(self, hidden: tuple, output_hidden_states):
        """The hidden-state tuple handed out: None unless asked for, in the dtype HF's model hands out."""
        if not output_hidden_states:
            return None
        if not self.emulate:
            return hidden
        out = ()
        for x in hidden:
            out = out + (x.astype(self.low),)
        return out


def hidden_names(embedding: str, layers: str, num_layers: int, parts: tuple[str, str], detail: bool) -> list[str]:
    """Names of a model's `hidden` entries as `ModelCell._keep_hidden` collects them: the embedding
    output, then per layer `{layers}.{i}` (after `{layers}.{i}.{part}` for both parts with detail)."""
    names = [embedding]
    for i in range(num_layers):
        layer = f"{layers}.{i}"
        names += [f"{layer}.{parts[0]}", f"{layer}.{parts[1]}", layer] if detail else [layer]
    return names


def name_parameters(cell: nn.Cell) -> None:
    """Parameters carry their full path as name (checkpoints are keyed by it)."""
    for name, param in cell.parameters_and_names():
        param.name = name
