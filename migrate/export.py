"""`migrate export`: MindSpore checkpoint folder -> HF folder, inverting the
same keymap that `convert` used. Weights go to `model.safetensors` with the
HF names; config.json is rebuilt from model.yaml through transformers.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from migrate import __version__
from migrate.checkpoints.atomic import atomic_output_dir
from migrate.checkpoints.ms_reader import open_ms_checkpoint
from migrate.checkpoints.ms_safetensors import SafetensorsWriter
from migrate.errors import CoverageError, MigrateError
from migrate.hf_config import write_hf_config
from migrate.keymap import recorded_keymap, resolve
from migrate.models.config import LlamaConfig
from migrate.models.registry import MODEL_CLASS_FIELD
from migrate.sidecar import copy_sidecars

HF_WEIGHTS = "model.safetensors"


@dataclass
class ExportResult:
    out_dir: Path
    tensors: int
    parameters: int
    seconds: float


def export(ms_dir: str | Path, out_dir: str | Path, keymap: str | None = None, overwrite: bool = False,
           on_tensor=None) -> ExportResult:
    started = time.perf_counter()
    ms_dir, out = Path(ms_dir), Path(out_dir)
    if not ms_dir.is_dir():
        raise MigrateError(f"MindSpore model folder not found: {ms_dir}")
    if out.exists() and not overwrite:
        raise MigrateError(f"output {out} already exists (pass --overwrite to replace it)")
    km = resolve(keymap or recorded_keymap(ms_dir))
    config = LlamaConfig.load(ms_dir / "model.yaml")
    ms_fields = config.to_dict()
    ckpt = open_ms_checkpoint(ms_dir)

    pairs, _tied = km.pairs(ms_fields)
    to_hf = {p.dst: p.src for p in pairs}
    missing = [f"{p.dst} (-> {p.src})" for p in pairs if p.dst not in ckpt.specs]
    unexpected = [name for name in ckpt.specs if name not in to_hf]
    if missing or unexpected:
        raise CoverageError(missing, unexpected)

    hf_fields = km.ms_to_hf_config({k: v for k, v in ms_fields.items() if k != MODEL_CLASS_FIELD})
    hf_fields["dtype"] = config.compute_dtype
    specs = [(to_hf[name], dtype, shape) for name, (dtype, shape) in ckpt.specs.items()]
    count = params = 0
    with atomic_output_dir(out, overwrite=overwrite) as tmp:
        metadata = {"format": "pt", "producer": f"migrate {__version__}"}
        with SafetensorsWriter(tmp / HF_WEIGHTS, specs, metadata=metadata) as writer:
            for i, (name, array) in enumerate(ckpt.tensors()):
                writer.write(to_hf[name], array)
                count += 1
                params += int(array.size)
                if on_tensor:
                    on_tensor(to_hf[name], i + 1, len(specs))
        write_hf_config(tmp, hf_fields)
        copy_sidecars(ms_dir, tmp)
    return ExportResult(out, count, params, time.perf_counter() - started)
