"""Which layers a LoRA spec adapts, and what each adapter is called on either side.

    sites = linear_sites(plan)                 # every HF linear module the keymap maps, with its MindSpore cell
    targets = resolve_targets(spec, plan)      # the spec's target_modules matched as PEFT matches them
    a, b = initial_adapter(module, in_f, out_f, rank, seed)   # the same starting bits on both sides

Targets are named in HF terms (PEFT's), so a spec means the same on both sides; the keymap's
conversion plan carries each HF module to the MindSpore `Linear` cell that computes it. A
module fused into a bigger MindSpore cell (`--qkv-concat`/mcore: q, k, v inside `w_qkv`, gate
and up inside `w_gate_hidden`) is a *part* of that cell: its adapter has the HF module's own
shapes, and the kernel places its output rows where the fused layout puts that module's rows
(`part_rows`), so the adapter means exactly what PEFT's does on the unfused model.

Names:
  PEFT (adapter_model.safetensors)  base_model.model.<hf module>.lora_A.weight  (rank, in), lora_B (out, rank)
  MindSpore                         <cell>.mindpet_delta_lora_a / _b (MindFormers' LoRA names); a part
                                    of a fused cell: <cell>.<hf short name>.mindpet_delta_lora_a / _b

Initial adapters: A from PEFT's law (kaiming-uniform with a = sqrt(5): U(-1/sqrt(in), 1/sqrt(in)))
drawn from numpy seeded by (seed, HF module name), B zeros -- so both frameworks start from the
same bits and the first step compares exactly.
"""
from __future__ import annotations

import hashlib
import zlib
from dataclasses import dataclass

import numpy as np

from migrate.errors import MigrateError
from migrate.lora.spec import LoraSpec
from migrate.models.conversion_plan import ConversionPlan
from migrate.transforms import get_layout

PEFT_PREFIX = "base_model.model."
MS_A, MS_B = "mindpet_delta_lora_a", "mindpet_delta_lora_b"
# Fused layouts that only reorder rows of their sources: LoRA parts can be placed in them.
ROW_LAYOUTS = ("qkv_groups", "qkv_contiguous", "interleave_rows", "concat_halves")


@dataclass(frozen=True)
class Site:
    """One HF linear module and where the MindSpore model computes it."""

    hf_module: str                  # model.layers.0.self_attn.q_proj
    cell: str                       # the MindSpore Linear cell: model.layers.0.attention.wq (or .w_qkv)
    in_features: int
    out_features: int
    part: int | None = None         # index among the fused row's sources; None: the cell is this module
    parts: tuple[str, ...] = ()     # the fused row's HF modules, in its source order
    part_shapes: tuple[tuple[int, ...], ...] = ()
    layout: str | None = None
    cell_weight: str = ""           # the MindSpore weight parameter of the cell

    @property
    def short(self) -> str:
        return self.hf_module.rsplit(".", 1)[-1]

    @property
    def fused(self) -> bool:
        return self.part is not None

    @property
    def ms_names(self) -> tuple[str, str]:
        base = f"{self.cell}.{self.short}" if self.fused else self.cell
        return f"{base}.{MS_A}", f"{base}.{MS_B}"

    @property
    def peft_names(self) -> tuple[str, str]:
        return f"{PEFT_PREFIX}{self.hf_module}.lora_A.weight", f"{PEFT_PREFIX}{self.hf_module}.lora_B.weight"

    def shapes(self, rank: int) -> tuple[tuple[int, int], tuple[int, int]]:
        return (rank, self.in_features), (self.out_features, rank)


def output_heads(plan: ConversionPlan) -> set[str]:
    """HF modules of the output head (the keymap's rows that may be tied): all-linear leaves them out."""
    return {rule.src[0].removesuffix(".weight") for rule in plan.keymap.rules if rule.tied_to}


def linear_sites(plan: ConversionPlan) -> dict[str, Site]:
    """HF linear module -> its site, for every 2-D `.weight` row of the plan whose MindSpore
    parameter is a `.weight` too (embedding tables and norms are not linear layers), in model order."""
    expected = plan.expected
    sites: dict[str, Site] = {}
    for group in plan.groups:
        if len(group.dst) != 1 or not group.dst[0].endswith(".weight") or len(expected.get(group.dst[0], ())) != 2:
            continue
        dst = group.dst[0]
        cell = dst.removesuffix(".weight")
        if group.layout is None:
            src = group.src[0]
            if src.endswith(".weight"):
                out_f, in_f = expected[dst]
                sites[src.removesuffix(".weight")] = Site(src.removesuffix(".weight"), cell, in_f, out_f,
                                                          cell_weight=dst)
            continue
        if group.layout not in ROW_LAYOUTS or not all(s.endswith(".weight") for s in group.src):
            continue
        shapes = tuple(tuple(s) for s in group.transform().in_shapes([expected[dst]], plan.fields))
        parts = tuple(s.removesuffix(".weight") for s in group.src)
        for i, (module, shape) in enumerate(zip(parts, shapes, strict=True)):
            sites[module] = Site(module, cell, shape[1], shape[0], i, parts, shapes, group.layout, dst)
    return sites


