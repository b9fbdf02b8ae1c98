"""The bundled model families, declared once, and the one way a model class is built.

`FAMILIES` holds one `Family` per bundled model class (model.yaml `model_class`, a
keymap's `target`): its config class, parameter shapes and count, what it can run,
its per-layer anatomy (the memory planner, the trainer's MFU) and whether
`migrate train` trains it. convert, export, `keymap check`, the planner and the
trainer read it here; nothing else lists the bundled models. Adding one is one
entry below, plus its model file, config class and keymap.

This module imports no MindSpore: a model's module (which does) is imported only
when a model is built (`build_model`), so `convert` and `export` never load it.

A target string comes from files a user may have been handed (a converted folder's
model.yaml `model_class`, a keymap's `target`), and importing a module runs its code
(`os:system`, `this:s`). So only registered classes are imported: the bundled models
and the targets of the bundled keymaps. Any other class needs the user's explicit
opt-in, passed as an argument: ``trust=True`` on every public function that reads a
folder's or keymap's class (`load_model_config`, `ConversionPlan`, `convert`, `export`,
`train`, ...), or `allow_model_class(target)` from Python for one class. Nothing here
reads or writes the environment: only entry points read MIGRATE_TRUST_MODEL_CLASS
(`trust_from_env`): the `migrate` command (its `--trust-model-class`, or the variable set
to 1), and msrun's workers, whose launcher sets it in the environment it hands them.
"""
from __future__ import annotations

import importlib
import math
import warnings
from collections.abc import Callable, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from migrate.errors import MigrateError
from migrate.keymap import MODEL_CLASS_FIELD, bundled_targets
from migrate.keymap_schema import MODEL_CLASS
from migrate.models.anatomy import Anatomy, llama_anatomy
from migrate.models.bert_config import BertConfig
from migrate.models.config import ConfigIO, LlamaConfig
from migrate.models.gpt2_config import GPT2Config
from migrate.models.shapes import Shapes, bert_mlm_shapes, bert_shapes, gpt2_shapes, llama_shapes
from migrate.models.support import COMMON_ACTIVATIONS, LLAMA_ACTIVATIONS, check_activation, check_llama_rope
from migrate.safeyaml import clip, load_yaml, quote


@dataclass(frozen=True)
class Family:
    """One bundled model class. A new one: its model file (the MindSpore `module:Class`), its
    config class (MindSpore-free), its shape function (`models/shapes.py`, held to the built
    model by tests/test_shapes.py), its keymap (`target:` this class), and an entry below."""

    model_class: str                              # `module:Class`; the module is imported only to build
    config_class: type[ConfigIO]                  # model.yaml's dataclass, MindSpore-free
    shapes: Callable[[Any], Shapes]               # parameter names and shapes from the config, in model order
    activations: tuple[str, ...]                  # hidden_act values the model computes as HF does
    check: Callable[[Any], None] | None = None    # further settings it must be able to run (RoPE)
    anatomy: Callable[[Any], Anatomy] | None = None  # per-layer parameter roles: planner, MFU
    trains: bool = False                          # `migrate train` trains it

    def check_runnable(self, config) -> None:
        """MigrateError naming the field and value of `config` this model cannot run."""
        if hasattr(config, "hidden_act"):
            check_activation(config.hidden_act, self.activations)
        if self.check is not None:
            self.check(config)

    def parameter_count(self, config) -> int:
        return sum(math.prod(shape) for shape in self.shapes(config).values())

    def anatomy_of(self, config) -> Anatomy:
        if self.anatomy is None:
            raise MigrateError(f"{self.model_class} declares no layer anatomy (the memory planner and MFU "
                               f"know {', '.join(f.model_class for f in FAMILIES.values() if f.anatomy)})")
        return self.anatomy(config)

    def flops_per_token(self, config, seq_length: int) -> int:
        """PaLM's estimate (`Anatomy.flops_per_token`)."""
        return self.anatomy_of(config).flops_per_token(seq_length)


LLAMA = "migrate.models.llama:LlamaForCausalLM"
FAMILIES: dict[str, Family] = {family.model_class: family for family in (
    Family(LLAMA, LlamaConfig, llama_shapes, LLAMA_ACTIVATIONS, check=check_llama_rope, anatomy=llama_anatomy,
           trains=True),
    Family("migrate.models.gpt2:GPT2LMHeadModel", GPT2Config, gpt2_shapes, COMMON_ACTIVATIONS),
    Family("migrate.models.bert:BertModel", BertConfig, bert_shapes, COMMON_ACTIVATIONS),
    Family("migrate.models.bert:BertForMaskedLM", BertConfig, bert_mlm_shapes, COMMON_ACTIVATIONS),
)}
# What a model.yaml naming no `model_class` holds (folders written before it was recorded).
DEFAULT_MODEL_CLASS = LLAMA


