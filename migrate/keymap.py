"""Declarative keymaps: load `keymaps/*.yaml`, expand `{layer}` templates, map
config fields both ways, and pair source/target parameter names.

A keymap is data; this module holds no parameter name of any model.

Rows of `params` (HF -> MindSpore):
    hf.name: ms.name                                      a rename
    hf.name: {to: ms.name, when: FLAG, tied_to: hf.other}  a conditional or tied rename
    label:   {from: [hf.a, hf.b], to: [ms.x], layout: NAME, when: FLAG}
                                                          N source tensors -> M targets through a
                                                          named layout of `migrate.transforms`
                                                          (a list or "a+b" chains layouts)
`when: "!FLAG"` negates. A `null` row drops an inherited one.

Beyond `params`, a keymap may hold:
- `vars`: `{name}` placeholders substituted in every tensor name (e.g. a prefix);
- `base_prefix`: HF's base-model prefix (`transformer.`): a checkpoint saved from the base
  model alone has no name starting with it, and is read as if every name did;
- `variants`: per HF architecture (config.json `architectures`), sections that override
  the base ones (another `target` model, other `vars`, extra `params`, another `align`);
- `targets`: named alternative MindSpore layouts of the same model (`--target NAME`),
  each overriding sections (`config_constants`, `params`) and optionally renaming the
  bundled model's parameters in the written checkpoint (`rename`: model name -> checkpoint
  name), e.g. MindFormers' fused `qkv_concat` layout and its mcore names.
"""
from __future__ import annotations

import copy
import importlib.resources
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from migrate.errors import MigrateError
from migrate.jsonsafe import load_json
from migrate.keymap_schema import check_schema
from migrate.safeyaml import clip, load_yaml, quote
from migrate.transforms import get_layout


def _bundled_dir() -> Path:
    """keymaps/ of the checkout, installed as the package data migrate.keymaps; a checkout on
    PYTHONPATH (not installed) has no migrate.keymaps, so its keymaps/ beside migrate/ is used."""
    try:
        return Path(str(importlib.resources.files("migrate.keymaps")))
    except ModuleNotFoundError:
        return Path(__file__).resolve().parent.parent / "keymaps"


# The bundled keymaps.
KEYMAP_DIR = _bundled_dir()
_chosen: Path | None = None  # the folder an entry point chose instead (`use_keymap_dir`)


def use_keymap_dir(folder: str | Path | None) -> None:
    """Look keymap names up in ``folder`` instead of the bundled keymaps (None: the bundled ones).
    An entry point's choice: `migrate` passes MIGRATE_KEYMAPS; nothing reads the environment here."""
    global _chosen
    _chosen = Path(folder) if folder else None


def keymap_dir(folder: str | Path | None = None) -> Path:
    """Where keymap names are looked up: ``folder``, else the entry point's choice, else the bundled one."""
    return Path(folder) if folder else (_chosen or KEYMAP_DIR)
# The model.yaml fields through which a converted folder names what it was converted to
# (`Keymap.for_model`): the bundled model class, and the keymap target its checkpoint is written for.
MODEL_CLASS_FIELD = "model_class"
TARGET_FIELD = "keymap_target"


@dataclass(frozen=True)
class ParamRule:
    src: tuple[str, ...]           # HF name templates (one for a rename)
    dst: tuple[str, ...]           # MindSpore name templates
    when: str | None = None        # MindSpore config flag that must be true ("!FLAG": false)
    tied_to: str | None = None     # HF name this weight equals when embeddings are tied (renames only)
    layout: str | None = None      # migrate.transforms layout (chain "a+b") of a fused row


@dataclass(frozen=True)
class Pair:
    src: str
    dst: str
    tied_to: str | None = None  # set when the pair is dropped because it is tied


