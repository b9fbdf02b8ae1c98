"""Declarative keymaps: load `keymaps/*.yaml`, expand `{layer}` templates, map
config fields both ways, and pair source/target parameter names.

A keymap is data; this module holds no parameter name of any model.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from migrate.errors import MigrateError

KEYMAP_DIR = Path(os.environ.get("MIGRATE_KEYMAPS", Path(__file__).resolve().parent.parent / "keymaps"))


@dataclass(frozen=True)
class ParamRule:
    src: str                 # HF name template
    dst: str                 # MindSpore name template
    when: str | None = None  # MindSpore config flag that must be true
    tied_to: str | None = None  # HF name this weight equals when embeddings are tied


@dataclass(frozen=True)
class Pair:
    src: str
    dst: str
    tied_to: str | None = None  # set when the pair is dropped because it is tied


@dataclass
class Keymap:
    name: str
    version: int
    path: Path
    model_types: list[str]
    architectures: list[str]
    target: str
    layer_count: str
    config: list[tuple[str, list[str]]]
    passthrough: dict[str, Any]
    rules: list[ParamRule]
    ignore: list[str]
    align: dict[str, str]
    constants: dict[str, Any]

    # ---------- loading ----------
    @classmethod
    def load(cls, name_or_path: str) -> "Keymap":
        path = Path(name_or_path)
        if path.suffix not in (".yaml", ".yml"):
            path = KEYMAP_DIR / f"{name_or_path}.yaml"
        if not path.is_file():
            raise MigrateError(f"unknown keymap {name_or_path!r}; known: {', '.join(available())}")
        try:
            data = _read_with_base(path)
            return cls._from_data(data, path)
        except (yaml.YAMLError, KeyError, TypeError, ValueError, AttributeError) as exc:
            raise MigrateError(f"invalid keymap {path}: {exc}") from None

    @classmethod
    def _from_data(cls, data: dict, path: Path) -> "Keymap":
        rules = []
        for src, spec in data["params"].items():
            if isinstance(spec, str):
                rules.append(ParamRule(src, spec))
            else:
                rules.append(ParamRule(src, spec["to"], spec.get("when"), spec.get("tied_to")))
        config = []
        for hf_field, ms_fields in data["config"].items():
            if ms_fields is None:  # an inheriting keymap drops a row of its base
                continue
            config.append((hf_field, [ms_fields] if isinstance(ms_fields, str) else list(ms_fields)))
        return cls(
            name=data["family"],
            version=int(data.get("version", 1)),
            path=path,
            model_types=list(data.get("model_type", [])),
            architectures=list(data.get("architectures", [])),
            target=data["target"],
            layer_count=data.get("layer_count", "num_layers"),
            config=config,
            passthrough={k: v for k, v in data.get("config_passthrough", {}).items() if v is not None},
            rules=rules,
            ignore=list(data.get("ignore", [])),
            align=dict(data.get("align", {})),
            constants=dict(data.get("config_constants", {})),
        )

    # ---------- config ----------
    def check_source(self, hf_config: dict) -> None:
        model_type = hf_config.get("model_type")
        if self.model_types and model_type not in self.model_types:
            arch = ", ".join(hf_config.get("architectures") or []) or model_type
            raise MigrateError(
                f"keymap {self.name} does not know architecture {arch!r} (model_type {model_type!r}); "
                f"it converts: {', '.join(self.architectures)}"
            )

    def hf_to_ms_config(self, hf_config: dict) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for hf_field, ms_fields in self.config:
            found, value = _get_path(hf_config, hf_field)
            if not found:
                continue
            if isinstance(value, dict):
                # A dict field keeps what more specific rows did not already take.
                taken = {f.split(".", 1)[1] for f, _ in self.config if f.startswith(hf_field + ".")}
                value = {k: v for k, v in value.items() if k not in taken} or None
            for ms_field in ms_fields:
                out[ms_field] = value
        out.update(self.constants)  # facts of the family, not spelled in its config.json
        return out

    def ms_to_hf_config(self, ms_config: dict) -> dict[str, Any]:
        for name, value in self.constants.items():
            if name in ms_config and ms_config[name] != value:
                raise MigrateError(f"cannot export as {self.name}: model has {name}={ms_config[name]!r}, "
                                   f"the family fixes {value!r}")
        out: dict[str, Any] = dict(self.passthrough)
        # Whole-dict rows first, so dotted rows can fill into them.
        for hf_field, ms_fields in sorted(self.config, key=lambda row: row[0].count(".")):
            values = [ms_config[f] for f in ms_fields if f in ms_config]
            if not values:
                continue
            if any(v != values[0] for v in values[1:]):
                raise MigrateError(
                    f"cannot export {hf_field}: MindSpore fields {', '.join(ms_fields)} disagree ({values})"
                )
            value = values[0]
            if value is None and "." not in hf_field:
                out.setdefault(hf_field, None)
                continue
            _set_path(out, hf_field, dict(value) if isinstance(value, dict) else value)
        return out

    # ---------- parameters ----------
    def pairs(self, ms_config: dict) -> tuple[list[Pair], list[Pair]]:
        """(active pairs, tied pairs) for one model config, templates expanded."""
        layers = ms_config.get(self.layer_count)
        if not isinstance(layers, int) or layers < 0:
            raise MigrateError(f"model config has no valid {self.layer_count}: {layers!r}")
        tied = bool(ms_config.get("tie_word_embeddings"))
        active, dropped = [], []
        for rule in self.rules:
            if rule.when and not ms_config.get(rule.when):
                continue
            expanded = (
                [(rule.src.replace("{layer}", str(i)), rule.dst.replace("{layer}", str(i))) for i in range(layers)]
                if "{layer}" in rule.src
                else [(rule.src, rule.dst)]
            )
            for src, dst in expanded:
                if rule.tied_to and tied:
                    dropped.append(Pair(src, dst, rule.tied_to))
                else:
                    active.append(Pair(src, dst))
        return active, dropped


    def ignored(self, ms_config: dict) -> set[str]:
        layers = int(ms_config.get(self.layer_count) or 0)
        return {name for template in self.ignore for name in _expand(template, layers)}


MERGED_SECTIONS = ("config", "config_passthrough", "config_constants", "params", "align")


def _read_with_base(path: Path, seen: tuple = ()) -> dict:
    """A keymap may `extends: <family>` another: mapping sections merge (own
    entries win), everything else is replaced."""
    data = yaml.safe_load(path.read_text())
    if not isinstance(data, dict):
        raise ValueError("a keymap is a YAML mapping")
    base_name = data.pop("extends", None)
    if base_name is None:
        return data
    base_path = KEYMAP_DIR / f"{base_name}.yaml"
    if base_path in seen or base_path == path:
        raise ValueError(f"keymap inheritance loops through {base_name}")
    if not base_path.is_file():
        raise ValueError(f"extends unknown keymap {base_name!r}")
    merged = _read_with_base(base_path, seen + (path,))
    for key, value in data.items():
        if key in MERGED_SECTIONS and isinstance(value, dict):
            merged[key] = {**merged.get(key, {}), **value}
        else:
            merged[key] = value
    return merged


def _expand(template: str, layers: int) -> list[str]:
    if "{layer}" not in template:
        return [template]
    return [template.replace("{layer}", str(i)) for i in range(layers)]


def available() -> list[str]:
    return sorted(p.stem for p in KEYMAP_DIR.glob("*.yaml"))


def registry(extra: str | Path | None = None) -> dict[str, Keymap]:
    """Every bundled keymap by family name, plus a user's keymap file. A family
    name claimed twice is refused, naming both files -- never silently shadowed."""
    found: dict[str, Keymap] = {}
    paths = sorted(KEYMAP_DIR.glob("*.yaml"))
    if extra is not None:
        paths.append(Path(extra))
    for path in paths:
        km = Keymap.load(str(path))
        if km.name in found and found[km.name].path.resolve() != km.path.resolve():
            raise MigrateError(
                f"keymap family {km.name!r} in {km.path} is already defined by {found[km.name].path}; "
                "give your keymap its own `family` name"
            )
        found[km.name] = km
    return found


def recorded_keymap(ms_dir: str | Path) -> str:
    """The keymap a converted folder's conversion.json records; hf_llama for a folder
    without one (a trained run's checkpoint)."""
    import json

    manifest = Path(ms_dir) / "conversion.json"
    if not manifest.is_file():
        return "hf_llama"
    try:
        return json.loads(manifest.read_text())["keymap"]["name"]
    except (ValueError, KeyError, TypeError):
        raise MigrateError(f"{manifest} is not a conversion manifest") from None


def resolve(name_or_path: str, hf_config: dict | None = None) -> Keymap:
    """`--src NAME`, `--src auto` (from config.json's model_type / architectures)
    or `--keymap FILE` (checked against the registry)."""
    if name_or_path != "auto":
        path = Path(name_or_path)
        if path.suffix in (".yaml", ".yml"):
            if not path.is_file():
                raise MigrateError(f"keymap file not found: {path}")
            return registry(extra=path)[Keymap.load(str(path)).name]
        return Keymap.load(name_or_path)
    if hf_config is None:
        raise MigrateError("--src auto needs the model's config.json")
    model_type = hf_config.get("model_type")
    archs = set(hf_config.get("architectures") or [])
    candidates = [km for km in registry().values()
                  if model_type in km.model_types or archs & set(km.architectures)]
    if len(candidates) != 1:
        known = ", ".join(f"{km.name} ({'/'.join(km.architectures)})" for km in registry().values())
        what = "/".join(sorted(archs)) or model_type
        if not candidates:
            raise MigrateError(f"no keymap knows {what!r} (model_type {model_type!r}); known families: {known}")
        raise MigrateError(f"several keymaps claim {what!r}: {', '.join(km.name for km in candidates)}")
    return candidates[0]


def _get_path(data: dict, dotted: str):
    node: Any = data
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


def _set_path(data: dict, dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = data
    for part in parts[:-1]:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[parts[-1]] = value
