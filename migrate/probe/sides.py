"""The live sides `migrate dump` and `migrate diff` run, from what the user names:

- an HF folder (config.json, no model.yaml): transformers' class for its `architectures`,
  eager attention, dropout off; block table from the family's keymap `align` section;
- a converted folder (model.yaml): the bundled MindSpore model; block table from the model
  class's `HIDDEN` names (the cells `output_hidden_states` reads);
- ``module:factory`` or ``path/to/file.py:factory``: the user's own code; ``factory()``
  returns a `torch.nn.Module` or a MindSpore `nn.Cell`. Called as ``model(ids)``, with
  ``attention_mask=`` / ``labels=`` when its forward takes them. No block table: pairing
  is automatic or from a mapping file.
"""
from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from migrate.dtype_names import PRECISIONS
from migrate.errors import MigrateError
from migrate.hf_config import dtype_kwargs, read_raw_config
from migrate.hf_loading import from_pretrained
from migrate.keymap import resolve
from migrate.probe.dump_format import MANIFEST, Dump, is_dump
from migrate.safeyaml import clip

_COLLISION = "is already used by a Transformers"


@dataclass
class Side:
    label: str                      # "HF PyTorch", "MindSpore", "PyTorch (my_model:make)"
    kind: str                       # hf | converted | user
    source: str
    framework: str                  # torch | mindspore
    model: Any
    align: dict | None = None       # block -> module template, when known
    vocab_size: int | None = None
    pad_id: int = 0
    extra: dict = field(default_factory=dict)


def side_kind(spec: str) -> str:
    """hf, converted, dump or user; a missing path is one line."""
    path = Path(spec)
    if path.is_dir():
        if is_dump(path):
            return "dump"
        if (path / "model.yaml").is_file():
            return "converted"
        if (path / "config.json").is_file():
            return "hf"
        if (path / MANIFEST).is_file():
            Dump(path)  # a dump whose manifest cannot be read: the reader says why, in one line
        raise MigrateError(f"{spec}: neither an HF folder (config.json), a converted folder (model.yaml) "
                           "nor a dump (manifest.json)")
    if ":" in spec and not path.exists():
        return "user"
    raise MigrateError(f"model folder not found: {spec} (expected an HF folder, a converted folder, a dump or "
                       "module:factory)")


def open_side(spec: str, dtype: str, seed: int, keymap: str | None = None, trust: bool = False) -> Side:
    """`trust`: a converted folder's model class may be imported even if migrate does not bundle it
    (`--trust-model-class`); `module:factory` is code the caller named, imported as named."""
    kind = side_kind(spec)
    if kind == "hf":
        return _hf_side(Path(spec), dtype, seed, keymap)
    if kind == "converted":
        return _converted_side(Path(spec), dtype, seed, trust)
    if kind == "user":
        return _user_side(spec, seed)
    raise MigrateError(f"{spec} is a dump, not a model")


def hf_model_class(folder: Path):
    """The transformers class config.json's `architectures` names; a causal LM when it names none."""
    import transformers

    for arch in read_raw_config(folder).get("architectures") or []:
        cls = getattr(transformers, arch, None)
        if isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel):
            return cls
    return transformers.AutoModelForCausalLM


def load_hf_model(folder: Path, dtype: str, seed: int):
    """HF's own model of `folder` in `dtype`, dropout off. Eager attention: softmax in fp32 and an
    explicit additive mask, the formulation the bundled models reproduce."""
    import torch

    torch.manual_seed(seed)
    compute = getattr(torch, PRECISIONS[dtype].compute)  # "bf16" -> torch.bfloat16
    model = from_pretrained(hf_model_class(folder), folder, **dtype_kwargs(compute), attn_implementation="eager")
    model.eval()
    return model


def _hf_side(folder: Path, dtype: str, seed: int, keymap: str | None) -> Side:
    config = read_raw_config(folder)
    model = load_hf_model(folder, dtype, seed)
    try:
        align = dict(resolve(keymap or "auto", config).align) or None
    except MigrateError:
        align = None  # an architecture without a keymap: automatic pairing
    return Side("HF PyTorch", "hf", str(folder), "torch", model, align, config.get("vocab_size"),
                config.get("pad_token_id") or 0)


def load_converted_model(folder: Path, dtype: str, seed: int, trust: bool = False):
    """(model, config) of a converted folder: the bundled MindSpore model model.yaml names, computing
    in `dtype`, dropout off. The mode is left alone: the hooks (`probe.hooks_ms`) scope PyNative to
    the recorded run. `trust`: `load_model`'s."""
    import mindspore as ms

    from migrate.models.loading import load_model

    ms.set_seed(seed)
    model, config = load_model(folder, compute_dtype=PRECISIONS[dtype].compute, trust=trust)
    model.set_train(False)
    return model, config


