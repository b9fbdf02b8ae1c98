"""Load a converted (or trained) MindSpore model folder into the bundled model.

`load_model` builds the model without allocating its parameters
(`lazy_parameters`), then streams the checkpoint into them one tensor at a
time: peak memory is the model plus one tensor, where `mindspore.load_checkpoint`
+ `load_param_into_net` holds the whole checkpoint beside the whole model.
Sharded checkpoints (see `migrate.checkpoints.sharding`) load the same way.
"""
from __future__ import annotations

from pathlib import Path

import mindspore as ms

from migrate.checkpoints.ms_reader import checkpoint_files, open_ms_checkpoint
from migrate.errors import MigrateError
from migrate.keymap import TARGET_FIELD, recorded_keymap, resolve
from migrate.models.conversion_plan import ConversionPlan
from migrate.models.registry import build_model, lazy_parameters, load_model_config


def build_lazy_model(config, trust: bool = False):
    """The model with shapes and dtypes but no parameter data (`trust`: `registry.check_model_class`)."""
    with lazy_parameters():
        return build_model(config, trust=trust)


def load_checkpoint_dict(path: str | Path) -> dict:
    """`mindspore.load_checkpoint` of a .ckpt or .safetensors file, or of every shard
    of a sharded checkpoint, merged into one dict (the whole checkpoint in memory)."""
    fmt, files = checkpoint_files(path)
    merged: dict = {}
    for file in files:
        try:
            part = ms.load_checkpoint(str(file), format=fmt)
        except Exception as exc:
            raise MigrateError(f"mindspore cannot load {file}: {str(exc).strip().splitlines()[0]}") from None
        twice = [name for name in part if name in merged]
        if twice:
            raise MigrateError(f"tensor {twice[0]} appears in more than one shard ({file.name})")
        merged.update(part)
    return merged


def checkpoint_to_model_names(ms_dir: Path, config, trust: bool = False) -> dict[str, str]:
    """Checkpoint name -> model parameter name, for a folder converted to a keymap
    target that renames (model.yaml `keymap_target`, e.g. mcore); empty otherwise."""
    fields = config.to_dict()
    if not fields.get(TARGET_FIELD):
        return {}
    plan = ConversionPlan(resolve(recorded_keymap(ms_dir)).for_model(fields), config, trust)
    return {ckpt_name: model_name for model_name, ckpt_name in plan.checkpoint_names.items()}


def load_model(ms_dir: str | Path, compute_dtype: str | None = None, plan: ConversionPlan | None = None, *,
               trust: bool = False):
    """(model, config) with every parameter loaded: none missing, none unexpected. The
    model class and its config class are the ones model.yaml names (`model_class`).
    plan: the folder's conversion plan when the caller has resolved it (the trainer): its
    config is the one built and returned, its checkpoint names pair the tensors, its `trust`
    is the one used. trust: import a model class migrate does not bundle (`--trust-model-class`)."""
    ms_dir = Path(ms_dir)
    if plan is not None:
        trust = plan.trust
    config = plan.config if plan is not None else load_model_config(ms_dir / "model.yaml", trust)
    if compute_dtype:
        config.compute_dtype = compute_dtype
    ckpt = open_ms_checkpoint(ms_dir)  # headers only: check the fit before reading any data
    if plan is None:
        to_model = checkpoint_to_model_names(ms_dir, config, trust)
    else:
        to_model = {ckpt_name: model_name for model_name, ckpt_name in plan.checkpoint_names.items()
                    if ckpt_name != model_name}
    specs = {to_model.get(name, name): spec for name, spec in ckpt.specs.items()}  # by model name
    model = build_lazy_model(config, trust)
    params = {p.name: p for p in model.get_parameters()}
    not_loaded = [name for name in params if name not in specs]
    unused = [name for name in specs if name not in params]
    if not_loaded or unused:
        raise MigrateError(
            f"checkpoint does not fit the model: {len(not_loaded)} parameters not loaded "
            f"({', '.join(not_loaded[:5])}), {len(unused)} checkpoint entries unused ({', '.join(unused[:5])})"
        )
    misshaped = [f"{name} {list(shape)} vs model {list(params[name].shape)}"
                 for name, (_, shape) in specs.items() if tuple(shape) != tuple(params[name].shape)]
    if misshaped:
        raise MigrateError(f"checkpoint does not fit the model: shapes differ: {'; '.join(misshaped[:5])}")
    for name, array in ckpt.tensors():
        name = to_model.get(name, name)
        # set_data casts to the parameter's dtype (e.g. a bf16 checkpoint into an fp32 model).
        params[name].set_data(ms.Tensor(array))
    model.set_train(False)
    return model, config
