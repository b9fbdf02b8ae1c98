"""Read a Hugging Face `config.json` the way transformers itself does.

Going through `AutoConfig` normalises old spellings (`rope_theta` +
`rope_scaling` become `rope_parameters`), so one keymap serves configs written
by any transformers version. Every load is local (``local_files_only=True``); the entry points
(`migrate.cli`, the demos) also set HF_HUB_OFFLINE for the libraries they call, nothing at import.
"""
from __future__ import annotations

import json
from pathlib import Path

from migrate.errors import MigrateError
from migrate.jsonsafe import load_json
from migrate.safeyaml import quote


def read_raw_config(folder: Path) -> dict:
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise MigrateError(f"no config.json in {folder}")
    data = load_json(path, expect=dict)  # bounded: one line naming the file otherwise
    # The two fields that pick a keymap and a model class: names, or nothing.
    model_type, archs = data.get("model_type"), data.get("architectures")
    if model_type is not None and not isinstance(model_type, str):
        raise MigrateError(f"config.json in {folder}: model_type must be a string, got {quote(model_type)}")
    if archs is not None and not (isinstance(archs, list) and all(isinstance(a, str) for a in archs)):
        raise MigrateError(f"config.json in {folder}: architectures must be a list of names, got {quote(archs)}")
    return data


def load_hf_config(folder: Path) -> dict:
    """The normalised config as a plain dict (transformers' `to_dict`).

    A model type transformers does not know (a user's own architecture with its
    own keymap) is read as plain JSON: there is nothing to normalise."""
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    raw = read_raw_config(folder)
    if raw.get("model_type") not in CONFIG_MAPPING:
        return raw
    try:
        config = AutoConfig.from_pretrained(str(folder), local_files_only=True)
    except Exception as exc:  # transformers raises ValueError/OSError/KeyError for bad configs
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise MigrateError(f"transformers cannot read config.json in {folder}: {first}") from None
    return config.to_dict()


def write_hf_config(folder: Path, fields: dict) -> None:
    """Write config.json through transformers so HF loads exactly what we meant."""
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    fields = dict(fields)
    if fields.get("model_type") not in CONFIG_MAPPING:  # a user's own architecture: plain JSON
        (Path(folder) / "config.json").write_text(json.dumps(fields, indent=2, sort_keys=True) + "\n")
        return
    model_type = fields.pop("model_type")
    config = AutoConfig.for_model(model_type, **fields)
    config.save_pretrained(str(folder))
