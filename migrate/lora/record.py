"""A MindSpore adapter folder: what a LoRA run's checkpoints hold and `migrate lora import` writes.

    adapter.ckpt   the adapters under their MindSpore names (`migrate.lora.targets.Site.ms_names`)
    lora.json      {"format": "migrate-lora-adapter", "version": 1, "spec": {...}, "keymap": NAME,
                    "targets": [{"hf_module", "ms": [A, B], "peft": [A, B], "in_features", "out_features"}],
                    "base": {"ms_model": converted folder, "sha256": base fingerprint}}

The base weights are not in the folder: they are the converted model `base.ms_model`, and
`base.sha256` (`migrate.lora.targets.base_fingerprint`) tells whether a folder given later is it.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from migrate.checkpoints.input_folder import InputFolder
from migrate.errors import MigrateError
from migrate.jsonsafe import load_json
from migrate.lora.spec import LoraSpec
from migrate.lora.targets import Site

ADAPTER_FILE = "adapter.ckpt"
LORA_FILE = "lora.json"
FORMAT = "migrate-lora-adapter"


def adapter_record(spec: LoraSpec, sites: list[Site], keymap: str, ms_model, base_sha256: str | None) -> dict:
    return {"format": FORMAT, "version": 1, "spec": dataclasses.asdict(spec), "keymap": keymap,
            "targets": [{"hf_module": s.hf_module, "ms": list(s.ms_names), "peft": list(s.peft_names),
                         "in_features": s.in_features, "out_features": s.out_features} for s in sites],
            "base": {"ms_model": None if ms_model is None else str(ms_model), "sha256": base_sha256}}


def read_record(folder: Path) -> dict:
    path = InputFolder(folder, "adapter folder").member(LORA_FILE, LORA_FILE)
    record = load_json(path)  # bounded: one line naming the file otherwise
    if not isinstance(record, dict) or record.get("format") != FORMAT or not isinstance(record.get("targets"), list):
        raise MigrateError(f"{path} is not a migrate LoRA adapter record")
    return record


def spec_of(record: dict, where: Path) -> LoraSpec:
    fields = {f.name for f in dataclasses.fields(LoraSpec)}
    raw = record.get("spec")
    if not isinstance(raw, dict) or set(raw) - fields:
        raise MigrateError(f"{where}: lora.json spec is not a LoRA spec")
    spec = LoraSpec(**raw)
    problems = spec.problems()
    if problems:
        raise MigrateError(f"{where}: lora.json spec {problems[0][0]} {problems[0][1]}")
    return spec.normalised()
