"""What LoRA changes in the planner's memory estimate (`migrate plan --lora-rank R`).

With the base frozen, a device holds the base weights once, in the training dtype (no
gradient, no fp32 master, no AdamW moments), and the adapters by the 16 B/parameter rule of
fp32 trainable weights: 4 weight + 4 gradient + 4 + 4 moments (their fp32 weight is their
master). Activations are full training's (the backward still runs through every layer; kept
as the upper bound although a frozen linear needs its input only for the adapter beside it)
plus, per adapted module, its rank-r intermediate (e·s·b·r). Adapters are placed as their
layers are: split over mp, per pipeline stage with their layer (a head adapter on the last).
"""
from __future__ import annotations

import re
from dataclasses import replace
from functools import partial
from pathlib import Path

from migrate.errors import MigrateError
from migrate.keymap import Keymap, recorded_keymap
from migrate.lora.spec import ALL_LINEAR, LoraSpec
from migrate.lora.targets import Site, resolve_targets
from migrate.memory_plan import (
    DEVICE,
    DTYPE_BYTES,
    GiB,
    MemoryEstimate,
    MemoryProfile,
    estimate_memory,
    state_bytes_per_param,
)
from migrate.models.conversion_plan import ConversionPlan
from migrate.parallel.layout import Layout

ADAPTER_BYTES = (4, 4, 8)  # fp32 weight, fp32 gradient, two fp32 moments (the weight is its own master)
_LAYER = re.compile(r"\.layers\.(\d+)\.")


def adapter_params(sites: list[Site], rank: int) -> int:
    return sum(rank * (s.in_features + s.out_features) for s in sites)


def stage_of(site: Site, num_layers: int, pp: int) -> int:
    """The pipeline stage holding a site: its layer's, or the last (the head)."""
    m = _LAYER.search(site.hf_module)
    return min(int(m.group(1)) // (num_layers // pp), pp - 1) if m else pp - 1


def stage_adapters(sites: list[Site], rank: int, num_layers: int, pp: int) -> list[int]:
    """Adapter parameters of each pipeline stage (all mp ranks together)."""
    stages = [0] * pp
    for s in sites:
        stages[stage_of(s, num_layers, pp)] += rank * (s.in_features + s.out_features)
    return stages


def lora_estimate(config, layout: Layout, seq_length: int, dtype: str = "bf16", recompute: str = "none",
                  profile: MemoryProfile = DEVICE, *, sites: list[Site], rank: int) -> MemoryEstimate:
    """`plan.estimate_memory` for a LoRA run with these adapters (same signature, plus sites and rank)."""
    full = estimate_memory(config, layout, seq_length, dtype, recompute, profile)
    adapters = stage_adapters(sites, rank, config.num_layers, layout.pp)[full.stage] // layout.mp
    weight, _, _ = state_bytes_per_param(dtype, layout.dp, layout.optimizer_shard, profile)
    w, g, o = ADAPTER_BYTES
    if layout.optimizer_shard and layout.dp > 1:
        o = o / layout.dp
    e = profile.activation_bytes or DTYPE_BYTES[dtype]
    in_flight = min(layout.pp - full.stage, layout.micro_batches) if layout.pp > 1 else 1
    here = sum(1 for s in sites if stage_of(s, config.num_layers, layout.pp) == full.stage)
    low_rank = e * seq_length * layout.micro_batch_size * rank * here * in_flight
    return replace(full, weights=int(full.params * weight + adapters * w), grads=int(adapters * g),
                   optimizer=int(adapters * o), workspace=adapters * profile.update_workspace_bytes,
                   activations=full.activations + low_rank)



def lora_planning(model_path, config, rank: int, targets: str, seq_length: int, dtype: str, *,
                  trust: bool = False):
    """(estimator for `plan.plan`, a table of full training next to LoRA on one device) for
    `migrate plan --lora-rank R --lora-targets q_proj,v_proj|all-linear`. trust: the folder's model
    class may be imported (for its parameter shapes) even if migrate does not bundle it."""
    from rich.table import Table

    names = ALL_LINEAR if targets.strip() == ALL_LINEAR else [t.strip() for t in targets.split(",") if t.strip()]
    spec = LoraSpec(rank=rank, target_modules=names)  # alpha does not change memory
    problems = spec.problems()
    if problems:
        raise MigrateError(f"--lora-{problems[0][0].replace('target_modules', 'targets')}: {problems[0][1]}")
    folder = Path(model_path) if Path(model_path).is_dir() else Path(model_path).parent
    plan = ConversionPlan(Keymap.load(recorded_keymap(folder)).for_model(config.to_dict()), config, trust)
    sites = resolve_targets(spec, plan)
    estimator = partial(lora_estimate, sites=sites, rank=rank)
    one = Layout(micro_batch_size=1)
    full = estimate_memory(config, one, seq_length, dtype)
    lora = estimator(config, one, seq_length, dtype)
    n = adapter_params(sites, rank)
    table = Table(title=f"one device, micro batch 1, seq {seq_length}, {dtype}: full training vs LoRA r={rank} "
                        f"on {', '.join(spec.target_list)} ({len(sites)} modules, {n:,} trainable parameters, "
                        f"{100 * n / max(full.params, 1):.3f} % of {full.params:,})", title_justify="left",
                  caption="LoRA: the base frozen in the training dtype (no gradient, fp32 master or moments); "
                          "adapters fp32 at 4 weight + 4 gradient + 8 moments B/param; activations as full "
                          "training plus e·s·b·r per adapted module", caption_justify="left")
    for col in ("GiB", "full training", "LoRA"):
        table.add_column(col, justify="left" if col == "GiB" else "right")
    for label, a, b in (("weights", full.weights, lora.weights), ("gradients", full.grads, lora.grads),
                        ("optimizer states", full.optimizer, lora.optimizer),
                        ("activations (+ working layer, loss)", full.activations + full.working + full.loss,
                         lora.activations + lora.working + lora.loss),
                        ("overhead", full.overhead, lora.overhead), ("total", full.total, lora.total)):
        table.add_row(label, f"{a / GiB:.2f}", f"{b / GiB:.2f}")
    return estimator, table