def _converted_side(folder: Path, dtype: str, seed: int, trust: bool = False) -> Side:
    model, config = load_converted_model(folder, dtype, seed, trust)
    return Side("MindSpore", "converted", str(folder), "mindspore", model, bundled_align(type(model)),
                config.vocab_size, config.pad_token_id or 0)


def bundled_align(model_class) -> dict | None:
    """The bundled model's block table, from the names its `HIDDEN` gives the hidden states."""
    hidden = getattr(model_class, "HIDDEN", None)
    if not hidden:
        return None
    embedding, layers, (attention, mlp), final = hidden
    table = {"embedding": embedding, "attention": f"{layers}.{{layer}}.{attention}",
             "mlp": f"{layers}.{{layer}}.{mlp}", "layer output": f"{layers}.{{layer}}"}
    return {**table, "final norm": final} if final else table


def _user_side(spec: str, seed: int) -> Side:
    target, _, factory_name = spec.rpartition(":")
    module = _import_user_module(target)
    factory = getattr(module, factory_name, None)
    if not callable(factory):
        raise MigrateError(f"{spec}: {target} has no callable {factory_name!r}")
    framework = None
    try:
        import random

        import numpy as np

        random.seed(seed)
        np.random.seed(seed)
        model = factory()
    except MigrateError:
        raise
    except Exception as exc:
        raise MigrateError(f"{spec}: the factory failed: {type(exc).__name__}: {clip(str(exc))}") from None
    roots = {cls.__module__.split(".")[0] for cls in type(model).__mro__}
    if "torch" in roots:
        framework = "torch"
        model.eval()
    elif "mindspore" in roots:
        framework = "mindspore"
        model.set_train(False)
    else:
        raise MigrateError(f"{spec} returned a {type(model).__name__}, neither a torch.nn.Module nor a "
                           "MindSpore nn.Cell")
    config = getattr(model, "config", None)
    vocab = getattr(config, "vocab_size", None)
    label = f"{'PyTorch' if framework == 'torch' else 'MindSpore'} ({spec})"
    return Side(label, "user", spec, framework, model, None, vocab, getattr(config, "pad_token_id", None) or 0)


def _import_user_module(target: str):
    """Import `target` (a module name or a .py path) once per process: a file imported a
    second time under another name would run its registrations twice."""
    try:
        if target.endswith(".py"):
            path = Path(target).resolve()
            if not path.is_file():
                raise MigrateError(f"{target} not found")
            name = "migrate_user_" + path.stem
            for mod in list(sys.modules.values()):
                if getattr(mod, "__file__", None) and Path(mod.__file__).resolve() == path:
                    return mod
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
            return module
        return importlib.import_module(target)
    except ValueError as exc:
        if _COLLISION not in str(exc):
            raise MigrateError(f"importing {target}: {clip(str(exc))}") from None
        raise MigrateError(
            f"importing {target}: transformers refused a registration ({clip(str(exc))}): a config's "
            "model_type must not be one transformers defines (e.g. 'llama'); give your config class a "
            "model_type of its own, or register with AutoConfig.register(..., exist_ok=True)") from None
    except ImportError as exc:
        raise MigrateError(f"cannot import {target}: {clip(str(exc))}") from None


def call_model(side: Side, inputs) -> Any:
    """One forward of `side` on `inputs` (no gradients)."""
    import numpy as np

    if side.framework == "torch":
        import torch

        ids = torch.from_numpy(inputs.ids)
        kwargs = _keywords(side.model.forward, inputs, torch.from_numpy)
        with torch.no_grad():
            return side.model(ids, **kwargs)
    import mindspore as ms

    from migrate.models.mode import execution_mode

    def tensor(a):
        return ms.Tensor(a.astype(np.int32))

    kwargs = _keywords(side.model.construct, inputs, tensor)
    with execution_mode("pynative"):  # as recorded: hooks run in PyNative
        return side.model(tensor(inputs.ids), **kwargs)


def _keywords(forward, inputs, tensor) -> dict:
    params = inspect.signature(forward).parameters
    kwargs = {}
    if "labels" in params:
        kwargs["labels"] = tensor(inputs.labels)
    if inputs.mask is not None:
        if "attention_mask" not in params:
            raise MigrateError("padded inputs need a model whose forward takes attention_mask")
        kwargs["attention_mask"] = tensor(inputs.mask)
    return kwargs
