"""The types a keymap's fields must have, checked once after loading so that a
wrong type is one line naming the field, never a traceback from deep inside the
code that reads it (`architectures: [[X]]` once crashed a set() far away).

Unknown fields are left alone (sections other code may add are not refused here);
the known ones must have their documented shape.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from migrate.safeyaml import quote

MODEL_CLASS = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")   # "module.path:Class"
ROW_FIELDS = ("from", "to", "when", "tied_to", "layout")


class SchemaError(ValueError):
    pass


def _fail(where: str, expected: str, value: Any) -> None:
    raise SchemaError(f"field `{where}` must be {expected}, got {quote(value)}")


def _str(where, value):
    if not isinstance(value, str):
        _fail(where, "a string", value)


def _opt_str(where, value):
    if value is not None:
        _str(where, value)


def _int(where, value):
    if not isinstance(value, int) or isinstance(value, bool):
        _fail(where, "an integer", value)


def _str_list(where, value):
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        _fail(where, "a list of strings", value)


def _names(where, value):
    """One name or a list of names."""
    if not isinstance(value, str) and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
        _fail(where, "a string or a list of strings", value)


def _model_class(where, value):
    if not isinstance(value, str) or not MODEL_CLASS.fullmatch(value):
        _fail(where, "a model class 'module:Class'", value)


def _mapping(values: Callable[[str, Any], None] | None, nullable: bool = True):
    """A mapping of string keys whose values pass `values` (null allowed: it drops an inherited row)."""
    def check(where, value):
        if not isinstance(value, dict):
            _fail(where, "a mapping", value)
        for key, item in value.items():
            if not isinstance(key, str):
                _fail(where, "a mapping with string keys", key)
            if item is None and nullable:
                continue
            if values is not None:
                values(f"{where}.{key}", item)
    return check


def _scalar(where, value):
    if isinstance(value, (dict, list)):
        _fail(where, "a string or a number", value)


def _row(where, value):
    if isinstance(value, str):
        return
    if not isinstance(value, dict):
        _fail(where, "a target name or a mapping (to, from, when, tied_to, layout)", value)
    if "to" not in value:
        _fail(where, "a mapping with `to`", value)
    for key in ("from", "to", "layout"):
        if key in value:
            _names(f"{where}.{key}", value[key])
    for key in ("when", "tied_to"):
        if key in value:
            _opt_str(f"{where}.{key}", value[key])


def _ignore(where, value):
    if not isinstance(value, list):
        _fail(where, "a list", value)
    for i, entry in enumerate(value):
        if isinstance(entry, str):
            continue
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            _fail(f"{where}[{i}]", "a name or a mapping with `name`", entry)
        _opt_str(f"{where}[{i}].when", entry.get("when"))


SECTIONS: dict[str, Callable[[str, Any], None]] = {
    "family": _str,
    "version": _int,
    "description": _str,
    "model_type": _str_list,
    "architectures": _str_list,
    "target": _model_class,
    "layer_count": _str,
    "base_prefix": _opt_str,
    "extends": _str,
    "config": _mapping(_names),
    "config_passthrough": _mapping(None),
    "config_constants": _mapping(None),
    "params": _mapping(_row),
    "ignore": _ignore,
    "align": _mapping(_str),
    "vars": _mapping(_scalar, nullable=False),
    "rename": _mapping(_str),
    "hf_defaults": _mapping(_mapping(None, nullable=False), nullable=False),
}


def _section(where: str, data: dict) -> None:
    for key, check in SECTIONS.items():
        if key in data:
            check(f"{where}{key}", data[key])


def _overrides(where, value):
    if not isinstance(value, dict):
        _fail(where, "a mapping of sections", value)
    _section(f"{where}.", value)


def check_schema(data: dict) -> None:
    """Raise SchemaError naming the first field of `data` (a keymap with its bases
    merged) whose type is wrong or that is required and absent."""
    for key in ("family", "target", "config", "params"):
        if key not in data:
            raise SchemaError(f"field `{key}` is required")
    _section("", data)
    _mapping(_overrides, nullable=False)("variants", data.get("variants") or {})
    _mapping(_overrides)("targets", data.get("targets") or {})
