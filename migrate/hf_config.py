"""Read a Hugging Face `config.json` the way transformers itself does.

Going through `AutoConfig` normalises old spellings (`rope_theta` +
`rope_scaling` become `rope_parameters`), so one keymap serves configs written
by any transformers version. Under transformers 4.x (4.45 on), which keeps the old spellings,
`load_hf_config` joins them as 5.x does and `write_hf_config` splits them again
(`join_rope`, `split_rope`); `dtype_kwargs` names the model dtype as the installed version does.
Every load is local (``local_files_only=True``); the entry points
(`migrate.cli`, the demos) also set HF_HUB_OFFLINE for the libraries they call, nothing at import.

Importing transformers (and the torch it pulls in) costs seconds, more than a conversion's copy of a
small model. When a keymap is given and config.json spells every field it reads, `load_hf_config`
reads the file as JSON with transformers' own rules for what it would change (`plain_fields`); a
config that leaves a field to a class default transformers alone knows goes through AutoConfig.
tests/test_hf_config_plain.py holds the two ways equal, field for field, on configs of every family.
"""
from __future__ import annotations

import copy
import json
import math
from pathlib import Path

from migrate.errors import MigrateError
from migrate.jsonsafe import load_json
from migrate.safeyaml import quote


def read_raw_config(folder: Path) -> dict:
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise MigrateError(f"no config.json in {folder}")
    data = load_json(path, expect=dict)  # bounded: one line naming the file otherwise
    bad = _non_finite(data)
    if bad is not None:  # 1e400 reads as inf, NaN as nan: convert wrote rms_norm_eps inf into model.yaml
        raise MigrateError(f"config.json in {folder}: {bad[0]} is {bad[1]}, not a finite number")
    # The two fields that pick a keymap and a model class: names, or nothing.
    model_type, archs = data.get("model_type"), data.get("architectures")
    if model_type is not None and not isinstance(model_type, str):
        raise MigrateError(f"config.json in {folder}: model_type must be a string, got {quote(model_type)}")
    if archs is not None and not (isinstance(archs, list) and all(isinstance(a, str) for a in archs)):
        raise MigrateError(f"config.json in {folder}: architectures must be a list of names, got {quote(archs)}")
    return data


def _non_finite(value, where: str = "") -> tuple[str, float] | None:
    """(dotted field, value) of the first NaN or infinite number in a config, else None."""
    if isinstance(value, float) and not math.isfinite(value):
        return where or "a value", value
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = _non_finite(item, f"{where}.{key}" if where else str(key))
        if found is not None:
            return found
    return None


def load_hf_config(folder: Path, keymap=None) -> dict:
    """The normalised config as a plain dict (transformers' `to_dict`).

    A model type transformers does not know (a user's own architecture with its
    own keymap) is read as plain JSON: there is nothing to normalise. keymap: the fields
    it reads may come from the JSON without transformers (`plain_fields`)."""
    raw = read_raw_config(folder)
    if keymap is not None:
        plain = plain_fields(raw, keymap)
        if plain is not None:
            return plain
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if raw.get("model_type") not in CONFIG_MAPPING:
        return raw
    try:
        config = AutoConfig.from_pretrained(str(folder), local_files_only=True)
    except Exception as exc:  # transformers raises ValueError/OSError/KeyError for bad configs
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise MigrateError(f"transformers cannot read config.json in {folder}: {first}") from None
    return join_rope(config.to_dict()) if transformers_version() < (5, 0) else config.to_dict()


# transformers' config rules for the fields the bundled keymaps read, where a config.json spells them
# (configuration_llama/mistral/qwen2/gpt2/bert): a missing KV-head count is the head count, Llama's
# missing head_dim is hidden_size / heads (Mistral's is too from 4.58 on, but 4.57 keeps None: such a
# file goes through transformers), Qwen2's window is dropped unless use_sliding_window. Other types
# (Gemma renames its activation) always load through AutoConfig.
_DERIVED_HEADS = {"llama", "mistral", "qwen2"}
PLAIN_TYPES = frozenset({"llama", "mistral", "qwen2", "gpt2", "bert"})


