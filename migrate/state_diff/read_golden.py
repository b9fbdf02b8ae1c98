"""golden/train_torch.py's checkpoint-N: the HF model (save_pretrained: config.json and its weights) and
trainer_state.pt: {"step", "optimizer" (torch AdamW built from named parameters: each group keeps its
``param_names``), "scheduler" (LambdaLR), "scaler" (GradScaler, fp16 only)}. A LoRA run's checkpoint holds
the PEFT adapter (adapter_config.json, adapter_model.safetensors) in place of the model."""
from __future__ import annotations

from pathlib import Path

from migrate.checkpoints.input_folder import InputFolder
from migrate.errors import MigrateError
from migrate.lora.peft_files import CONFIG_FILE as PEFT_CONFIG
from migrate.lora.peft_files import read_peft_adapter
from migrate.state_diff.hf_weights import read_config, read_weights
from migrate.state_diff.lora_names import from_peft, hf_lora_name
from migrate.state_diff.read_hf_trainer import trainer_names
from migrate.state_diff.state import LOSS_SCALE, OPTIMIZER_STEP, SCHEDULER_STEP, STEP, TrainingState
from migrate.state_diff.torch_files import load_torch
from migrate.state_diff.torch_optimizer import group_indices, group_lr, moments_by_name, recorded_names

STATE_FILE = "trainer_state.pt"


def is_golden(path: Path) -> bool:
    return path.is_dir() and (path / STATE_FILE).is_file()


def read(path: Path) -> TrainingState:
    folder = InputFolder(path, "checkpoint")
    record = load_torch(folder.member(STATE_FILE, STATE_FILE), "the golden's training state")
    if not isinstance(record, dict) or not isinstance(record.get("optimizer"), dict):
        raise MigrateError(f"{path / STATE_FILE} holds no optimizer state (not golden/train_torch.py's)")
    optimizer = record["optimizer"]
    lora = (path / PEFT_CONFIG).is_file()   # a LoRA run: save_pretrained wrote the PEFT adapter alone
    names = recorded_names(optimizer)
    if names is None and not lora:   # a torch before 2.6 saves no param_names: the golden groups as Trainer does
        names = trainer_names(read_config(path), [len(g) for g in group_indices(optimizer, path)], path)
    if names is None:
        raise MigrateError(f"{path / STATE_FILE}: its param groups do not name their parameters")
    if lora:
        names = [[from_peft(n) for n in group] for group in names]
    exp_avg, exp_avg_sq, adam_step = moments_by_name(optimizer, names, path / STATE_FILE)
    scheduler, scaler = record.get("scheduler") or {}, record.get("scaler") or {}
    counters = {STEP: record.get("step"), OPTIMIZER_STEP: adam_step,
                SCHEDULER_STEP: scheduler.get("last_epoch"), LOSS_SCALE: scaler.get("scale")}
    params = _adapter(path) if lora else read_weights(path)
    return TrainingState(path, "golden", "hf", params, exp_avg, exp_avg_sq,
                         counters={k: float(v) for k, v in counters.items() if v is not None},
                         lr=group_lr(optimizer), config=None if lora else read_config(path))


def _adapter(path: Path) -> dict:
    weights = read_peft_adapter(path).weights
    return {hf_lora_name(m, which): ab[i] for m, ab in weights.items() for i, which in enumerate("AB")}
