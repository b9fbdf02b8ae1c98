"""PEFT's adapter folder, written and read without torch or PEFT.

    adapter_config.json          LoraConfig.to_dict() keys (peft_type LORA, r, lora_alpha, ...)
    adapter_model.safetensors    base_model.model.<module>.lora_A.weight (rank, in) / lora_B.weight (out, rank)

`PeftModel.from_pretrained(hf_model, folder)` loads what `write_peft_adapter` writes. The
safetensors metadata also carries `migrate.base_sha256`, the fingerprint of the base weights
the adapter was trained on (`migrate.lora.targets.base_fingerprint`); PEFT ignores it, migrate
refuses to put the adapter on another base. `read_peft_adapter` reads a folder PEFT wrote (or
we did) as untrusted input: the checked safetensors reader, every field of the config typed,
and anything this LoRA cannot express (DoRA, per-module ranks, bias training, modules_to_save,
Conv1D's fan_in_fan_out, layer replication, LoRA on parameters, trainable tokens, a field PEFT 0.21
does not have, A or B stored as integers) refused in one line.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from migrate.checkpoints.input_folder import InputFolder
from migrate.checkpoints.safetensors_file import SafetensorsFile
from migrate.errors import MigrateError
from migrate.jsonsafe import load_json
from migrate.lora.spec import ALL_LINEAR, LoraSpec
from migrate.lora.targets import PEFT_PREFIX
from migrate.safeyaml import quote

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
BASE_KEY = "migrate.base_sha256"
PEFT_VERSION = "0.21.2"  # the PEFT these files are checked against (requirements.lock)
FLOAT_TENSORS = ("F32", "F16", "BF16", "F64")  # safetensors dtypes an A or B may have


@dataclass
class PeftAdapter:
    spec: LoraSpec
    weights: dict[str, tuple[np.ndarray, np.ndarray]]   # HF module -> (A, B)
    base_sha256: str | None
    base_name: str | None


def peft_config(spec: LoraSpec, modules: list[str], base_name: str | None) -> dict:
    """adapter_config.json: PEFT's LoraConfig fields (those PEFT 0.21 writes that matter here)."""
    targets = sorted(modules) if spec.all_linear else sorted(set(spec.target_list))
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "peft_version": PEFT_VERSION,
            "base_model_name_or_path": base_name, "revision": None, "inference_mode": True,
            "r": spec.rank, "lora_alpha": spec.alpha, "lora_dropout": spec.dropout, "target_modules": targets,
            "use_rslora": spec.use_rslora, "use_dora": False, "bias": "none", "fan_in_fan_out": False,
            "init_lora_weights": True, "modules_to_save": None, "layers_to_transform": None,
            "layers_pattern": None, "rank_pattern": {}, "alpha_pattern": {}, "exclude_modules": None,
            "lora_bias": False}


