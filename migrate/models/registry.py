"""Build a bundled MindSpore model from a `module:Class` target and its config."""
from __future__ import annotations

import importlib

from migrate.errors import MigrateError
from migrate.models.config import LlamaConfig

MODEL_CLASS_FIELD = "model_class"  # model.yaml field naming the bundled class


def model_class(target: str):
    module_name, _, class_name = target.partition(":")
    try:
        return getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as exc:
        raise MigrateError(f"cannot import model class {target}: {exc}") from None


def build_model(config: LlamaConfig, target: str | None = None):
    target = target or config.extra.get(MODEL_CLASS_FIELD)
    if not target:
        raise MigrateError(f"model config names no {MODEL_CLASS_FIELD}")
    return model_class(target)(config)


def parameter_shapes(model) -> dict[str, tuple[int, ...]]:
    return {p.name: tuple(p.shape) for p in model.get_parameters()}