def select_modules(targets: list[str], linear: list[str], heads: set[str], where: str) -> list[str]:
    """The linear modules `targets` names, PEFT's way: all-linear is every linear module but the
    output head; a name matches a module that is it or ends with `.name`. A name that matches
    no linear module is one MigrateError line."""
    if targets == ["all-linear"]:
        return [m for m in linear if m not in heads]
    chosen, unknown = set(), []
    for name in targets:
        hits = [m for m in linear if m == name or m.endswith("." + name)]
        if not hits:
            unknown.append(name)
        chosen.update(hits)
    if unknown:
        shorts = list(dict.fromkeys(m.rsplit(".", 1)[-1] for m in linear))
        raise MigrateError(f"lora.target_modules: no linear layer of {where} is named "
                           f"{', '.join(repr(u) for u in unknown)}; its linear layers: {', '.join(shorts)}")
    return [m for m in linear if m in chosen]


def resolve_targets(spec: LoraSpec, plan: ConversionPlan) -> list[Site]:
    """The sites `spec` adapts, in model order (one MigrateError line for an unknown name)."""
    sites = linear_sites(plan)
    chosen = select_modules(spec.target_list, list(sites), output_heads(plan), plan.keymap.name)
    return [sites[m] for m in chosen]


# ---------- fused parts ----------
def part_rows(site: Site, targeted: list[int], fields: dict) -> np.ndarray:
    """For a fused cell: for each of its output rows, the index into the concatenation of the
    targeted parts' outputs (in `targeted` order) followed by one zero column -- the rows of
    parts without an adapter read that column. The fused layout itself, applied to row indices."""
    offsets, total = [], 0
    for shape in site.part_shapes:
        offsets.append(total)
        total += shape[0]
    concat_index = np.full(total + 0, -1, np.int64)
    at = 0
    for i in targeted:
        rows = site.part_shapes[i][0]
        concat_index[offsets[i]:offsets[i] + rows] = np.arange(at, at + rows)
        at += rows
    concat_index[concat_index < 0] = at  # the zero column
    indices = [np.arange(offsets[i], offsets[i] + shape[0]) for i, shape in enumerate(site.part_shapes)]
    (fused,) = get_layout(site.layout).forward(indices, fields)
    return concat_index[fused].astype(np.int32)


# ---------- initial adapters ----------
def initial_adapter(hf_module: str, in_features: int, out_features: int, rank: int,
                    seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(A, B) of one HF module as PEFT initialises them (kaiming-uniform A, zero B), drawn from
    numpy so both frameworks hold the same bits."""
    rng = np.random.default_rng(zlib.crc32(f"{seed}:lora:{hf_module}".encode()))
    bound = 1.0 / np.sqrt(in_features)
    a = rng.uniform(-bound, bound, (rank, in_features)).astype(np.float32)
    return a, np.zeros((out_features, rank), np.float32)


# ---------- the base an adapter belongs to ----------
def base_fingerprint(weights: dict[str, np.ndarray]) -> str:
    """sha256 of the base weights an adapter adds to: HF module name, shape and fp32 values of
    each, in name order. Casting to fp32 is exact from bf16/fp16, so a base converted with
    --dtype keep, trained in fp32 or read from HF gives the same fingerprint."""
    h = hashlib.sha256()
    for name in sorted(weights):
        array = np.ascontiguousarray(np.asarray(weights[name]).astype(np.float32))
        h.update(f"{name}:{array.shape}\n".encode())
        h.update(array.tobytes())
    return h.hexdigest()


def hf_weights_of(sites: list[Site], ms_weight, fields: dict) -> dict[str, np.ndarray]:
    """HF module -> its weight in HF layout, from the MindSpore model's weights
    (`ms_weight(name)` -> array); a fused cell is split with its layout's inverse."""
    out, split = {}, {}
    for site in sites:
        if not site.fused:
            out[site.hf_module] = np.asarray(ms_weight(site.cell_weight))
            continue
        if site.cell_weight not in split:
            split[site.cell_weight] = get_layout(site.layout).inverse([np.asarray(ms_weight(site.cell_weight))],
                                                                      fields)
        out[site.hf_module] = split[site.cell_weight][site.part]
    return out