def write_peft_adapter(folder: Path, spec: LoraSpec, weights: dict[str, tuple[np.ndarray, np.ndarray]],
                       base_sha256: str | None, base_name: str | None) -> None:
    """Both files into `folder` (an atomic output's temporary folder)."""
    from safetensors.numpy import save_file

    tensors = {}
    for module, (a, b) in weights.items():
        tensors[f"{PEFT_PREFIX}{module}.lora_A.weight"] = np.ascontiguousarray(a, np.float32)
        tensors[f"{PEFT_PREFIX}{module}.lora_B.weight"] = np.ascontiguousarray(b, np.float32)
    metadata = {"format": "pt", **({BASE_KEY: base_sha256} if base_sha256 else {})}
    save_file(tensors, str(folder / WEIGHTS_FILE), metadata=metadata)
    config = peft_config(spec, list(weights), base_name)
    (folder / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def is_peft_adapter(folder: str | Path) -> bool:
    return (Path(folder) / CONFIG_FILE).is_file()


def _field(config: dict, key: str, kinds: tuple, where: Path, default):
    value = config.get(key, default)
    if isinstance(value, bool) != (bool in kinds) or not isinstance(value, kinds):
        raise MigrateError(f"{where}: {key} must be {' or '.join(k.__name__ for k in kinds)}, got {value!r}")
    return value


# PEFT LoraConfig flags (0.21) this LoRA cannot express: each must be false, and a JSON boolean
# (a string "true" is not false: it is refused as a wrong type, not read as off).
_FLAGS = {"use_dora": "DoRA", "fan_in_fan_out": "fan_in_fan_out (Conv1D layers)", "lora_bias": "lora_bias",
          "use_qalora": "QALoRA"}
# Fields naming a feature when set: each must be null or empty.
_FEATURES = {"rank_pattern": "rank_pattern (per-module ranks or alphas)",
             "alpha_pattern": "alpha_pattern (per-module ranks or alphas)",
             "modules_to_save": "modules_to_save (fully trained modules)",
             "layer_replication": "layer_replication (layers repeated from the base)",
             "target_parameters": "target_parameters (LoRA on parameters, not modules)",
             "trainable_token_indices": "trainable_token_indices (trained embedding rows)",
             "alora_invocation_tokens": "alora_invocation_tokens (activated LoRA)",
             "megatron_config": "megatron_config (Megatron parallel linear layers)",
             "arrow_config": "arrow_config (Arrow routing)", "use_bdlora": "use_bdlora (block-diagonal LoRA)",
             "velora_config": "velora_config", "monteclora_config": "monteclora_config",
             "kasa_config": "kasa_config"}
# Fields that do not change what the saved A and B compute: read elsewhere (peft_type, r, lora_alpha,
# lora_dropout, use_rslora, bias, target_modules) or describing how PEFT found the modules, initialised
# the weights or runs (the weights in the file are what counts).
_NEUTRAL = {"peft_type", "r", "lora_alpha", "lora_dropout", "use_rslora", "bias", "target_modules",
            "task_type", "auto_mapping", "peft_version", "base_model_name_or_path", "revision", "inference_mode",
            "exclude_modules", "layers_to_transform", "layers_pattern", "megatron_core",
            "loftq_config", "eva_config", "corda_config", "lora_ga_config", "qalora_group_size",
            "ensure_weight_tying", "runtime_config"}


def _empty(value) -> bool:
    return value is None or value is False or value == {} or value == [] or value == ""


# init_lora_weights: how PEFT initialised A and B. Most leave the base model as it was, so the saved A
# and B are the whole adapter. PiSSA, OLoRA, CorDA, LoftQ and LoRA-GA subtract their initial B·A from
# the base weights (or quantize them): the adapter only means something on that *modified* base, which
# the folder does not hold. PEFT converts such an adapter to a plain one on the original base when it
# is saved with `path_initial_model_for_weight_conversion` (its config then says true). MiCA freezes B
# in training, which the MindSpore LoRA cannot express.
_PLAIN_INIT = ("gaussian", "eva", "orthogonal")   # besides true and false
_BASE_CHANGING_INIT = {"pissa": "PiSSA", "olora": "OLoRA", "corda": "CorDA", "loftq": "LoftQ", "lora_ga": "LoRA-GA"}


def _refuse_init(config: dict, where: Path) -> None:
    value = config.get("init_lora_weights", True)
    if isinstance(value, bool) or (isinstance(value, str) and value in _PLAIN_INIT):
        return
    if isinstance(value, str):
        name = _BASE_CHANGING_INIT.get("pissa" if value.startswith("pissa_niter_") else value)
        if name:
            raise MigrateError(f"{where}: init_lora_weights {value!r} ({name}) changed the base model's weights, "
                               "which this folder does not hold; save the adapter with PEFT's "
                               "path_initial_model_for_weight_conversion to get one for the original base"[:300])
        if value == "mica":
            raise MigrateError(f"{where}: init_lora_weights 'mica' (MiCA: lora_B frozen in training) is not "
                               "supported")
    raise MigrateError(f"{where}: init_lora_weights {quote(value)} is not an initialisation of PEFT "
                       f"{PEFT_VERSION} this LoRA can import (true, false, {', '.join(map(repr, _PLAIN_INIT))})"[:300])


def _refuse_features(config: dict, where: Path) -> None:
    """One line for the first adapter_config.json field naming what this LoRA cannot express;
    a field PEFT 0.21 does not have is refused unless it is empty (a newer PEFT's feature)."""
    for key, what in _FLAGS.items():
        value = config.get(key, False)
        if not isinstance(value, bool):
            raise MigrateError(f"{where}: {key} must be true or false, got {value!r}"[:300])
        if value:
            raise MigrateError(f"{where}: {what} is not supported")
    for key, what in _FEATURES.items():
        if not _empty(config.get(key)):
            raise MigrateError(f"{where}: {what} is not supported")
    if config.get("bias", "none") != "none":
        raise MigrateError(f"{where}: bias {config.get('bias')!r} (trained biases) is not supported; only 'none'")
    known = _NEUTRAL | set(_FLAGS) | set(_FEATURES) | {"init_lora_weights"}   # the last: _refuse_init
    unknown = sorted(k for k in config if k not in known and not _empty(config[k]))
    if unknown:
        raise MigrateError(f"{where}: {unknown[0]!r} is not a LoraConfig field of PEFT {PEFT_VERSION} "
                           f"(a feature migrate cannot express, or not a PEFT adapter)"[:300])


def read_peft_adapter(folder: str | Path) -> PeftAdapter:
    folder = Path(folder)
    where = folder / CONFIG_FILE
    if not where.is_file():
        raise MigrateError(f"{folder} is not a PEFT adapter folder: no {CONFIG_FILE}")
    members = InputFolder(folder, "adapter folder")  # the reader rule: files inside, JSON bounded
    config = load_json(members.member(CONFIG_FILE, CONFIG_FILE), expect=dict)
    if config.get("peft_type") != "LORA":
        raise MigrateError(f"{where}: peft_type {config.get('peft_type')!r} is not LORA")
    _refuse_features(config, where)
    _refuse_init(config, where)
    rank = _field(config, "r", (int,), where, 8)
    alpha = _field(config, "lora_alpha", (int, float), where, 8)
    dropout = _field(config, "lora_dropout", (int, float), where, 0.0)
    rslora = _field(config, "use_rslora", (bool,), where, False)
    weights_file = folder / WEIGHTS_FILE
    if not os.path.lexists(weights_file):
        found = "adapter_model.bin (pickle) is not read; save it with safe_serialization" \
            if (folder / "adapter_model.bin").is_file() else "it is missing"
        raise MigrateError(f"{folder}: no {WEIGHTS_FILE} ({found})")
    weights_file = members.member(WEIGHTS_FILE, WEIGHTS_FILE)
    with SafetensorsFile(weights_file) as handle:
        for name, entry in handle.entries.items():  # an int8 (quantized) A or B is not the LoRA's float update
            if entry.dtype not in FLOAT_TENSORS:
                raise MigrateError(f"{weights_file}: tensor {name} is {entry.dtype}; LoRA weights are floating "
                                   f"point ({', '.join(FLOAT_TENSORS)})"[:300])
        arrays = {name: handle.read(name) for name in handle.entries}
        base = handle.metadata.get(BASE_KEY)
    weights = _pairs(arrays, weights_file, rank)
    modules = list(weights)
    spec = LoraSpec(rank, float(alpha), float(dropout), sorted({m.rsplit(".", 1)[-1] for m in modules}), rslora)
    problems = spec.problems()
    if problems:
        raise MigrateError(f"{where}: {problems[0][0]} {problems[0][1]}")
    if config.get("target_modules") == ALL_LINEAR:
        spec.target_modules = ALL_LINEAR
    return PeftAdapter(spec, weights, base, config.get("base_model_name_or_path"))


def _pairs(arrays: dict[str, np.ndarray], where: Path, rank: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """PEFT's tensor names -> HF module -> (A, B), each pair complete and of rank `rank`."""
    halves: dict[str, dict[str, np.ndarray]] = {}
    for name, array in arrays.items():
        for which in ("A", "B"):
            suffix = f".lora_{which}.weight"
            if name.startswith(PEFT_PREFIX) and name.endswith(suffix):
                halves.setdefault(name[len(PEFT_PREFIX):-len(suffix)], {})[which] = array
                break
        else:
            raise MigrateError(f"{where}: tensor {name} is not a LoRA A or B weight (only those are supported)")
    out = {}
    for module, pair in halves.items():
        if set(pair) != {"A", "B"}:
            raise MigrateError(f"{where}: {module} has lora_{'A' if 'A' in pair else 'B'} but not its partner")
        a, b = pair["A"], pair["B"]
        if a.ndim != 2 or b.ndim != 2 or a.shape[0] != rank or b.shape[1] != rank:
            raise MigrateError(f"{where}: {module} lora_A {list(a.shape)} / lora_B {list(b.shape)} "
                               f"are not of rank r = {rank}")
        if not (np.isfinite(a.astype(np.float32)).all() and np.isfinite(b.astype(np.float32)).all()):
            raise MigrateError(f"{where}: {module} holds NaN or Inf")
        out[module] = (a.astype(np.float32), b.astype(np.float32))
    if not out:
        raise MigrateError(f"{where}: no LoRA weights")
    return dict(sorted(out.items(), key=lambda kv: _natural(kv[0])))


def _natural(name: str) -> list:
    return [int(p) if p.isdigit() else p for p in name.split(".")]