def plain_fields(raw: dict, keymap) -> dict | None:
    """config.json as transformers would normalise it, for every field `keymap` reads; a field the
    file omits takes the keymap's `hf_defaults` for its model type (the HF config class's defaults,
    checked against the installed transformers by tests/test_hf_config_plain.py); None where one has
    none there (then only transformers can say what it is)."""
    if raw.get("model_type") not in PLAIN_TYPES:
        return None
    fields = join_rope(raw)
    model_type = fields["model_type"]
    if fields.get("rope_scaling") and "rope_parameters" not in fields:
        return None  # a scaling without its theta: transformers joins it to the class's theta
    if model_type in _DERIVED_HEADS:
        heads = fields.get("num_attention_heads")
        if not isinstance(heads, int) or isinstance(heads, bool) or heads <= 0 \
                or not isinstance(fields.get("hidden_size"), int):
            return None  # transformers' own checks say what is wrong
        if fields.get("num_key_value_heads") is None:
            fields["num_key_value_heads"] = heads
        if fields.get("head_dim") is None and model_type == "llama":
            fields["head_dim"] = fields["hidden_size"] // heads
    defaults = keymap.hf_defaults.get(model_type, {})  # the config class's own, where a file omits them
    for name in {hf_field.split(".", 1)[0] for hf_field, targets in keymap.config if targets}:
        if name not in fields:
            if name not in defaults:
                return None
            fields[name] = copy.deepcopy(defaults[name])
    if model_type == "qwen2" and not fields.get("use_sliding_window"):
        fields["sliding_window"] = None
    return fields


def write_hf_config(folder: Path, fields: dict) -> None:
    """Write config.json so that the installed transformers loads exactly what we meant: a bundled
    family's fields as JSON in that version's spelling (`PLAIN_TYPES`: read back, they load as the file
    transformers itself writes; tests/test_hf_config_plain.py), other known types through AutoConfig."""
    fields = dict(fields)
    version = installed_transformers()
    if fields.get("model_type") in PLAIN_TYPES:
        if version is not None and transformers_version() < (5, 0):
            fields = split_rope(fields)
        if version is not None:
            fields["transformers_version"] = version
        (Path(folder) / "config.json").write_text(json.dumps(fields, indent=2, sort_keys=True) + "\n")
        return
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if fields.get("model_type") not in CONFIG_MAPPING:  # a user's own architecture: plain JSON
        (Path(folder) / "config.json").write_text(json.dumps(fields, indent=2, sort_keys=True) + "\n")
        return
    model_type = fields.pop("model_type")
    if transformers_version() < (5, 0):
        fields = split_rope(fields)
    config = AutoConfig.for_model(model_type, **fields)
    config.save_pretrained(str(folder))


def installed_transformers() -> str | None:
    """The transformers version: the loaded module's, else its metadata's (importing it costs seconds);
    None when it is not installed."""
    import sys
    from importlib.metadata import PackageNotFoundError, version

    if "transformers" in sys.modules:
        return sys.modules["transformers"].__version__
    try:
        return version("transformers")
    except PackageNotFoundError:
        return None


def transformers_version() -> tuple[int, int]:
    major, minor = ((installed_transformers() or "5.0").split(".") + ["0"])[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def join_rope(fields: dict) -> dict:
    """transformers 4.x's `rope_theta` and `rope_scaling` as 5.x's `rope_parameters` (the keymaps'
    spelling): the scaling's fields, its `rope_type` (or legacy `type`; 'default' when none) and the theta.
    Left alone: a config with `rope_parameters` already, or without a theta (no RoPE)."""
    if "rope_parameters" in fields or "rope_theta" not in fields:
        return fields
    fields = dict(fields)
    scaling = dict(fields.pop("rope_scaling", None) or {})
    scaling.setdefault("rope_type", scaling.get("type", "default"))
    fields["rope_parameters"] = {**scaling, "rope_theta": fields.pop("rope_theta")}
    return fields


def split_rope(fields: dict) -> dict:
    """5.x's `rope_parameters` as transformers 4.x's `rope_theta` + `rope_scaling` (None for plain RoPE):
    4.x takes `rope_parameters` as an unknown attribute and would keep its default theta."""
    if "rope_parameters" not in fields:
        return fields
    fields = dict(fields)
    rope = dict(fields.pop("rope_parameters") or {})
    if "rope_theta" in rope:
        fields["rope_theta"] = rope.pop("rope_theta")
    plain = rope.get("rope_type", rope.get("type", "default")) == "default" and set(rope) <= {"rope_type", "type"}
    fields["rope_scaling"] = None if plain else rope
    return fields


def dtype_kwargs(dtype) -> dict:
    """`from_pretrained`/`from_config`'s dtype argument: `dtype` from transformers 4.56, `torch_dtype`
    before (where `dtype=` is taken as a config field and the model silently stays float32)."""
    return {"dtype": dtype} if transformers_version() >= (4, 56) else {"torch_dtype": dtype}
