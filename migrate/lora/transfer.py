"""Adapters between the ecosystems: `migrate lora export`, `import` and `merge`. Tensors go through
migrate's own readers and writers, so none of these loads MindSpore; `merge` forms each update
scaling·B·A with torch, the library PEFT's `merge_and_unload` computes it with (`peft_delta`).

    export_adapter(RUN/checkpoints/latest, OUT)       MindSpore adapter -> PEFT folder (adapter_config.json +
                                                      adapter_model.safetensors) that PeftModel.from_pretrained loads
    import_adapter(PEFT_DIR, MS_MODEL, OUT)           PEFT folder -> MindSpore adapter folder on the converted model
    merge_adapter(ADAPTER, OUT, ms_model=None)        base + scaling·B·A -> a converted folder (model.ckpt in the
                                                      base's names; `migrate export` writes it as HF)

An adapter goes only onto its base: every adapted module must be a linear layer of the base
with the adapter's shapes, and where the adapter carries the fingerprint of the base it was
trained on (`migrate.lora.targets.base_fingerprint`: every adapter migrate writes does), the
base must match it. Anything else is one MigrateError line and nothing written.
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from migrate import __version__
from migrate.checkpoints.atomic import atomic_output_dir
from migrate.checkpoints.input_folder import InputFolder
from migrate.checkpoints.integrity import verify_checkpoint
from migrate.checkpoints.ms_ckpt import CkptWriter, iter_ckpt
from migrate.checkpoints.ms_reader import open_ms_checkpoint
from migrate.checkpoints.sharding import DEFAULT_MAX_SHARD, ShardedWriter, parse_size, plan_shards
from migrate.errors import MigrateError
from migrate.jsonsafe import load_json
from migrate.keymap import recorded_keymap, resolve
from migrate.lora.peft_files import is_peft_adapter, read_peft_adapter, write_peft_adapter
from migrate.lora.record import ADAPTER_FILE, LORA_FILE, adapter_record, read_record, spec_of
from migrate.lora.spec import LoraSpec
from migrate.lora.targets import Site, base_fingerprint, hf_weights_of, linear_sites
from migrate.models.conversion_plan import ConversionPlan
from migrate.models.registry import load_model_config
from migrate.sidecar import copy_sidecars
from migrate.transforms import get_layout


@dataclass
class Adapter:
    """An adapter in HF terms, wherever it came from."""

    path: Path
    spec: LoraSpec
    weights: dict[str, tuple[np.ndarray, np.ndarray]]   # HF module -> (A (rank, in), B (out, rank)), fp32
    base_sha256: str | None
    base_ms_model: Path | None = None                   # the converted base a MindSpore adapter records


# ---------- reading ----------
def find_adapter_folder(path: str | Path) -> Path:
    """A folder with lora.json: the one given, or a LoRA run's latest checkpoint."""
    path = Path(path)
    for folder in (path, path / "latest", path / "checkpoints" / "latest"):
        if (folder / LORA_FILE).is_file():
            return folder.resolve()
    if (path / "trainer_state.json").is_file():
        raise MigrateError(f"{path} is a checkpoint of full training, not of a LoRA run (no {LORA_FILE})")
    raise MigrateError(f"no LoRA adapter at {path} (expected {LORA_FILE} + {ADAPTER_FILE}, a LoRA run's "
                       f"checkpoint, or a PEFT folder with adapter_config.json)")


def open_ms_adapter(path: str | Path) -> Adapter:
    folder = find_adapter_folder(path)
    verify_checkpoint(folder)  # a training checkpoint's manifest; a plain adapter folder passes
    record = read_record(folder)
    spec = spec_of(record, folder)
    if not os.path.lexists(folder / ADAPTER_FILE):
        raise MigrateError(f"{folder} has no {ADAPTER_FILE}")
    tensors = dict(iter_ckpt(InputFolder(folder, "adapter folder").member(ADAPTER_FILE, ADAPTER_FILE)))
    weights = {}
    for target in record["targets"]:
        try:
            module, (name_a, name_b) = target["hf_module"], target["ms"]
            weights[module] = (np.asarray(tensors.pop(name_a), np.float32), np.asarray(tensors.pop(name_b), np.float32))
        except (KeyError, TypeError, ValueError):
            raise MigrateError(f"{folder}: {ADAPTER_FILE} lacks the adapter lora.json names for "
                               f"{target.get('hf_module') if isinstance(target, dict) else target!r}") from None
    if tensors:
        raise MigrateError(f"{folder}: {ADAPTER_FILE} holds tensors lora.json does not name: "
                           f"{', '.join(list(tensors)[:3])}")
    for module, (a, b) in weights.items():  # the scale is alpha / rank: a rank the weights do not have
        if a.ndim != 2 or b.ndim != 2 or a.shape[0] != spec.rank or b.shape[1] != spec.rank:  # scaled it to 0
            raise MigrateError(f"{folder}: {module} A {list(a.shape)} / B {list(b.shape)} in {ADAPTER_FILE} are "
                               f"not of the rank {spec.rank} {LORA_FILE} states"[:300])
    base = record.get("base") or {}
    return Adapter(folder, spec, weights, base.get("sha256"), Path(base["ms_model"]) if base.get("ms_model") else None)


