"""Training checkpoints of the MindSpore trainer: written atomically, resumed exactly.

Layout (one folder per checkpoint under RUN/checkpoints, RUN being the run
folder that holds metrics.jsonl):

    RUN/checkpoints/checkpoint-<step>/
        model.ckpt          the parameters (fp32 masters), MindSpore .ckpt, the
                            bundled model's names: `migrate export` and
                            `load_model` read the folder as a converted model
        adapter.ckpt, lora.json   instead of model.ckpt in a LoRA run: the adapters
                            (MindSpore names) and their spec, targets and base
                            (`migrate.train.lora_run`; `migrate lora export` reads them)
        model.yaml          the model config (compute_dtype float32)
        tokenizer*, ...     sidecar files copied from the source model folder
        optimizer.ckpt      AdamW moments: adam_m.<param>, adam_v.<param> (fp32)
        trainer_state.json  step, optimizer step, scheduler position, loss-scale
                            state, data position, tokens, elapsed time,
                            faults, keymap, mode, the run config
        rng_state.json      Python, numpy and MindSpore generator states
        metrics.jsonl       the run's metrics up to this step
        parallel_layout.json  runs of several processes only: dp/mp/pp and which
                            rank saved which file; with optimizer sharding
                            optimizer.ckpt is replaced by per-rank
                            optimizer.rank-<r>.ckpt files (`migrate.train.checkpoint.shards`)
        manifest.json       size and sha256 of every file above, written last;
                            verified before the folder is read (`migrate.checkpoints.integrity`)
    RUN/checkpoints/latest -> checkpoint-<step>   (symlink to the newest complete one)

A checkpoint is built under a hidden temporary name and renamed into place, so
a crash leaves either the whole folder or nothing; `latest` is switched with
an atomic rename of a fresh symlink afterwards. Only the newest
`keep_checkpoints` folders are kept.
"""
from __future__ import annotations

import json
import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

import mindspore as ms
import numpy as np

from migrate.checkpoints.atomic import atomic_output_dir
from migrate.checkpoints.input_folder import InputFolder
from migrate.checkpoints.integrity import FORMAT, STATE_FILE, VERSION, verify_checkpoint
from migrate.checkpoints.manifest import write_manifest
from migrate.errors import MigrateError
from migrate.jsonsafe import load_json
from migrate.sidecar import copy_sidecars
from migrate.train.checkpoint.files import (
    ADAPTER_FILE,
    LORA_FILE,
    METRICS_FILE,
    MODEL_CONFIG,
    MODEL_FILE,
    OPTIMIZER_FILE,
    RNG_FILE,
    load_ckpt_file,
    save_tensors_atomically,
)
from migrate.train.checkpoint.shards import (
    LAYOUT_FILE,
    SHARD_PREFIX,
    is_sharded,
    layout_without_files,
    merged_optimizer_state,
    read_layout,
)

FOLDER = "checkpoints"
PREFIX = "checkpoint-"
LATEST = "latest"


# ---------- RNG ----------
def rng_state() -> dict:
    """Python, numpy and MindSpore generator states, JSON-ready."""
    version, internal, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "python": [version, list(internal), gauss],
        "numpy": [name, keys.tolist(), int(pos), int(has_gauss), float(cached)],
        "mindspore": {"seed": ms.get_seed(), "state": ms.get_rng_state().asnumpy().tolist()},
    }


def set_rng_state(state: dict) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(keys, np.uint32), pos, has_gauss, cached))
    ms_state = state["mindspore"]
    if ms_state.get("seed") is not None:
        ms.set_seed(ms_state["seed"])
    ms.set_rng_state(ms.Tensor(np.asarray(ms_state["state"], np.uint8)))


# ---------- writing ----------
def checkpoint_dirs(folder: Path) -> list[Path]:
    """Complete checkpoint folders in RUN/checkpoints (or the folder given), oldest first."""
    found = []
    for path in Path(folder).glob(PREFIX + "*"):
        suffix = path.name[len(PREFIX):]
        if path.is_dir() and suffix.isdigit() and (path / STATE_FILE).is_file():
            found.append((int(suffix), path))
    return [p for _, p in sorted(found)]


def shard_staging_dir(run_dir: str | Path, step: int) -> Path:
    """Where the ranks of an optimizer-sharded run put their shard files before rank 0 assembles the folder."""
    return Path(run_dir) / FOLDER / f".{PREFIX}{step}.shards.partial"