def family_of(config) -> Family:
    """The bundled family of `config`: the one its model_class names, else the one
    family of its config class (a LlamaConfig built in Python names no class)."""
    target = getattr(config, "extra", {}).get(MODEL_CLASS_FIELD)
    if target in FAMILIES:
        return FAMILIES[target]
    matches = [f for f in FAMILIES.values() if type(config) is f.config_class]
    if target is None and len(matches) == 1:
        return matches[0]
    raise MigrateError(f"{quote(target or type(config).__name__)} is not one of migrate's bundled models "
                       f"({', '.join(FAMILIES)})")


# ---------- configs ----------
def config_class(target: str | None, trust: bool = False):
    """The config class of model class `target` (`module:Class`): a bundled model's
    without importing MindSpore; a user's model's `config_class` attribute, else LlamaConfig."""
    if not target:
        return FAMILIES[DEFAULT_MODEL_CLASS].config_class
    family = FAMILIES.get(target) if isinstance(target, str) else None
    if family is not None:
        return family.config_class
    # A class of the user's: imported only where `check_model_class` allows it.
    return getattr(model_class(target, trust), "config_class", LlamaConfig)


def load_model_config(path: str | Path, trust: bool = False):
    """model.yaml -> the config object of the model class it names (`model_class`)."""
    path = Path(path)
    if path.is_dir():
        path = path / "model.yaml"
    target = None
    if path.is_file():
        data = load_yaml(path, "model config")
        target = data.get(MODEL_CLASS_FIELD) if isinstance(data, dict) else None
    return config_class(target, trust).load(path)


# ---------- shapes ----------
def expected_shapes(config, target: str, trust: bool = False) -> Shapes:
    """Names and shapes of model `target` (`module:Class`) built from `config`, in the
    model's own parameter order; MigrateError for a config the bundled model cannot run."""
    family = FAMILIES.get(target)
    if family is None:  # a user's model: MindSpore builds it, without parameter data
        with lazy_parameters():
            return parameter_shapes(build_model(config, target, trust))
    family.check_runnable(config)
    return family.shapes(config)


def parameter_shapes(model) -> dict[str, tuple[int, ...]]:
    return {p.name: tuple(p.shape) for p in model.get_parameters()}


# ---------- which classes may be imported ----------
TRUST_ENV = "MIGRATE_TRUST_MODEL_CLASS"  # the opt-in as an entry point reads it (`trust_from_env`)
_allowed: set[str] = set()         # classes a Python caller allowed explicitly


def allow_model_class(target: str) -> None:
    """Let `target` be imported in this process: a caller that names its own class."""
    _allowed.add(target)


def trust_from_env(environ: Mapping[str, str]) -> bool:
    """The opt-in MIGRATE_TRUST_MODEL_CLASS gives in `environ` (1, true, yes; unset, 0, false, no:
    none). For entry points only (`migrate.cli.main`, msrun's worker, the golden script): each
    reads it once and passes ``trust=`` down; nothing below them looks at the environment."""
    return environ.get(TRUST_ENV, "").strip().lower() not in ("", "0", "false", "no")


def registered_model_classes() -> set[str]:
    """The bundled models and every target (and variant target) of the bundled keymaps."""
    return set(FAMILIES) | bundled_targets()


def check_model_class(target, trust: bool = False) -> str:
    """`target` if it may be imported: a registered class, one `allow_model_class` allowed, or any
    with ``trust`` (the caller's explicit opt-in; the environment is not read); MigrateError in
    one line otherwise."""
    if not isinstance(target, str) or not MODEL_CLASS.fullmatch(target):
        raise MigrateError(f"model class must be 'module:Class', got {quote(target)}")
    if target in FAMILIES or target in _allowed or trust or target in registered_model_classes():
        return target
    raise MigrateError(
        f"refusing to import model class {quote(target)}: not one of migrate's models "
        f"({', '.join(sorted(registered_model_classes()))}); if it is your own and you trust the folder or keymap "
        f"naming it, pass --trust-model-class (or {TRUST_ENV}=1 to the migrate command; trust=True from Python)"
    )


# ---------- building ----------
def model_class(target: str, trust: bool = False):
    check_model_class(target, trust)
    module_name, _, class_name = target.partition(":")
    try:
        # The model's module imports MindSpore: only here, when a model is built.
        return getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as exc:
        raise MigrateError(f"cannot import model class {target}: {clip(exc)}") from None


def build_model(config, target: str | None = None, trust: bool = False):
    target = target or config.extra.get(MODEL_CLASS_FIELD)
    if not target:
        raise MigrateError(f"model config names no {MODEL_CLASS_FIELD}")
    return model_class(target, trust)(config)


@contextmanager
def lazy_parameters():
    """Parameters created inside keep their initializer and allocate nothing until
    set or first used: `mindspore.nn.utils.no_init_parameters` (deprecated in 2.10
    but present), or, where it is gone, the class flag it sets."""
    import mindspore as ms  # only where a model is built: convert and export never get here

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from mindspore.nn.utils import no_init_parameters
    except ImportError:
        no_init_parameters = None
    if no_init_parameters is not None:
        with no_init_parameters():
            yield
        return
    previous = getattr(ms.Parameter, "init_param", True)
    ms.Parameter.init_param = False
    try:
        yield
    finally:
        ms.Parameter.init_param = previous