def open_adapter(path: str | Path) -> Adapter:
    """A PEFT folder or a MindSpore adapter (folder, LoRA checkpoint or run folder)."""
    if is_peft_adapter(path):
        peft = read_peft_adapter(path)
        return Adapter(Path(path), peft.spec, peft.weights, peft.base_sha256)
    return open_ms_adapter(path)


# ---------- the base ----------
def base_plan(ms_model: Path, trust: bool = False) -> ConversionPlan:
    """The converted base's plan; `trust`: its model class may be imported even if migrate does not
    bundle it (`--trust-model-class`)."""
    if not Path(ms_model).is_dir():
        raise MigrateError(f"base model folder not found: {ms_model}")
    config = load_model_config(Path(ms_model) / "model.yaml", trust)
    return ConversionPlan(resolve(recorded_keymap(ms_model)).for_model(config.to_dict()), config, trust)


def base_weights(ms_model: Path, plan: ConversionPlan, names: set[str]) -> dict[str, np.ndarray]:
    """The named model parameters of a converted folder (read through its checkpoint names)."""
    renamed = plan.checkpoint_names
    wanted = {renamed.get(n, n): n for n in names}
    out = {}
    for name, array in open_ms_checkpoint(ms_model).tensors():
        if name in wanted:
            out[wanted[name]] = array
    missing = sorted(set(names) - set(out))
    if missing:
        raise MigrateError(f"{ms_model} lacks {', '.join(missing[:3])}")
    return out


def fit_to_base(adapter: Adapter, ms_model: Path, plan: ConversionPlan) -> tuple[list[Site], str]:
    """The adapter's sites on this base, and the base's fingerprint; refuses another base model."""
    sites = linear_sites(plan)
    chosen = []
    for module, (a, b) in adapter.weights.items():
        site = sites.get(module)
        if site is None:
            raise MigrateError(f"{adapter.path} adapts {module}, which {ms_model} ({plan.keymap.name}, "
                               f"{plan.config.num_layers} layers) has no linear layer named: an adapter for another "
                               f"base model")
        ia, ob = a.shape[1], b.shape[0]
        if (ia, ob) != (site.in_features, site.out_features):
            raise MigrateError(f"{adapter.path} is an adapter for another base model: {module} takes {ia} -> {ob} "
                               f"features, {ms_model} has {site.in_features} -> {site.out_features}")
        chosen.append(site)
    arrays = base_weights(ms_model, plan, {s.cell_weight for s in chosen})
    fingerprint = base_fingerprint(hf_weights_of(chosen, arrays.__getitem__, plan.fields))
    if adapter.base_sha256 and adapter.base_sha256 != fingerprint:
        raise MigrateError(f"{adapter.path} was trained on another base model: base sha256 "
                           f"{adapter.base_sha256[:12]}…, {ms_model} is {fingerprint[:12]}…")
    return chosen, fingerprint


def _base_of(adapter: Adapter, ms_model) -> Path:
    base = Path(ms_model) if ms_model is not None else adapter.base_ms_model
    if base is None:
        raise MigrateError(f"{adapter.path} does not record its base model: pass --model MS_DIR")
    return base


# ---------- the three commands ----------
def export_adapter(src: str | Path, out: str | Path, ms_model=None, overwrite: bool = False, *,
                   trust: bool = False) -> Path:
    adapter = open_ms_adapter(src)
    base = _base_of(adapter, ms_model)
    plan = base_plan(base, trust)
    _, fingerprint = fit_to_base(adapter, base, plan)
    with atomic_output_dir(out, overwrite=overwrite, command="lora export", source=adapter.path,
                           inputs=(base,)) as tmp:
        # PEFT's base_model_name_or_path names an HF folder or hub id; the converted base knows neither.
        write_peft_adapter(tmp, adapter.spec, adapter.weights, fingerprint, None)
    return Path(out)


def import_adapter(peft_dir: str | Path, ms_model: str | Path, out: str | Path, overwrite: bool = False, *,
                   trust: bool = False) -> Path:
    adapter = open_adapter(peft_dir)
    ms_model = Path(ms_model).resolve()
    plan = base_plan(ms_model, trust)
    sites, fingerprint = fit_to_base(adapter, ms_model, plan)
    with atomic_output_dir(out, overwrite=overwrite, command="lora import", source=adapter.path,
                           inputs=(ms_model,)) as tmp:
        with CkptWriter(tmp / ADAPTER_FILE) as writer:
            for site in sites:
                a, b = adapter.weights[site.hf_module]
                writer.write(site.ms_names[0], a)
                writer.write(site.ms_names[1], b)
        record = adapter_record(adapter.spec, sites, plan.keymap.name, ms_model, fingerprint)
        (tmp / LORA_FILE).write_text(json.dumps(record, indent=1) + "\n")
    return Path(out)


