"""`migrate train`'s checkpoint folder (`migrate.train.checkpoint.folder`): model.ckpt (a LoRA run:
adapter.ckpt + lora.json), optimizer.ckpt (adam_m.<param> / adam_v.<param>, the model's own names) or
per-rank optimizer shards, trainer_state.json, rng_state.json, model.yaml; its manifest verified first.
Read without MindSpore, except the shards."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from migrate.checkpoints.input_folder import InputFolder
from migrate.checkpoints.integrity import FORMAT, STATE_FILE, verify_checkpoint
from migrate.checkpoints.ms_reader import open_ms_checkpoint
from migrate.errors import MigrateError
from migrate.lora.record import ADAPTER_FILE, LORA_FILE, read_record
from migrate.safeyaml import load_yaml
from migrate.state_diff.lora_names import from_record
from migrate.state_diff.state import LOSS_SCALE, OPTIMIZER_STEP, SCHEDULER_STEP, STEP, TrainingState, rng_arrays
from migrate.train.config import RunConfig
from migrate.train.schedule import hf_lr

MODEL_FILE, OPTIMIZER_FILE, RNG_FILE, MODEL_CONFIG, LAYOUT_FILE = (
    "model.ckpt", "optimizer.ckpt", "rng_state.json", "model.yaml", "parallel_layout.json")
PREFIXES = {"adam_m.": "exp_avg", "adam_v.": "exp_avg_sq"}


def is_ms_trainer(path: Path) -> bool:
    return path.is_dir() and (path / STATE_FILE).is_file() and (path / MODEL_CONFIG).is_file()


def read(path: Path) -> TrainingState:
    verify_checkpoint(path)
    folder = InputFolder(path, "checkpoint")
    record = folder.json(STATE_FILE, expect=dict)
    if record.get("format") != FORMAT:
        raise MigrateError(f"{path / STATE_FILE} is not a migrate training checkpoint")
    config = load_yaml(folder.member(MODEL_CONFIG, MODEL_CONFIG), "model config")
    if not isinstance(config, dict):
        raise MigrateError(f"{path / MODEL_CONFIG} is not a mapping")
    lora = (path / LORA_FILE).is_file()
    # a LoRA run saves its adapters alone, named here as the golden's PEFT adapter is (`lora_names`)
    renamed = from_record(read_record(path)) if lora else {}
    weights = ADAPTER_FILE if lora else MODEL_FILE
    params = {renamed.get(n, n): a for n, a in open_ms_checkpoint(folder.member(weights, weights)).tensors()}
    moments = {"exp_avg": {}, "exp_avg_sq": {}}
    for name, array in _optimizer_tensors(path, folder).items():
        prefix = next((p for p in PREFIXES if name.startswith(p)), None)
        if prefix is not None:
            bare = name[len(prefix):]
            moments[PREFIXES[prefix]][renamed.get(bare, bare)] = array
    counters = {STEP: record.get("step"), OPTIMIZER_STEP: record.get("optimizer_step"),
                SCHEDULER_STEP: record.get("scheduler_step"), LOSS_SCALE: _loss_scale(record.get("loss_scale"))}
    run = record.get("config") if isinstance(record.get("config"), dict) else {}
    rng = folder.json(RNG_FILE) if (path / RNG_FILE).is_file() else None
    return TrainingState(path, "migrate train", "hf" if lora else "ms", params, moments["exp_avg"],
                         moments["exp_avg_sq"],
                         counters={k: v for k, v in counters.items() if v is not None},
                         lr=_next_lr(run, record.get("scheduler_step")), rng=rng_arrays(rng),
                         config=None if lora else config, keymap=record.get("keymap"), dtype=run.get("dtype"))


def _optimizer_tensors(path: Path, folder: InputFolder) -> dict[str, np.ndarray]:
    if (path / LAYOUT_FILE).is_file():
        from migrate.train.checkpoint.shards import is_sharded, merged_optimizer_state, read_layout

        layout = read_layout(path)
        if is_sharded(layout):   # optimizer.rank-<r>.ckpt: stitched back whole (MindSpore reads them)
            return merged_optimizer_state(path, layout)
    return dict(open_ms_checkpoint(folder.member(OPTIMIZER_FILE, OPTIMIZER_FILE)).tensors())


def _loss_scale(state) -> float | None:
    """The fp16 scaler's current scale (trainer_state.json's loss_scale: null, a number or the scaler's state)."""
    if isinstance(state, dict):
        state = state.get("scale", state.get("loss_scale"))
    return float(state) if isinstance(state, (int, float)) else None


def _next_lr(run: dict, scheduler_step) -> float | None:
    """The lr the next step uses, from the run config the checkpoint carries (the schedule is pure Python)."""
    if not run or scheduler_step is None:
        return None
    try:
        cfg = RunConfig.from_dict(run)
        return float(hf_lr(int(scheduler_step), cfg.hf_schedule(), cfg.optimizer.lr))
    except (MigrateError, ValueError, TypeError, KeyError):
        return None   # a config this version cannot read: the lr is not compared
