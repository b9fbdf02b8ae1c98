"""An unfused folder loaded in MindFormers' fused layout, for generation (`migrate generate --fused`).

q, k, v as one matmul (`attention.w_qkv`) and gate, up as one (`feed_forward.w_gate_hidden`) cut a
Llama layer's matmuls from 7 to 4, the layout MindFormers runs for speed. On this CPU it did not pay
(SmolLM2-135M, quiet: 0.95x at batch 1, 0.84x at batch 8 in one process; docs/generate.md), so it is
opt-in.

The fusion is the keymap's own `qkv_concat` target, the rows `convert --qkv-concat` writes: each
tensor of the checkpoint goes back to its HF name through the folder's plan, and the fused plan's
rows (`qkv_groups`, `interleave_rows`) make the model's parameters as soon as their sources have
streamed in, so the peak stays the model plus one layer's tensors. Where the folder cannot be fused
(no such target, a folder converted to a target already, a model without the field)
`fused_layout.fused_plans` says None and the caller loads the folder as it is.
"""
from __future__ import annotations

from pathlib import Path

import mindspore as ms

from migrate.checkpoints.ms_reader import open_ms_checkpoint
from migrate.errors import MigrateError
from migrate.models.fused_layout import fused_plans
from migrate.models.loading import build_lazy_model
from migrate.models.registry import load_model_config


def load_fused_model(ms_dir: str | Path, compute_dtype: str | None = None, *, trust: bool = False):
    """(model, config) in the fused layout, every parameter made once from the folder's tensors; None
    where `fused_plans` is None. A checkpoint that does not fit is a `MigrateError`, as `load_model`'s."""
    ms_dir = Path(ms_dir)
    config = load_model_config(ms_dir / "model.yaml", trust)
    if compute_dtype:
        config.compute_dtype = compute_dtype
    plans = fused_plans(ms_dir, config, trust)
    if plans is None:
        return None
    own, fused = plans
    hf_name = {group.dst[0]: group.src[0] for group in own.groups if group.layout is None}  # renames: one each
    waiting = {src: group for group in fused.groups for src in group.src}  # HF name -> the row it goes into
    model = build_lazy_model(fused.config, trust)
    params = {p.name: p for p in model.get_parameters()}
    made: set[str] = set()
    pieces: dict[str, object] = {}
    for name, array in open_ms_checkpoint(ms_dir).tensors():
        source = hf_name.get(name)
        group = waiting.get(source)
        if group is None:
            raise MigrateError(f"checkpoint does not fit the fused model: {name} has no place in it")
        pieces[source] = array
        if not all(s in pieces for s in group.src):
            continue
        arrays = [pieces.pop(s) for s in group.src]
        if group.layout is not None:
            arrays = group.transform().forward(arrays, fused.fields)
        for dst, value in zip(group.dst, arrays, strict=True):
            if dst not in params or tuple(value.shape) != tuple(params[dst].shape):
                raise MigrateError(f"checkpoint does not fit the fused model: {dst} {list(value.shape)}")
            params[dst].set_data(ms.Tensor(value))  # set_data casts to the parameter's dtype
            made.add(dst)
    missing = [name for name in params if name not in made]
    if missing or pieces:
        raise MigrateError(f"checkpoint does not fit the fused model: {len(missing)} parameters not made "
                           f"({', '.join(missing[:5])}), {len(pieces)} tensors left over "
                           f"({', '.join(list(pieces)[:5])})")
    model.set_train(False)
    return model, fused.config