def save_checkpoint(run_dir: str | Path, step: int, *, model, model_config, optimizer, state: dict,
                    metrics_text: str, sidecar_src: Path | None = None, keep: int | None = None,
                    parallel_layout: dict | None = None, shard_staging: Path | None = None,
                    param_names: dict[str, str] | None = None, adapters=None, lora_record: dict | None = None) -> Path:
    """Write RUN/checkpoints/checkpoint-<step> atomically, point `latest` at it, prune to `keep`.

    parallel_layout: the run's `dist_ckpt.layout_record` (several processes);
    written as parallel_layout.json with the rank that saved each file.
    shard_staging: a folder holding every rank's optimizer shard file (then
    the layout must carry "optimizer_slices"); they are moved in instead of
    writing optimizer.ckpt.
    param_names: model parameter name -> name written in model.ckpt (a converted
    folder's renaming target, e.g. mcore); optimizer moments keep the model's names.
    adapters, lora_record: a LoRA run writes its adapter Parameters to adapter.ckpt and
    lora_record to lora.json instead of the whole model (the frozen base is the run's ms_model).
    """
    folder = Path(run_dir) / FOLDER
    final = folder / f"{PREFIX}{step}"
    with atomic_output_dir(final, overwrite=True) as tmp:
        if adapters is not None:
            ms.save_checkpoint([{"name": p.name, "data": p} for p in adapters], str(tmp / ADAPTER_FILE))
            (tmp / LORA_FILE).write_text(json.dumps(lora_record, indent=1) + "\n")
        elif param_names:
            ms.save_checkpoint([{"name": param_names.get(p.name, p.name), "data": p} for p in model.get_parameters()],
                               str(tmp / MODEL_FILE))
        else:
            ms.save_checkpoint(model, str(tmp / MODEL_FILE))
        config = type(model_config).from_dict(model_config.to_dict())
        config.compute_dtype = "float32"  # the saved parameters are the fp32 masters
        config.save(tmp / MODEL_CONFIG)
        if sidecar_src is not None and Path(sidecar_src).is_dir():
            copy_sidecars(Path(sidecar_src), tmp)
        if shard_staging is None:
            moments = [{"name": p.name, "data": ms.Tensor(p.asnumpy())}
                       for p in (*optimizer.exp_avg, *optimizer.exp_avg_sq)]
            ms.save_checkpoint(moments, str(tmp / OPTIMIZER_FILE))
        else:
            for shard in sorted(Path(shard_staging).glob(SHARD_PREFIX + "*.ckpt")):
                os.replace(shard, tmp / shard.name)
        record = {"format": FORMAT, "version": VERSION, **state, "optimizer_step": optimizer.step_count}
        rng = record.pop("rng", None)
        (tmp / STATE_FILE).write_text(json.dumps(record, indent=1) + "\n")
        (tmp / RNG_FILE).write_text(json.dumps(rng) + "\n")
        (tmp / METRICS_FILE).write_text(metrics_text)
        if parallel_layout is not None:
            files = {p.name: {"saved_by": int(p.name[len(SHARD_PREFIX):-len(".ckpt")]), "kind": "optimizer shard"}
                     if p.name.startswith(SHARD_PREFIX) else {"saved_by": 0, "kind": "whole"}
                     for p in sorted(tmp.iterdir())}
            (tmp / LAYOUT_FILE).write_text(json.dumps({**parallel_layout, "files": files}, indent=1) + "\n")
        write_manifest(tmp)  # last: it records every file above, and nothing changes after it
    if shard_staging is not None:
        shutil.rmtree(shard_staging, ignore_errors=True)
    _point_latest(folder, final.name)
    if keep:
        for old in checkpoint_dirs(folder)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def remove_partials(run_dir: str | Path) -> list[str]:
    """Delete what a killed run left half-written in RUN/checkpoints (hidden *.partial / *.old names)."""
    folder = Path(run_dir) / FOLDER
    removed = []
    for path in folder.glob(".*"):
        if path.name.endswith((".partial", ".old")) and (path.name.startswith(f".{PREFIX}")
                                                         or path.name.startswith(f".{LATEST}.")):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
            removed.append(path.name)
    return removed


def _point_latest(folder: Path, target: str) -> None:
    tmp = folder / f".{LATEST}.{os.getpid()}.partial"
    tmp.unlink(missing_ok=True)
    os.symlink(target, tmp)
    os.replace(tmp, folder / LATEST)


