"""`migrate diff --adapter`: the same LoRA adapter on both sides.

The adapter (a PEFT folder, or a MindSpore adapter: `migrate lora import` output or a LoRA run's
checkpoint) is checked against the converted base (`migrate.lora.transfer.fit_to_base`), then
put on HF's model with PEFT (`LoraConfig` + `get_peft_model`, in place: the HF modules the
keymap's align table names stay where they are) and on the MindSpore model through its
projection seam (`migrate.lora.cells.attach_lora`). Both sides then run as `migrate diff` runs
them; PEFT keeps the adapter in fp32 over a low-precision base, and so does the MindSpore side.
"""
from __future__ import annotations

from pathlib import Path

import torch

from migrate.lora.cells import attach_lora
from migrate.lora.targets import Site
from migrate.lora.transfer import Adapter, base_plan, fit_to_base, open_adapter


def load_adapter(path: str | Path, ms_dir: Path, trust: bool = False) -> tuple[Adapter, list[Site], dict]:
    """The adapter, its sites on the converted base at `ms_dir` (refusing another base), the plan's fields."""
    adapter = open_adapter(path)
    plan = base_plan(ms_dir, trust)
    sites, _ = fit_to_base(adapter, ms_dir, plan)
    return adapter, sites, plan.fields


def attach_to_ms(model, adapter: Adapter, sites: list[Site], fields: dict) -> None:
    attach_lora(model, sites, adapter.spec, adapter.weights, fields)
    model.set_train(False)


def attach_to_hf(model, adapter: Adapter, sites: list[Site]) -> None:
    """PEFT's LoRA injected into `model` in place, holding the adapter's weights."""
    from peft import LoraConfig, inject_adapter_in_model

    spec = adapter.spec
    config = LoraConfig(r=spec.rank, lora_alpha=spec.alpha, lora_dropout=spec.dropout, bias="none",
                        target_modules=[s.hf_module for s in sites], use_rslora=spec.use_rslora)
    inject_adapter_in_model(config, model)
    for name, param in model.named_parameters():
        if ".lora_" in name:  # what PeftModel's autocast_adapter_dtype does over a bf16/fp16 base
            param.data = param.data.float()
    modules = dict(model.named_modules())
    with torch.no_grad():
        for site in sites:
            layer = modules[site.hf_module]
            a, b = adapter.weights[site.hf_module]
            layer.lora_A["default"].weight.copy_(torch.from_numpy(a))
            layer.lora_B["default"].weight.copy_(torch.from_numpy(b))
    model.eval()
