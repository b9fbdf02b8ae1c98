"""Which training-checkpoint format a path is, by the files only that format writes (nothing is parsed
beyond a .ckpt / .safetensors header)."""
from __future__ import annotations

from pathlib import Path

from migrate.errors import MigrateError
from migrate.state_diff import read_golden, read_hf_trainer, read_mindformers, read_ms_trainer

# (format, is it one?, reader), most specific first: a MindSpore trainer's folder also holds model.yaml,
# the golden's config.json beside trainer_state.pt
READERS = (("migrate train", read_ms_trainer.is_ms_trainer, read_ms_trainer.read),
           ("golden", read_golden.is_golden, read_golden.read),
           ("HF Trainer", read_hf_trainer.is_hf_trainer, read_hf_trainer.read),
           ("MindFormers", read_mindformers.is_mindformers, read_mindformers.read))


def state_format(spec: str) -> str | None:
    """The format of the training checkpoint `spec` names, or None for anything else."""
    path = Path(spec)
    for name, claims, _ in READERS:
        if claims(path):
            return name
    return None


def reader(spec: str):
    path = Path(spec)
    for _, claims, read in READERS:
        if claims(path):
            return read
    raise MigrateError(f"{spec} is no training checkpoint (expected migrate train's checkpoint-N with "
                       "trainer_state.json and model.yaml, the golden script's checkpoint-N with trainer_state.pt, "
                       "an HF Trainer checkpoint-N with optimizer.pt and trainer_state.json, or a MindFormers "
                       ".ckpt / .safetensors holding adam_m.* / adam_v.*)")


def is_state_pair(a: str, b: str) -> bool:
    """`migrate diff A B` compares training states when both are; one of them with a model folder or a
    dump is the ordinary model diff (a MindSpore trainer's checkpoint is also a converted model folder)."""
    return state_format(a) is not None and state_format(b) is not None
