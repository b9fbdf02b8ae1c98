"""Whether a converted folder can be loaded in MindFormers' fused layout, and the two plans that do it
(`migrate.models.fused_loading`, which says why generation wants it). MindSpore-free: a request decides
before any framework loads."""
from __future__ import annotations

from pathlib import Path

from migrate.keymap import TARGET_FIELD, recorded_keymap, resolve
from migrate.models.conversion_plan import ConversionPlan

FUSED_TARGET = "qkv_concat"


def fused_plans(ms_dir: str | Path, config, trust: bool = False) -> tuple[ConversionPlan, ConversionPlan] | None:
    """(the folder's plan, the fused model's plan), or None where the folder is not fused this way."""
    fields = config.to_dict()
    if fields.get(TARGET_FIELD) or fields.get("qkv_concat") is not False:
        return None
    keymap = resolve(recorded_keymap(ms_dir)).for_model(fields)
    if FUSED_TARGET not in keymap.targets():
        return None
    fused_keymap = keymap.with_target(FUSED_TARGET)
    fused_fields = {**fields, **(keymap.targets()[FUSED_TARGET].get("config_constants") or {})}
    fused_config = type(config).from_dict(fused_fields)
    return ConversionPlan(keymap, config, trust), ConversionPlan(fused_keymap, fused_config, trust)
