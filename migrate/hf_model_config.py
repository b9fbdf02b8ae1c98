"""The bundled model's config straight from an HF ``config.json``, as `migrate convert` would write it
to model.yaml, without reading a weight: for the planners (`migrate plan`, `migrate hparams`) on
models too large to convert first.

    keymap, config = model_config_from_hf("path/to/hf_folder")   # or the config.json itself
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from migrate.errors import MigrateError
from migrate.hf_config import load_hf_config, read_raw_config
from migrate.keymap import Keymap, resolve
from migrate.models.conversion_plan import ConversionPlan

__all__ = ["hf_folder", "model_config_from_hf"]


def hf_folder(path: Any) -> Path | None:
    """The HF folder ``path`` names (the folder, or its config.json), or None when it is not one
    (a converted folder has model.yaml, which wins)."""
    p = Path(path)
    if p.is_file() and p.name == "config.json":
        return p.parent
    if p.is_dir() and (p / "config.json").is_file() and not (p / "model.yaml").is_file():
        return p
    return None


def model_config_from_hf(path: Any, keymap: str = "auto") -> tuple[Keymap, Any]:
    """(keymap for this architecture, the MindSpore model config) from an HF folder's config.json."""
    folder = hf_folder(path)
    if folder is None:
        raise MigrateError(f"{path}: not an HF model folder (no config.json)")
    raw = read_raw_config(folder)
    km = resolve(keymap, raw)
    km.check_source(raw)
    km = km.for_source(raw)
    return km, ConversionPlan.for_source(km, km.hf_to_ms_config(load_hf_config(folder, km))).config