def peft_delta(a: np.ndarray, b: np.ndarray, scaling: float) -> np.ndarray:
    """scaling · B·A exactly as PEFT's merge forms it: `LoraLayer.get_delta_weight` computes
    `(B @ A) * scaling` in torch on the adapters as `PeftModel.from_pretrained` loads them (fp32:
    `autocast_adapter_dtype=True` upcasts 16-bit adapter files), `scaling` a Python float. The same
    call gives the same rounding: numpy's matmul (OpenBLAS) sums the rank's products in another
    order than torch's (MKL) for some shapes (rank 32 on layers 40 wide: 1 fp32 ulp on ~15 % of the
    elements; none at hidden 32), so the delta is torch's own. fan_in_fan_out (PEFT's transpose)
    is refused on read."""
    import torch

    with torch.no_grad():
        ta = torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32))
        tb = torch.from_numpy(np.ascontiguousarray(b, dtype=np.float32))
        return ((tb @ ta) * float(scaling)).numpy()


def merged_deltas(adapter: Adapter, sites: list[Site], fields: dict) -> dict[str, np.ndarray]:
    """Model weight name -> scaling · B·A in the MindSpore layout (a fused weight: every part's
    delta, zeros for parts without an adapter, put in place by the fused layout)."""
    deltas, fused = {}, {}
    for site in sites:
        a, b = adapter.weights[site.hf_module]
        delta = peft_delta(a, b, adapter.spec.scaling)
        if site.fused:
            fused.setdefault(site.cell_weight, (site, {}))[1][site.part] = delta
        else:
            deltas[site.cell_weight] = delta
    for name, (site, parts) in fused.items():
        arrays = [parts.get(i, np.zeros(shape, np.float32)) for i, shape in enumerate(site.part_shapes)]
        (deltas[name],) = get_layout(site.layout).forward(arrays, fields)
    return deltas


def merge_adapter(adapter_path: str | Path, out: str | Path, ms_model=None, overwrite: bool = False, *,
                  trust: bool = False) -> Path:
    """A converted folder whose weights are the base's plus the adapter's update, bit for bit as PEFT's
    `merge_and_unload` (`weight.data += delta`): the delta from `peft_delta`, added in fp32 to the
    base weight and rounded once to its dtype (torch's in-place add of an fp32 tensor into a bf16 /
    fp16 one computes in fp32 and rounds to nearest even, as numpy's astype does). Tensors stream
    one at a time. trust (each of the
    three commands): the base's model class may be imported even if migrate does not bundle it."""
    adapter = open_adapter(adapter_path)
    base = _base_of(adapter, ms_model)
    plan = base_plan(base, trust)
    sites, _ = fit_to_base(adapter, base, plan)
    deltas = {plan.checkpoint_names.get(n, n): d for n, d in merged_deltas(adapter, sites, plan.fields).items()}
    ckpt = open_ms_checkpoint(base)
    sizes = [(name, int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize)
             for name, (dtype, shape) in ckpt.specs.items()]
    shards = plan_shards(sizes, parse_size(DEFAULT_MAX_SHARD["ckpt"]))
    with atomic_output_dir(out, overwrite=overwrite, command="lora merge", source=base,
                           inputs=(adapter.path,)) as tmp:
        with ShardedWriter(tmp, "ckpt", shards, lambda path, _names: CkptWriter(path),
                           {"producer": f"migrate {__version__}"}) as writer:
            for name, array in ckpt.tensors():
                if name in deltas:
                    array = (array.astype(np.float32) + deltas.pop(name)).astype(array.dtype)
                with writer.open_tensor(name, array.dtype, array.shape) as stream:
                    stream.write(np.ascontiguousarray(array).reshape(-1).view(np.uint8))
        shutil.copy2(base / "model.yaml", tmp / "model.yaml")
        copy_sidecars(base, tmp)
        record = _conversion_record(base)
        record.update(files=writer.files, format="ckpt", lora_merged={
            "adapter": str(adapter.path), "scaling": adapter.spec.scaling, "rank": adapter.spec.rank,
            "modules": [s.hf_module for s in sites], "base": str(base)})
        (tmp / "conversion.json").write_text(json.dumps(record, indent=2) + "\n")
    return Path(out)


def _conversion_record(base: Path) -> dict:
    """The base's conversion.json fields that say how to read it back (keymap, target), else the keymap name."""
    try:
        record = load_json(base / "conversion.json")
        return {k: record[k] for k in ("tool", "keymap", "target") if k in record}
    except (OSError, ValueError):
        return {"keymap": {"name": recorded_keymap(base)}}
