"""An HF Trainer checkpoint-N: the model (config.json, model.safetensors or pytorch_model.bin),
optimizer.pt, scheduler.pt, trainer_state.json, rng_state.pth, scaler.pt (fp16). training_args.bin is a
pickle of arbitrary classes and is never read.

Trainer's optimizer.pt does not name its parameters: Trainer builds two groups from the model's
``named_parameters()`` -- those that decay, then the rest (`Trainer.create_optimizer`, the rule of
`migrate.train.decay.hf_decay_names`) -- so the names are rebuilt from config.json's model on torch's meta
device (no weights allocated), and refused unless the groups' sizes and every moment's shape agree."""
from __future__ import annotations

from pathlib import Path

from migrate.checkpoints.input_folder import InputFolder
from migrate.errors import MigrateError
from migrate.state_diff.hf_weights import read_config, read_weights
from migrate.state_diff.state import LOSS_SCALE, OPTIMIZER_STEP, SCHEDULER_STEP, STEP, TrainingState, rng_arrays
from migrate.state_diff.torch_files import load_torch
from migrate.state_diff.torch_optimizer import group_indices, group_lr, moments_by_name, recorded_names
from migrate.train.decay import hf_decay_names

OPTIMIZER, SCHEDULER, STATE, RNG, SCALER = ("optimizer.pt", "scheduler.pt", "trainer_state.json",
                                           "rng_state.pth", "scaler.pt")


def is_hf_trainer(path: Path) -> bool:
    return path.is_dir() and (path / OPTIMIZER).is_file() and (path / STATE).is_file()


def read(path: Path) -> TrainingState:
    folder = InputFolder(path, "checkpoint")
    config = read_config(path)
    trainer = folder.json(STATE, expect=dict)
    optimizer = load_torch(folder.member(OPTIMIZER, OPTIMIZER), "HF Trainer's optimizer state")
    indices = group_indices(optimizer, path / OPTIMIZER)
    names = recorded_names(optimizer) or trainer_names(config, [len(g) for g in indices], path)
    exp_avg, exp_avg_sq, adam_step = moments_by_name(optimizer, names, path / OPTIMIZER)
    scheduler = load_torch(folder.member(SCHEDULER, SCHEDULER), "HF Trainer's scheduler state") \
        if (path / SCHEDULER).is_file() else {}
    scaler = load_torch(folder.member(SCALER, SCALER), "HF Trainer's loss scaler") \
        if (path / SCALER).is_file() else {}
    counters = {STEP: trainer.get("global_step"), OPTIMIZER_STEP: adam_step,
                SCHEDULER_STEP: (scheduler or {}).get("last_epoch"), LOSS_SCALE: (scaler or {}).get("scale")}
    rng = _rng(folder, path) if (path / RNG).is_file() else {}
    return TrainingState(path, "HF Trainer", "hf", read_weights(path), exp_avg, exp_avg_sq,
                         counters={k: float(v) for k, v in counters.items() if isinstance(v, (int, float))},
                         lr=group_lr(optimizer), rng=rng, config=config)


def trainer_names(config: dict, sizes: list[int], path: Path) -> list[list[str]]:
    """The parameter names of Trainer's groups: decayed, then not (an empty group is kept by Trainer)."""
    import torch
    import transformers

    hf_config = transformers.AutoConfig.for_model(**config)
    try:
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(hf_config)
    except (ValueError, KeyError) as exc:
        raise MigrateError(f"{path / 'config.json'}: transformers cannot build its model ({exc})") from None
    decay = hf_decay_names(model)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    groups = [[n for n in trainable if n in decay], [n for n in trainable if n not in decay]]
    if [len(g) for g in groups] != sizes:
        raise MigrateError(f"{path}: the optimizer's param groups hold {sizes} parameters where HF Trainer's "
                           f"grouping of this model gives {[len(g) for g in groups]} (decayed, not decayed)")
    return groups


def _rng(folder: InputFolder, path: Path) -> dict:
    """Python's and numpy's generator states from rng_state.pth, as rng_state.json's readers give them."""
    states = load_torch(folder.member(RNG, RNG), "HF Trainer's generator states", numpy_arrays=True)
    if not isinstance(states, dict):
        raise MigrateError(f"{path / RNG} holds no generator states")
    python, numpy = states.get("python"), states.get("numpy")
    as_json = {}
    if python is not None:
        as_json["python"] = [python[0], list(python[1]), python[2]]
    if numpy is not None:
        as_json["numpy"] = [numpy[0], list(numpy[1]), int(numpy[2])]
    return rng_arrays(as_json)
