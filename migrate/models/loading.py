"""Load a converted (or trained) MindSpore model folder into the bundled model."""
from __future__ import annotations

from pathlib import Path

import mindspore as ms

from migrate.checkpoints.ms_reader import find_checkpoint
from migrate.errors import MigrateError
from migrate.models.config import LlamaConfig
from migrate.models.registry import build_model


def load_checkpoint_dict(path: str | Path) -> dict:
    """`mindspore.load_checkpoint` of a .ckpt or .safetensors file."""
    path = find_checkpoint(path)
    fmt = "safetensors" if path.suffix == ".safetensors" else "ckpt"
    try:
        return ms.load_checkpoint(str(path), format=fmt)
    except Exception as exc:
        raise MigrateError(f"mindspore cannot load {path}: {str(exc).strip().splitlines()[0]}") from None


def load_model(ms_dir: str | Path, compute_dtype: str | None = None):
    """(model, config) with every parameter loaded: none missing, none unexpected."""
    ms_dir = Path(ms_dir)
    config = LlamaConfig.load(ms_dir / "model.yaml")
    if compute_dtype:
        config.compute_dtype = compute_dtype
    model = build_model(config)
    params = load_checkpoint_dict(ms_dir)
    expected = {p.name: p for p in model.get_parameters()}
    for name, value in params.items():
        if name in expected and value.dtype != expected[name].dtype:
            params[name] = ms.Parameter(value.astype(expected[name].dtype), name=name)
    not_loaded, unused = ms.load_param_into_net(model, params, strict_load=True)
    if not_loaded or unused:
        raise MigrateError(
            f"checkpoint does not fit the model: {len(not_loaded)} parameters not loaded "
            f"({', '.join(not_loaded[:5])}), {len(unused)} checkpoint entries unused ({', '.join(unused[:5])})"
        )
    model.set_train(False)
    return model, config
