"""The run config: every field read, paths resolved, every mistake one named line."""
from pathlib import Path

import pytest

from migrate.errors import MigrateError
from migrate.train.config import HFSchedule, RunConfig

FULL = """\
hf_model: models/hf
ms_model: models/ms
data: data
eval_data: /abs/eval
seq_length: 512
micro_batch_size: 4
grad_accum_steps: 8
total_steps: 1000
max_grad_norm: 1.0
seed: 7
data_seed: 11
dtype: bfloat16
recompute: true
checkpoint_interval: 100
keep_checkpoints: 2
eval_interval: 50
optimizer:
  lr: 3e-4
  betas: [0.9, 0.95]
  eps: 1.0e-8
  weight_decay: 0.1
  no_decay: [bias, norm, embedding]
schedule:
  name: cosine
  warmup_ratio: 0.015
  min_lr: 3.0e-5
loss_scale: {init_scale: 1024, growth_interval: 100}
out_dir: {golden: out/g}
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cfg" / "run.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    return path


def load_dict(data: dict) -> RunConfig:
    return RunConfig.from_dict({"data": "d", "seq_length": 8, "total_steps": 100, **data}, source="run.yaml")


def error_of(data: dict) -> str:
    with pytest.raises(MigrateError) as exc:
        load_dict(data)
    msg = str(exc.value)
    assert "\n" not in msg and exc.value.exit_code == 2
    return msg


def test_full_config_reads_every_field(tmp_path):
    cfg = RunConfig.load(write(tmp_path, FULL))
    base = (tmp_path / "cfg").resolve()
    assert cfg.hf_model == base / "models/hf" and cfg.ms_model == base / "models/ms"
    assert cfg.data == base / "data" and cfg.eval_data == Path("/abs/eval")
    assert cfg.out_dir.golden == base / "out/g" and cfg.out_dir.ms == base / "runs/ms"
    assert (cfg.seq_length, cfg.micro_batch_size, cfg.grad_accum_steps, cfg.total_steps) == (512, 4, 8, 1000)
    assert cfg.samples_per_step == 32 and cfg.shuffle_seed == 11
    assert cfg.dtype == "bf16" and cfg.recompute is True
    assert cfg.optimizer.lr == 3e-4  # YAML 1.1 reads `3e-4` as a string; taken as a number
    assert cfg.optimizer.betas == (0.9, 0.95) and cfg.optimizer.no_decay == ["bias", "norm", "embedding"]
    assert cfg.loss_scale.init_scale == 1024.0 and cfg.loss_scale.growth_factor == 2.0
    assert cfg.loss_scale.backoff_factor == 0.5 and cfg.loss_scale.growth_interval == 100
    # warmup_ratio rounds up like TrainingArguments.get_warmup_steps: ceil(1000 * 0.015) = 15
    assert cfg.hf_schedule() == HFSchedule("cosine_with_min_lr", 15, 1000, {"min_lr": 3e-5})
    assert cfg.to_dict()["data"] == str(base / "data")


def test_defaults_are_hf_trainer_defaults():
    cfg = load_dict({})
    assert (cfg.optimizer.lr, cfg.optimizer.betas, cfg.optimizer.eps, cfg.optimizer.weight_decay) == (
        5e-5, (0.9, 0.999), 1e-8, 0.0)
    assert cfg.optimizer.no_decay == ["bias", "norm"]
    assert cfg.max_grad_norm == 1.0 and cfg.seed == 42 and cfg.shuffle_seed == 42  # data_seed falls back to seed
    assert cfg.micro_batch_size == 8 and cfg.grad_accum_steps == 1 and cfg.dtype == "fp32"
    assert cfg.hf_schedule() == HFSchedule("linear", 0, 100, {})
    assert load_dict({"shuffle": False}).shuffle_seed is None


@pytest.mark.parametrize("schedule, expected", [
    ({"name": "constant"}, HFSchedule("constant", 0, 100, {})),
    ({"name": "constant", "warmup_steps": 5}, HFSchedule("constant_with_warmup", 5, 100, {})),
    ({"name": "constant_with_warmup", "warmup_steps": 5}, HFSchedule("constant_with_warmup", 5, 100, {})),
    ({"name": "linear", "warmup_ratio": 0.1}, HFSchedule("linear", 10, 100, {})),
    ({"name": "linear", "min_lr": 1e-4}, HFSchedule("polynomial", 0, 100, {"lr_end": 1e-4, "power": 1.0})),
    ({"name": "linear", "min_lr_rate": 0.5}, HFSchedule("polynomial", 0, 100, {"lr_end": 5e-4, "power": 1.0})),
    ({"name": "linear", "min_lr": 0.0}, HFSchedule("linear", 0, 100, {})),
    ({"name": "cosine", "warmup_steps": 3}, HFSchedule("cosine", 3, 100, {})),
    ({"name": "cosine", "min_lr_rate": 0.1}, HFSchedule("cosine_with_min_lr", 0, 100, {"min_lr_rate": 0.1})),
    ({"name": "cosine_with_min_lr", "min_lr": 1e-5}, HFSchedule("cosine_with_min_lr", 0, 100, {"min_lr": 1e-5})),
])
def test_schedule_maps_onto_one_hf_scheduler(schedule, expected):
    assert load_dict({"optimizer": {"lr": 1e-3}, "schedule": schedule}).hf_schedule() == expected


@pytest.mark.parametrize("data, needle", [
    ({"micro_batch_sise": 4}, "micro_batch_sise: unknown key (did you mean 'micro_batch_size'?)"),
    ({"optimizer": {"weight_decy": 0.1}}, "optimizer.weight_decy: unknown key (did you mean 'weight_decay'?)"),
    ({"out_dir": {"goldne": "x"}}, "out_dir.goldne: unknown key (did you mean 'golden'?)"),
    ({"zzz": 1}, "zzz: unknown key"),
    ({"total_steps": "ten"}, "total_steps: must be an integer, got 'ten'"),
    ({"total_steps": 0}, "total_steps: must be >= 1"),
    ({"seq_length": 8.5}, "seq_length: must be an integer"),
    ({"recompute": "yes"}, "recompute: must be true or false"),
    ({"optimizer": {"lr": "fast"}}, "optimizer.lr: must be a number, got 'fast'"),
    ({"optimizer": {"lr": -1}}, "optimizer.lr: must be > 0"),
    ({"optimizer": {"betas": [0.9]}}, "optimizer.betas: must be a list of 2 values"),
    ({"optimizer": {"betas": [0.9, 1.5]}}, "optimizer.betas[1]: must be in [0, 1)"),
    ({"optimizer": {"no_decay": ["bais"]}}, "optimizer.no_decay[0]: unknown rule 'bais' (did you mean 'bias'?)"),
    ({"optimizer": 3}, "optimizer: must be a mapping"),
    ({"dtype": "bf17"}, "dtype: unknown dtype 'bf17' (did you mean 'bf16'?)"),
    ({"schedule": {"name": "cosin"}}, "schedule.name: unknown schedule 'cosin' (did you mean 'cosine'?)"),
    ({"schedule": {"name": "polynomial"}}, "schedule.name: unknown schedule 'polynomial'"),
    ({"schedule": {"name": "cosine_with_min_lr"}}, "needs min_lr or min_lr_rate"),
    ({"schedule": {"warmup_steps": 1, "warmup_ratio": 0.1}}, "schedule.warmup_ratio: set warmup_steps or"),
    ({"schedule": {"warmup_steps": 101}}, "schedule.warmup_steps: 101 warmup steps exceed total_steps 100"),
    ({"schedule": {"name": "linear", "min_lr": 1.0}}, "schedule.min_lr: must be below optimizer.lr"),
    ({"schedule": {"name": "constant", "min_lr": 1e-6}}, "schedule.min_lr: a constant schedule has no min_lr"),
    ({"schedule": {"min_lr": 1e-6, "min_lr_rate": 0.1}}, "schedule.min_lr_rate: set min_lr or min_lr_rate"),
    ({"loss_scale": {"backoff_factor": 2}}, "loss_scale.backoff_factor: must be in (0, 1)"),
    ({"eval_interval": 10}, "eval_data: eval_interval needs eval_data"),
    ({"seed": -1}, "seed: must be >= 0"),
    ({"data": None}, "data: must not be empty"),
])
def test_mistakes_are_one_line_naming_the_key(data, needle):
    msg = error_of(data)
    assert msg.startswith("run.yaml: ") and needle in msg, msg


def test_missing_required_key():
    with pytest.raises(MigrateError, match=r"^run config: total_steps: is required$"):
        RunConfig.from_dict({"data": "d", "seq_length": 8})


def test_file_errors(tmp_path):
    with pytest.raises(MigrateError, match="no run config at"):
        RunConfig.load(tmp_path / "absent.yaml")
    with pytest.raises(MigrateError, match="is empty"):
        RunConfig.load(write(tmp_path, ""))
    with pytest.raises(MigrateError, match="invalid run config .*: while parsing"):
        RunConfig.load(write(tmp_path, "data: [unclosed\n"))
    with pytest.raises(MigrateError, match="must be a mapping"):
        RunConfig.load(write(tmp_path, "- a\n- b\n"))


def test_replace_validates_again():
    cfg = load_dict({})
    assert cfg.replace(seed=3).seed == 3 and cfg.seed == 42
    with pytest.raises(MigrateError, match="data_seed: must be >= 0"):
        cfg.replace(data_seed=-2)
    with pytest.raises(MigrateError, match="hf_model is not set"):
        cfg.require("hf_model")
