"""`migrate export`: MindSpore checkpoint folder -> HF folder, inverting the
same keymap that `convert` used (its variant and target, as model.yaml records
them). Weights go to `model.safetensors` with the HF names; fused tensors are
split back through the inverse of their layout, bit for bit; config.json is
rebuilt from model.yaml through transformers.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from migrate import __version__
from migrate.checkpoints.atomic import atomic_output_dir
from migrate.checkpoints.ms_reader import open_ms_checkpoint
from migrate.checkpoints.ms_safetensors import SafetensorsWriter
from migrate.checkpoints.output_guard import check_output
from migrate.checkpoints.training_state import split_training_state
from migrate.errors import CoverageError, MigrateError
from migrate.hf_config import write_hf_config
from migrate.keymap import MODEL_CLASS_FIELD, TARGET_FIELD, recorded_keymap, resolve
from migrate.models.conversion_plan import ConversionPlan
from migrate.models.registry import load_model_config
from migrate.sidecar import copy_sidecars

HF_WEIGHTS = "model.safetensors"


@dataclass
class ExportResult:
    out_dir: Path
    tensors: int
    parameters: int
    seconds: float
    skipped: list[str] = field(default_factory=list)  # MindFormers' optimizer and training state


def export(ms_dir: str | Path, out_dir: str | Path, keymap: str | None = None, overwrite: bool = False,
           on_tensor=None, checkpoint: str | Path | None = None, trust: bool = False) -> ExportResult:
    """`checkpoint`: another checkpoint file of the same model (one MindFormers trained) to export
    instead of the folder's own; its optimizer and training state are skipped. `trust`: import the
    folder's model class even if migrate does not bundle it (`--trust-model-class`)."""
    started = time.perf_counter()
    ms_dir, out = Path(ms_dir), Path(out_dir)
    if not ms_dir.is_dir():
        raise MigrateError(f"MindSpore model folder not found: {ms_dir}")
    if (ms_dir / "lora.json").is_file() and (ms_dir / "adapter.ckpt").is_file():
        # A LoRA run's checkpoint holds adapters only: their export is PEFT's format, or a merge.
        raise MigrateError(f"{ms_dir} holds a LoRA adapter, not a model: `migrate lora export {ms_dir} OUT` "
                           f"writes it as a PEFT folder; `migrate lora merge {ms_dir} OUT` then `migrate export` "
                           f"gives HF weights")
    # Fail before any heavy work; checked again, with every file read, when the output is created.
    keymap_file = keymap if str(keymap).endswith((".yaml", ".yml")) else None
    check_output(out, overwrite=overwrite, source=ms_dir, inputs=(keymap_file, checkpoint))
    config = load_model_config(ms_dir, trust)
    ms_fields = config.to_dict()
    plan = ConversionPlan(resolve(keymap or recorded_keymap(ms_dir)).for_model(ms_fields), config, trust)
    km = plan.keymap
    ckpt = open_ms_checkpoint(checkpoint or ms_dir)
    # A checkpoint MindFormers trained also holds adam_m.*, adam_v.*, global_step, ...: not weights.
    model_names, skipped = split_training_state(ckpt.specs)
    model_specs = {name: ckpt.specs[name] for name in model_names}

    groups, renamed = plan.groups, plan.checkpoint_names
    member = {}  # checkpoint name -> (group index, position among the group's targets)
    for i, group in enumerate(groups):
        for k, dst in enumerate(group.dst):
            member[renamed.get(dst, dst)] = (i, k)
    missing = [f"{name} (-> {', '.join(groups[i].src)})" for name, (i, _) in member.items()
               if name not in ckpt.specs]
    unexpected = [name for name in model_specs if name not in member]
    if missing or unexpected:
        raise CoverageError(missing, unexpected)
    _check_shapes(ckpt, plan)

    specs = _hf_specs(model_specs, groups, member, ms_fields)
    hf_fields = km.ms_to_hf_config({k: v for k, v in ms_fields.items() if k not in (MODEL_CLASS_FIELD, TARGET_FIELD)})
    hf_fields["dtype"] = config.compute_dtype
    count = params = 0
    inputs = (km.path, *ckpt.files)
    with atomic_output_dir(out, overwrite=overwrite, command="export", source=ms_dir, inputs=inputs) as tmp:
        metadata = {"format": "pt", "producer": f"migrate {__version__}"}
        with SafetensorsWriter(tmp / HF_WEIGHTS, specs, metadata=metadata) as writer:
            pending: dict[int, dict[int, np.ndarray]] = {}  # parts of fused groups read so far
            for name, raw, read in ckpt.entries():
                if name not in member:  # training state, counted in `skipped`
                    continue
                i, k = member[name]
                group = groups[i]
                if group.layout is None and len(group.dst) == 1:  # the same bytes under the HF name
                    values = [(group.src[0], _copied(writer, group.src[0], *model_specs[name], raw, read))]
                else:
                    parts = pending.setdefault(i, {})
                    parts[k] = read()
                    if len(parts) < len(group.dst):
                        continue
                    del pending[i]
                    values = []
                    for hf_name, value in zip(group.src, _unfuse(group, parts, ms_fields), strict=True):
                        writer.write(hf_name, value)
                        values.append((hf_name, value.size))
                for hf_name, size in values:
                    count += 1
                    params += int(size)
                    if on_tensor:
                        on_tensor(hf_name, count, len(specs))
        write_hf_config(tmp, hf_fields)
        copy_sidecars(ms_dir, tmp)
    return ExportResult(out, count, params, time.perf_counter() - started, skipped)


