"""LoRA on the bundled models, through the projection seam: `Linear.kernel` is wrapped, the
forward is not restated.

    attach_lora(model, sites, spec, adapters)     # adapters: HF module -> (A, B) arrays
    adapter_parameters(model)                     # the adapters' Parameters, model order
    lora_kernels(model)                           # (cell name, LoraKernel) pairs

`LoraKernel` computes what PEFT's `lora.Linear` does, in its order:
    y = inner(x, W, b);  y + (dropout(x)·Aᵀ)·Bᵀ · scaling
with A, B held in fp32 and the update added in fp32 before the result takes y's dtype (PEFT
keeps adapters in fp32 over a low-precision base, `autocast_adapter_dtype`). For a fused cell
(`w_qkv`, `w_gate_hidden`) each targeted HF module has its own A, B; their outputs, plus one
zero column for the parts without an adapter, are gathered onto the fused rows
(`migrate.lora.targets.part_rows`), an exact permutation. The kernel holds no precision of its
own: the owning Linear rounds around it as before.
"""
from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import Parameter, ParameterTuple, Tensor, mint, ops

from migrate.errors import MigrateError
from migrate.lora.spec import LoraSpec
from migrate.lora.targets import Site, part_rows
from migrate.models.common import Linear
from migrate.models.kernels import Kernel

F32 = ms.float32


class LoraKernel(Kernel):
    def __init__(self, inner, sites: list[Site], adapters: list[tuple[np.ndarray, np.ndarray]], spec: LoraSpec,
                 rows: np.ndarray | None, round_to=None):
        super().__init__()
        self.inner = inner
        # PEFT adds the update to the base layer's own output, which HF holds in the low dtype: where
        # the owning cell emulates that rounding (its matmul_out site), the base result is rounded first.
        self.round_to = round_to
        pairs = list(zip(sites, adapters, strict=True))
        a = [Parameter(Tensor(np.asarray(x, np.float32)), name=s.ms_names[0]) for s, (x, _) in pairs]
        b = [Parameter(Tensor(np.asarray(y, np.float32)), name=s.ms_names[1]) for s, (_, y) in pairs]
        self.lora_a = ParameterTuple(a)
        self.lora_b = ParameterTuple(b)
        self.names = tuple(s.ms_names for s in sites)
        self.count = len(sites)
        self.hf_modules = tuple(s.hf_module for s in sites)
        self.rank = spec.rank
        self.scaling = float(spec.scaling)
        self.dropout = float(spec.dropout)
        self.fused = rows is not None
        self.rows = Tensor(rows) if rows is not None else None

    def _update(self, h, i):
        if self.training and self.dropout > 0:
            h = ops.dropout(h, p=self.dropout, training=True)  # mint's dropout has no CPU kernel
        low = mint.nn.functional.linear(h, self.lora_a[i])
        return mint.nn.functional.linear(low, self.lora_b[i]) * self.scaling

    def construct(self, x, weight, bias=None):
        y = self.inner(x, weight, bias)
        if self.round_to is not None:
            y = y.astype(self.round_to).astype(F32)
        h = x.astype(F32)
        if not self.fused:
            return (y.astype(F32) + self._update(h, 0)).astype(y.dtype)
        parts = ()
        for i in range(self.count):
            parts = parts + (self._update(h, i),)
        zero = ops.zeros_like(parts[0][..., :1])
        delta = ops.gather(mint.cat(parts + (zero,), -1), self.rows, parts[0].ndim - 1)
        return (y.astype(F32) + delta).astype(y.dtype)


def lora_kernels(model) -> list[tuple[str, LoraKernel]]:
    """(Linear cell name, its LoraKernel), in model order."""
    return [(name, cell.kernel) for name, cell in model.cells_and_names()
            if isinstance(cell, Linear) and isinstance(cell.kernel, LoraKernel)]


def adapter_parameters(model) -> list[Parameter]:
    out = []
    for _, kernel in lora_kernels(model):
        for a, b in zip(kernel.lora_a, kernel.lora_b, strict=True):
            out += [a, b]
    return out


def attach_lora(model, sites: list[Site], spec: LoraSpec, adapters: dict[str, tuple[np.ndarray, np.ndarray]],
                fields: dict) -> None:
    """Wrap the kernel of every Linear cell `sites` name (once per cell, all its parts together)."""
    cells = dict(model.cells_and_names())
    by_cell: dict[str, list[Site]] = {}
    for site in sites:
        by_cell.setdefault(site.cell, []).append(site)
    for name, group in by_cell.items():
        cell = cells.get(name)
        if not isinstance(cell, Linear):
            raise MigrateError(f"LoRA adapts linear layers; {group[0].hf_module} is {type(cell).__name__} "
                               f"{name} in the MindSpore model")
        if isinstance(cell.kernel, LoraKernel):
            raise MigrateError(f"{name} has a LoRA adapter already")
        group = sorted(group, key=lambda s: s.part or 0)
        rows = part_rows(group[0], [s.part for s in group], fields) if group[0].fused else None
        round_to = cell.low if "matmul_out" in cell.round_at else None
        cell.kernel = LoraKernel(cell.kernel, group, [adapters[s.hf_module] for s in group], spec, rows, round_to)
        # Assigning a cell prefixes its ParameterTuples' names with the attribute: name them after.
        for a, b, (name_a, name_b) in zip(cell.kernel.lora_a, cell.kernel.lora_b, cell.kernel.names, strict=True):
            a.name, b.name = name_a, name_b
