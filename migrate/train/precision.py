"""Mixed precision for the MindSpore trainer, with the golden side's semantics.

bf16 / fp16: torch.autocast over fp32 weights
---------------------------------------------
The golden script trains the HF model in fp32 under `torch.autocast("cpu",
dtype)`: parameters (and so the AdamW master weights) stay fp32; every
matmul-class op (linear, matmul) casts its inputs to the low dtype, runs with
fp32 accumulation and hands out a low-precision result; everything else
(embedding, RMSNorm, residual adds, RoPE products, softmax, the loss) runs in
fp32 by type promotion. `autocast_model(model, dtype)` gives the bundled fp32
model exactly that op-by-op policy: one `PrecisionPolicy` (`migrate.models.base`)
that rounds (fp32 -> dtype -> fp32) at the rounding sites where autocast holds
a low-precision tensor, set on every cell in place:

  * Linear:      round(linear(round(x), round(W), round(b)))          matmul_in, matmul_param, matmul_out
  * attention:   scores = round(round(matmul(round(q), round(k)^T)) * scaling)    matmul_in, matmul_out, scaled
                 (+ the fp32 mask, fp32 softmax), probs = round(softmax)          probs
                 (dropout: round(dropout(probs))), out = round(matmul(probs, v))  dropout, matmul_out
  * MLP:         w2(round(round(act(w1 x)) * w3 x))                     mlp_act, mlp_gate
  * tied head:   round(matmul(round(h), round(E)^T))                    matmul_in, matmul_param, matmul_out

Emulated low precision (the bundled model built in bf16/fp16 on CPU,
`migrate diff`'s) rounds instead after every op HF's model holds in the low
dtype ("op", plus matmul_out, scaled, probs, mlp_act, mlp_gate; its matmul
inputs are already rounded): `migrate.models.base.EMULATED_SITES`.

The rounding is a pair of casts, so MindSpore's autodiff rounds the gradient
at the same points (the backward of a cast is a cast back), which is what
autocast's low-precision backward matmuls do. Parameters never change dtype:
the optimizer updates the fp32 weights, like torch. The model's forward is
untouched (`rounding=False` is the plain fp32 model), and kernels swapped by
`migrate.parallel.strategy` round the same, whichever is applied first.

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

from migrate.dtype_names import PRECISIONS
from migrate.errors import MigrateError
from migrate.models.base import ModelCell, PrecisionPolicy

F32 = ms.float32
LOW = {p.name: getattr(ms, p.compute) for p in PRECISIONS.values() if p.low}  # "bf16" -> ms.bfloat16
AUTOCAST_SITES = ("matmul_in", "matmul_param", "matmul_out", "scaled", "probs", "dropout", "mlp_act", "mlp_gate")


def autocast_precision(dtype: str, rounding: bool = True) -> PrecisionPolicy:
    """torch.autocast's policy for `dtype` (bf16 | fp16) over fp32 parameters; `rounding=False`
    keeps the policy's name but rounds nowhere (the plain fp32 model)."""
    if dtype not in LOW:
        raise MigrateError(f"autocast dtype must be one of {', '.join(LOW)}, got {dtype!r}")
    return PrecisionPolicy("autocast", F32, F32, LOW[dtype], AUTOCAST_SITES if rounding else ())


def autocast_model(model, dtype: str, rounding: bool = True):
    """Give an fp32 bundled model torch.autocast's policy for `dtype` (bf16 | fp16), in place."""
    policy = autocast_precision(dtype, rounding)
    if model.precision.params != F32:
        raise MigrateError("autocast needs the model in fp32 (load it with compute_dtype float32)")
    for _, cell in model.cells_and_names():
        if isinstance(cell, ModelCell):
            cell.use_precision(policy)
    return model


def compute_dtype(cell):
    """The dtype a bundled-model cell computes in, read from the cell: what its results are
    rounded to (autocast's dtype, or the model's own compute dtype when emulating it on CPU),
    else its activation dtype."""
    return cell.precision.computes_in(cell.SITES)


def autocast_rounds_to(cell):
    """The dtype autocast rounds this cell's results to; None where autocast does not act on it."""
    policy = cell.precision
    if policy.name != "autocast" or not set(policy.sites) & set(cell.SITES):
        return None
    return policy.low


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
    def from_config(cls, ls) -> DynamicLossScaler:
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