# ---------- reading ----------
@dataclass
class Checkpoint:
    path: Path
    state: dict
    metrics_text: str

    @property
    def step(self) -> int:
        return int(self.state["step"])

    def parameters(self) -> dict:
        """The saved parameters: the whole model, or a LoRA run's adapters."""
        return load_ckpt_file(self.path / (ADAPTER_FILE if self.lora is not None else MODEL_FILE))

    @property
    def lora(self) -> dict | None:
        """lora.json of a LoRA run's checkpoint (spec, targets, base), None for full training."""
        return _read_json(self.path, LORA_FILE) if (self.path / LORA_FILE).is_file() else None

    @property
    def parallel_layout(self) -> dict | None:
        """parallel_layout.json of a multi-process checkpoint, None for a single-process one."""
        return read_layout(self.path)

    def optimizer_state(self) -> dict[str, np.ndarray]:
        """Every AdamW moment whole (optimizer shards are stitched back), plus the step."""
        layout = self.parallel_layout
        if is_sharded(layout):
            moments = merged_optimizer_state(self.path, layout)
        else:
            moments = {name: p.asnumpy() for name, p in load_ckpt_file(self.path / OPTIMIZER_FILE).items()}
        moments["step"] = np.asarray(self.state["optimizer_step"], np.int64)
        return moments


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint folder (or `latest`), RUN/checkpoints, or a run folder: the newest checkpoint there."""
    path = Path(path)
    if (path / STATE_FILE).is_file():
        return path.resolve()
    for folder in (path, path / FOLDER):
        if (folder / LATEST).exists():
            return (folder / LATEST).resolve()
        if folder.is_dir():
            done = checkpoint_dirs(folder)
            if done:
                return done[-1]
    raise MigrateError(f"no training checkpoint at {path} (expected a checkpoint folder with {STATE_FILE}, "
                       f"or a run folder with {FOLDER}/{LATEST})")


def open_checkpoint(path: str | Path) -> Checkpoint:
    """The checkpoint at path, its manifest verified first (a damaged one is one MigrateError line)."""
    folder = resolve_checkpoint(path)
    verify_checkpoint(folder)
    state = _read_json(folder, STATE_FILE)
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise MigrateError(f"{folder / STATE_FILE} is not a migrate training checkpoint")
    sharded = is_sharded(read_layout(folder))
    weights = ADAPTER_FILE if (folder / LORA_FILE).is_file() else MODEL_FILE
    members = InputFolder(folder, "checkpoint")
    for name in (weights, METRICS_FILE, RNG_FILE) + (() if sharded else (OPTIMIZER_FILE,)):
        if not (folder / name).is_file():
            raise MigrateError(f"checkpoint {folder} has no {name}")
        members.member(name, name)  # inside the checkpoint (an old one has no manifest refusing links)
    state["rng"] = _read_json(folder, RNG_FILE)
    try:
        metrics_text = (folder / METRICS_FILE).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise MigrateError(f"unreadable {METRICS_FILE} in {folder}: {exc}") from None
    return Checkpoint(folder, state, metrics_text)


def _read_json(folder: Path, name: str):
    try:
        return load_json(folder / name)
    except (OSError, ValueError) as exc:  # ValueError: jsonsafe.JSONError (not JSON, not UTF-8, too deep)
        raise MigrateError(f"unreadable {name} in {folder}: {exc}") from None


# ---------- merging ----------
def merge_checkpoint(src: str | Path, out: str | Path, overwrite: bool = False) -> Path:
    """One single-process checkpoint folder from a multi-process one (or a run folder's latest)."""
    checkpoint = open_checkpoint(src)
    record = read_layout(checkpoint.path)
    out = Path(out)
    if out.resolve() == checkpoint.path:
        raise MigrateError(f"merge output {out} is the checkpoint itself; pick another folder")
    with atomic_output_dir(out, overwrite=overwrite, command="ckpt merge", source=checkpoint.path) as tmp:
        for item in checkpoint.path.iterdir():
            if item.name == LAYOUT_FILE or item.name.startswith(SHARD_PREFIX) or item.name.startswith("."):
                continue
            if item.is_file():
                shutil.copy2(item, tmp / item.name)
        if is_sharded(record):
            state = merged_optimizer_state(checkpoint.path, record)
            save_tensors_atomically(state, tmp / OPTIMIZER_FILE)
        state = load_json(checkpoint.path / STATE_FILE)
        state["merged_from"] = {"path": str(checkpoint.path), "layout": layout_without_files(record)}
        (tmp / STATE_FILE).write_text(json.dumps(state, indent=1) + "\n")
        write_manifest(tmp)  # last: the merged folder is a checkpoint of its own (its source was verified)
    return out