@dataclass(frozen=True)
class Group:
    """One active keymap row for one layer: source tensors -> target tensors. A
    rename has one of each and no layout; a fused row names its layout."""

    src: tuple[str, ...]
    dst: tuple[str, ...]
    layout: str | None = None

    def transform(self):
        return get_layout(self.layout)


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
    ignore: list[tuple[str, str | None]]       # (name template, when)
    align: dict[str, str]
    constants: dict[str, Any]
    rename: dict[str, str] = field(default_factory=dict)   # model name template -> checkpoint name template
    hf_defaults: dict[str, dict[str, Any]] = field(default_factory=dict)  # model_type -> HF class defaults
    base_prefix: str = ""                      # HF base-model prefix a checkpoint may lack (GPT-2 hub files)
    variant: str | None = None                 # the architecture whose variant is applied
    target_name: str | None = None             # the applied entry of `targets`
    data: dict = field(default_factory=dict, repr=False)   # merged YAML, variants and targets unapplied

    # ---------- loading ----------
    @classmethod
    def load(cls, name_or_path: str) -> Keymap:
        path = Path(name_or_path)
        if path.suffix not in (".yaml", ".yml"):
            path = keymap_dir() / f"{name_or_path}.yaml"
        if not path.is_file():
            raise MigrateError(f"unknown keymap {quote(name_or_path)}; known: {', '.join(available())}")
        try:
            data = _read_with_base(path)
            check_schema(data)
            return cls._from_data(data, path)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise MigrateError(f"invalid keymap {path}: {clip(exc)}") from None

    @classmethod
    def _from_data(cls, data: dict, path: Path, variant: str | None = None,
                   target_name: str | None = None, applied: dict | None = None) -> Keymap:
        """`data`: the keymap as read; `applied`: it with a variant and/or target merged in."""
        view = data if applied is None else applied
        names = dict(view.get("vars") or {})
        if "layer" in names:
            raise ValueError("`layer` is reserved for the layer index and cannot be a var")

        def sub(text: str) -> str:
            for key, value in names.items():
                text = text.replace("{" + key + "}", str(value))
            return text

        rules = [_rule(sub(key), spec, sub) for key, spec in view["params"].items() if spec is not None]
        config = []
        for hf_field, ms_fields in view["config"].items():
            if ms_fields is None:  # an inheriting keymap drops a row of its base
                continue
            config.append((hf_field, [ms_fields] if isinstance(ms_fields, str) else list(ms_fields)))
        ignore = []
        for entry in view.get("ignore") or []:
            if isinstance(entry, str):
                ignore.append((sub(entry), None))
            else:
                ignore.append((sub(entry["name"]), entry.get("when")))
        return cls(
            name=data["family"],
            version=int(data.get("version", 1)),
            path=path,
            model_types=list(data.get("model_type", [])),
            architectures=list(data.get("architectures", [])),
            target=view["target"],
            layer_count=view.get("layer_count", "num_layers"),
            config=config,
            passthrough={k: v for k, v in (view.get("config_passthrough") or {}).items() if v is not None},
            rules=rules,
            ignore=ignore,
            align={k: sub(v) for k, v in (view.get("align") or {}).items() if v is not None},
            constants={k: v for k, v in (view.get("config_constants") or {}).items() if v is not None},
            rename={sub(k): sub(v) for k, v in (view.get("rename") or {}).items() if v is not None},
            hf_defaults={t: dict(d or {}) for t, d in (view.get("hf_defaults") or {}).items()},
            base_prefix=view.get("base_prefix") or "",
            variant=variant,
            target_name=target_name,
            data=data,
        )

    # ---------- variants and targets ----------
    def variants(self) -> dict[str, dict]:
        return dict(self.data.get("variants") or {})

    def targets(self) -> dict[str, dict]:
        return {k: v for k, v in (self.data.get("targets") or {}).items() if v is not None}

    def _apply(self, variant: str | None, target: str | None) -> Keymap:
        view = copy.deepcopy({k: v for k, v in self.data.items() if k not in ("variants", "targets")})
        if variant is not None:
            view = _merge(view, self.variants()[variant])
        if target is not None:
            for step in self._target_chain(target):
                view = _merge(view, {k: v for k, v in self.targets()[step].items()
                                     if k not in ("extends", "description")})
        try:
            return Keymap._from_data(self.data, self.path, variant, target, view)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise MigrateError(f"invalid keymap {self.path}: {clip(exc)}") from None

    def _target_chain(self, target: str) -> list[str]:
        targets, chain = self.targets(), []
        while target is not None:
            if target not in targets:
                known = ", ".join(targets) or "none"
                raise MigrateError(f"keymap {self.name} has no target {quote(target)} (its targets: {known})")
            if target in chain:
                raise MigrateError(f"keymap {self.name}: targets extend each other in a loop ({quote(target)})")
            chain.insert(0, target)
            target = targets[target].get("extends")
        return chain

    def for_source(self, hf_config: dict) -> Keymap:
        """The variant for the HF checkpoint's architecture (the base keymap when it names none)."""
        archs = hf_config.get("architectures") or []
        for arch in archs:
            if arch in self.variants():
                return self._apply(arch, self.target_name)
        if self.variants() and archs and not set(archs) & set(self.architectures):
            # With variants, the architecture decides the tensors: an unknown one cannot fall back.
            raise MigrateError(f"keymap {self.name} converts {', '.join(self.architectures)}; "
                               f"this checkpoint is {', '.join(archs)}")
        return self

    def for_model_class(self, model_class: str | None) -> Keymap:
        """The variant whose target is `model_class` (a converted folder's model.yaml)."""
        if not model_class or model_class == self.target:
            return self
        for arch, over in self.variants().items():
            if (over or {}).get("target") == model_class:
                return self._apply(arch, self.target_name)
        return self

    def with_target(self, target: str | None) -> Keymap:
        """The keymap with entry `target` of `targets` applied (None: unchanged)."""
        if target is None or target == self.target_name:
            return self
        return self._apply(self.variant, target)

    def for_model(self, ms_config: dict) -> Keymap:
        """The variant and target a converted folder's model.yaml names."""
        return self.for_model_class(ms_config.get(MODEL_CLASS_FIELD)).with_target(ms_config.get(TARGET_FIELD))

    # ---------- config ----------
    def check_source(self, hf_config: dict) -> None:
        model_type = hf_config.get("model_type")
        if self.model_types and model_type not in self.model_types:
            arch = ", ".join(hf_config.get("architectures") or []) or model_type
            raise MigrateError(
                f"keymap {self.name} does not know architecture {quote(arch)} (model_type {quote(model_type)}); "
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
        out.update(self.constants)  # facts of the family (or target), not spelled in its config.json
        return out

    def ms_to_hf_config(self, ms_config: dict) -> dict[str, Any]:
        for name, value in self.constants.items():
            if name in ms_config and ms_config[name] != value:
                raise MigrateError(f"cannot export as {self.name}: model has {name}={quote(ms_config[name])}, "
                                   f"the {'target ' + self.target_name if self.target_name else 'family'} "
                                   f"fixes {quote(value)}")
        out: dict[str, Any] = dict(self.passthrough)
        # Whole-dict rows first, so dotted rows can fill into them.
        for hf_field, ms_fields in sorted(self.config, key=lambda row: row[0].count(".")):
            values = [ms_config[f] for f in ms_fields if f in ms_config]
            if not values:
                continue
            if any(v != values[0] for v in values[1:]):
                raise MigrateError(
                    f"cannot export {hf_field}: MindSpore fields {', '.join(ms_fields)} disagree ({quote(values)})"
                )
            value = values[0]
            if value is None and "." not in hf_field:
                out.setdefault(hf_field, None)
                continue
            _set_path(out, hf_field, dict(value) if isinstance(value, dict) else value)
        return out

    # ---------- parameters ----------
    def _layers(self, ms_config: dict) -> int:
        layers = ms_config.get(self.layer_count)
        if not isinstance(layers, int) or layers < 0:
            raise MigrateError(f"model config has no valid {self.layer_count}: {quote(layers)}")
        return layers

    def groups(self, ms_config: dict) -> tuple[list[Group], list[Pair]]:
        """(active groups, tied pairs) for one model config, templates expanded: every
        row the config enables, renames as one-to-one groups without a layout."""
        layers = self._layers(ms_config)
        tied = bool(ms_config.get("tie_word_embeddings"))
        active, dropped = [], []
        for rule in self.rules:
            if not _holds(rule.when, ms_config):
                continue
            templates = rule.src + rule.dst
            for i in (range(layers) if any("{layer}" in t for t in templates) else [None]):
                src = tuple(_at(t, i) for t in rule.src)
                dst = tuple(_at(t, i) for t in rule.dst)
                if rule.tied_to and tied:
                    dropped.append(Pair(src[0], dst[0], _at(rule.tied_to, i)))
                else:
                    active.append(Group(src, dst, rule.layout))
        return active, dropped

    def pairs(self, ms_config: dict) -> tuple[list[Pair], list[Pair]]:
        """(one-to-one pairs, tied pairs): the renames among `groups` (fused rows have no
        single partner on the other side and are left out)."""
        active, dropped = self.groups(ms_config)
        return [Pair(g.src[0], g.dst[0]) for g in active if g.layout is None], dropped

    def checkpoint_names(self, ms_config: dict) -> dict[str, str]:
        """Model parameter name -> name written in the checkpoint, for a target that
        renames (`rename`); empty when the checkpoint uses the model's own names."""
        layers = self._layers(ms_config)
        out = {}
        for model_name, ckpt_name in self.rename.items():
            for i in (range(layers) if "{layer}" in model_name + ckpt_name else [None]):
                out[_at(model_name, i)] = _at(ckpt_name, i)
        return out

    def ignored(self, ms_config: dict) -> set[str]:
        layers = int(ms_config.get(self.layer_count) or 0)
        return {name for template, when in self.ignore if _holds(when, ms_config)
                for name in _expand(template, layers)}


MERGED_SECTIONS = ("config", "config_passthrough", "config_constants", "params", "align", "vars", "rename",
                   "variants", "targets")


def _rule(key: str, spec: Any, sub) -> ParamRule:
    if isinstance(spec, str):
        return ParamRule((key,), (sub(spec),))
    if not isinstance(spec, dict):
        raise ValueError(f"params row {quote(key)}: expected a name or a mapping, got {quote(spec)}")
    if "from" not in spec:
        layout = _layout_spec(spec, key)
        _check_arity(key, layout, 1, 1)
        return ParamRule((key,), (sub(spec["to"]),), spec.get("when"),
                         sub(spec["tied_to"]) if spec.get("tied_to") else None, layout)
    src = [spec["from"]] if isinstance(spec["from"], str) else list(spec["from"])
    dst = [spec["to"]] if isinstance(spec["to"], str) else list(spec["to"])
    layout = _layout_spec(spec, key)
    if spec.get("tied_to"):
        raise ValueError(f"params row {quote(key)}: tied_to applies to renames only")
    if layout is None and (len(src), len(dst)) != (1, 1):
        raise ValueError(f"params row {quote(key)}: {len(src)} source(s) -> {len(dst)} target(s) needs a layout")
    _check_arity(key, layout, len(src), len(dst))
    return ParamRule(tuple(sub(s) for s in src), tuple(sub(d) for d in dst), spec.get("when"), None, layout)


def _check_arity(key: str, layout: str | None, sources: int, targets: int) -> None:
    """A row names as many sources and targets as its layout takes and makes: a target beyond the
    layout's outputs would be listed as filled and never written (and a source beyond its inputs never read)."""
    if layout is None:
        return
    chain = get_layout(layout)
    if (sources, targets) != (chain.n_in, chain.n_out):
        raise ValueError(f"params row {quote(key)}: layout {layout} maps {chain.n_in} source(s) to "
                         f"{chain.n_out} target(s); the row names {sources} -> {targets}")


def _layout_spec(spec: dict, key: str) -> str | None:
    layout = spec.get("layout")
    if layout is None:
        return None
    name = layout if isinstance(layout, str) else "+".join(layout)
    try:
        get_layout(name)
    except MigrateError as exc:
        raise ValueError(f"params row {quote(key)}: {clip(exc)}") from None
    return name


def _holds(when: str | None, ms_config: dict) -> bool:
    if not when:
        return True
    if when.startswith("!"):
        return not ms_config.get(when[1:])
    return bool(ms_config.get(when))


def _at(template: str, layer: int | None) -> str:
    return template if layer is None else template.replace("{layer}", str(layer))


def _merge(base: dict, over: dict) -> dict:
    """Mapping sections merge (own entries win; a null entry is dropped when read),
    everything else is replaced."""
    merged = dict(base)
    for key, value in (over or {}).items():
        if key in MERGED_SECTIONS and isinstance(value, dict):
            merged[key] = {**(merged.get(key) or {}), **value}
        else:
            merged[key] = value
    return merged


def _read_with_base(path: Path, seen: tuple = ()) -> dict:
    """A keymap may `extends: <family>` another: mapping sections merge (own
    entries win), everything else is replaced."""
    data = load_yaml(path, "keymap")
    if not isinstance(data, dict):
        raise ValueError("a keymap is a YAML mapping")
    base_name = data.pop("extends", None)
    if base_name is None:
        return data
    base_path = _base_path(base_name, path)
    if base_path in seen or base_path == path.resolve():
        raise ValueError(f"keymap inheritance loops through {base_name}")
    return _merge(_read_with_base(base_path, seen + (path.resolve(),)), data)


_KEYMAP_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


def _base_path(name: Any, path: Path) -> Path:
    """The keymap `extends: name` means: a keymap name, looked up among the bundled
    keymaps, then beside the extending file -- never a path. A file a keymap was handed
    with must not make us read an arbitrary file (`../../x`, `/etc/x`), nor a link
    from either folder to outside it."""
    if not isinstance(name, str) or not _KEYMAP_NAME.fullmatch(name):
        raise ValueError(f"`extends` must name a keymap (a bundled one such as hf_llama, or a file beside "
                         f"this one, without a path), got {quote(name)}")
    stem = name[: -len(Path(name).suffix)] if Path(name).suffix in (".yaml", ".yml") else name
    folders = list(dict.fromkeys([keymap_dir().resolve(), path.resolve().parent]))
    for folder in folders:
        candidate = folder / f"{stem}.yaml"
        if not candidate.is_file():
            continue
        real = candidate.resolve()
        if real.parent != folder:
            raise ValueError(f"`extends: {name}` leads to {real}, outside {folder}")
        return real
    raise ValueError(f"extends unknown keymap {quote(name)} (looked in {', '.join(map(str, folders))})")


def _expand(template: str, layers: int) -> list[str]:
    if "{layer}" not in template:
        return [template]
    return [template.replace("{layer}", str(i)) for i in range(layers)]


def available(folder: str | Path | None = None) -> list[str]:
    """The keymap names of ``folder`` (default: `keymap_dir()`)."""
    return sorted(p.stem for p in keymap_dir(folder).glob("*.yaml"))


def bundled_targets() -> set[str]:
    """The model classes the bundled keymaps name (`target`, and their variants'):
    the classes a keymap or model.yaml may name without the user's opt-in."""
    found = set()
    for km in registry().values():
        found.add(km.target)
        found |= {over["target"] for over in km.variants().values() if over and over.get("target")}
    return found


def registry(extra: str | Path | None = None) -> dict[str, Keymap]:
    """Every bundled keymap by family name, plus a user's keymap file. A family
    name claimed twice is refused, naming both files -- never silently shadowed."""
    found: dict[str, Keymap] = {}
    paths = sorted(keymap_dir().glob("*.yaml"))
    if extra is not None:
        paths.append(Path(extra))
    for path in paths:
        km = Keymap.load(str(path))
        if km.name in found and found[km.name].path.resolve() != km.path.resolve():
            raise MigrateError(
                f"keymap family {quote(km.name)} in {km.path} is already defined by {found[km.name].path}; "
                "give your keymap its own `family` name"
            )
        found[km.name] = km
    return found


def recorded_keymap(ms_dir: str | Path) -> str:
    """The keymap a folder was made with: a converted folder's conversion.json, or a
    training checkpoint's trainer_state.json; hf_llama for a folder with neither."""
    folder = Path(ms_dir)
    for name, keys in (("conversion.json", ("keymap", "name")), ("trainer_state.json", ("keymap",))):
        path = folder / name
        if not path.is_file():
            continue
        try:
            value = load_json(path)
            for key in keys:
                value = value[key]
        except (ValueError, KeyError, TypeError):
            value = None
        if not isinstance(value, str):
            raise MigrateError(f"{path} names no keymap")
        if not _KEYMAP_NAME.fullmatch(value):
            # A folder from someone else must not point us at an arbitrary file.
            raise MigrateError(f"{path} names keymap {quote(value)}, which is not a keymap name")
        return value
    return "hf_llama"


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
            raise MigrateError(f"no keymap knows {quote(what)} (model_type {quote(model_type)}); "
                               f"known families: {known}")
        raise MigrateError(f"several keymaps claim {quote(what)}: {', '.join(km.name for km in candidates)}")
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