def _check_shapes(ckpt, plan: ConversionPlan) -> None:
    """Every checkpoint tensor against the shape model.yaml implies, before anything is
    written: a model.ckpt from another model must not become an HF folder whose
    config.json says one width while its weights have another."""
    renamed = plan.checkpoint_names
    wrong = []
    for name, shape in plan.expected.items():
        spec = ckpt.specs.get(renamed.get(name, name))
        if spec is not None and tuple(spec[1]) != tuple(shape):
            wrong.append(f"{renamed.get(name, name)} {list(spec[1])} vs {list(shape)}")
    if wrong:
        more = f" and {len(wrong) - 3} more" if len(wrong) > 3 else ""
        raise MigrateError(f"checkpoint does not match its model.yaml: {'; '.join(wrong[:3])}{more} "
                           "(checkpoint shape vs the shape model.yaml implies)")


def _hf_specs(model_specs, groups, member, fields) -> list[tuple]:
    """(HF name, dtype, shape) in the order export writes them: a group's sources
    once the last of its targets has been read."""
    seen: dict[int, list[tuple]] = {}
    specs = []
    for name, (dtype, shape) in model_specs.items():
        i, k = member[name]
        parts = seen.setdefault(i, [None] * len(groups[i].dst))
        parts[k] = (dtype, tuple(shape))
        if any(p is None for p in parts):
            continue
        group = groups[i]
        if group.layout is None:
            specs.append((group.src[0], dtype, tuple(shape)))
            continue
        if len({np.dtype(d) for d, _ in parts}) > 1:
            raise MigrateError(f"cannot split {', '.join(group.dst)}: their dtypes differ")
        shapes = group.transform().in_shapes([s for _, s in parts], fields)
        specs += [(src, parts[0][0], s) for src, s in zip(group.src, shapes, strict=True)]
    return specs


def _copied(writer, hf_name: str, dtype, shape, raw, read) -> int:
    """One tensor's bytes into its slot, file to file where they lie as one range (`cp`'s copy: a
    2 GiB export read every tensor into fresh memory first, 6.4x cp), else through an array; its
    element count."""
    stream = writer.open_tensor(hf_name, dtype, shape)
    if raw is None or not stream.copy_from(*raw):
        stream.write(np.ascontiguousarray(read()).reshape(-1).view(np.uint8))
    stream.close()
    return math.prod(shape)


def _unfuse(group, parts: dict[int, np.ndarray], fields) -> list[np.ndarray]:
    arrays = [parts[k] for k in range(len(group.dst))]
    if group.layout is None:
        return arrays
    dtype = arrays[0].dtype
    raw = [np.ascontiguousarray(a).view(f"<u{dtype.itemsize}") for a in arrays]  # layouts move bytes only
    return [a.view(dtype) for a in group.transform().inverse(raw, fields)]
