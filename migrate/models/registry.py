"""Build a bundled MindSpore model from a `module:Class` target and its config.

A target string comes from files a user may have been handed (a converted folder's
model.yaml `model_class`, a keymap's `target`), and importing a module runs its code
(`os:system`, `this:s`). So only registered classes are imported: the bundled models
and the targets of the bundled keymaps. Any other class needs the user's explicit
opt-in: `--trust-model-class`, or MIGRATE_TRUST_MODEL_CLASS=1 in the environment,
or `allow_model_class(target)` from Python.
"""
from __future__ import annotations

import argparse
import importlib
import os

from migrate.errors import MigrateError
from migrate.models.config import CONFIG_CLASSES, LlamaConfig
from migrate.safeyaml import clip, quote

MODEL_CLASS_FIELD = "model_class"  # model.yaml field naming the bundled class
TRUST_ENV = "MIGRATE_TRUST_MODEL_CLASS"
_allowed: set[str] = set()         # classes a Python caller allowed explicitly


def allow_model_class(target: str) -> None:
    """Let `target` be imported in this process: a caller that names its own class."""
    _allowed.add(target)


def trusting() -> bool:
    return os.environ.get(TRUST_ENV, "").strip().lower() not in ("", "0", "false", "no")


class TrustModelClassAction(argparse.Action):
    """`--trust-model-class`: sets MIGRATE_TRUST_MODEL_CLASS=1 for this process (and the
    worker processes it starts), the opt-in to import a model class migrate does not bundle."""

    def __init__(self, option_strings, dest, **kwargs):
        kwargs.setdefault("help", "import a model class that migrate does not bundle (model.yaml `model_class`, "
                                  "keymap `target`); only for folders and keymaps you trust")
        super().__init__(option_strings, dest, nargs=0, default=False, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        os.environ[TRUST_ENV] = "1"
        setattr(namespace, self.dest, True)


def registered_model_classes() -> set[str]:
    """The bundled models and every target (and variant target) of the bundled keymaps."""
    from migrate.keymap import bundled_targets

    return set(CONFIG_CLASSES) | bundled_targets()


def check_model_class(target) -> str:
    """`target` if it may be imported; MigrateError in one line otherwise."""
    from migrate.keymap_schema import MODEL_CLASS

    if not isinstance(target, str) or not MODEL_CLASS.fullmatch(target):
        raise MigrateError(f"model class must be 'module:Class', got {quote(target)}")
    if target in CONFIG_CLASSES or target in _allowed or trusting() or target in registered_model_classes():
        return target
    raise MigrateError(
        f"refusing to import model class {quote(target)}: not one of migrate's models "
        f"({', '.join(sorted(registered_model_classes()))}); if it is your own and you trust the folder or keymap "
        f"naming it, set {TRUST_ENV}=1 (or pass --trust-model-class)"
    )


def model_class(target: str):
    check_model_class(target)
    module_name, _, class_name = target.partition(":")
    try:
        return getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as exc:
        raise MigrateError(f"cannot import model class {target}: {clip(exc)}") from None


def build_model(config: LlamaConfig, target: str | None = None):
    target = target or config.extra.get(MODEL_CLASS_FIELD)
    if not target:
        raise MigrateError(f"model config names no {MODEL_CLASS_FIELD}")
    return model_class(target)(config)


def parameter_shapes(model) -> dict[str, tuple[int, ...]]:
    return {p.name: tuple(p.shape) for p in model.get_parameters()}
