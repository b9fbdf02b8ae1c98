"""lr_at restates transformers' schedules: equal to get_scheduler + LambdaLR at every step."""
import pytest
import torch
from transformers import get_scheduler

from migrate.train.config import RunConfig
from migrate.train.schedule import lr_at, lr_table

TOTAL = 200
LR = 3e-4
CASES = {
    "constant": {"name": "constant"},
    "constant_warmup_steps": {"name": "constant", "warmup_steps": 17},
    "constant_with_warmup_ratio": {"name": "constant_with_warmup", "warmup_ratio": 0.1},
    "linear": {"name": "linear"},
    "linear_warmup_steps": {"name": "linear", "warmup_steps": 20},
    "linear_warmup_ratio": {"name": "linear", "warmup_ratio": 0.123},
    "linear_min_lr": {"name": "linear", "warmup_steps": 10, "min_lr": 3e-5},
    "linear_min_lr_rate": {"name": "linear", "warmup_ratio": 0.05, "min_lr_rate": 0.1},
    "cosine": {"name": "cosine"},
    "cosine_warmup_steps": {"name": "cosine", "warmup_steps": 30},
    "cosine_warmup_ratio": {"name": "cosine", "warmup_ratio": 0.07},
    "cosine_min_lr": {"name": "cosine", "warmup_steps": 10, "min_lr": 3e-5},
    "cosine_min_lr_rate": {"name": "cosine", "warmup_ratio": 0.1, "min_lr_rate": 0.05},
    "cosine_with_min_lr_alias": {"name": "cosine_with_min_lr", "min_lr": 1e-6},
    "warmup_everything": {"name": "linear", "warmup_steps": TOTAL},
}


def hf_lrs(cfg: RunConfig) -> list[float]:
    """The lr each optimizer step uses under transformers.get_scheduler."""
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.AdamW([param], lr=cfg.optimizer.lr)
    hf = cfg.hf_schedule()
    sched = get_scheduler(hf.name, opt, num_warmup_steps=hf.num_warmup_steps,
                          num_training_steps=hf.num_training_steps, scheduler_specific_kwargs=dict(hf.kwargs))
    lrs = []
    for _ in range(cfg.total_steps):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return lrs


@pytest.mark.parametrize("case", CASES)
def test_lr_at_equals_hf_every_step(case):
    cfg = RunConfig.from_dict({"data": "d", "seq_length": 8, "total_steps": TOTAL,
                               "optimizer": {"lr": LR}, "schedule": CASES[case]})
    expected = hf_lrs(cfg)
    ours = [lr_at(step, cfg) for step in range(TOTAL)]
    assert lr_table(cfg) == ours
    for step, (a, b) in enumerate(zip(ours, expected, strict=True)):
        assert abs(a - b) <= 1e-12 * abs(b), (case, step, a, b)
    assert max(expected) > 0 and len(set(expected)) >= (1 if cfg.hf_schedule().name == "constant" else 3)


def test_floor_and_warmup_shapes():
    cfg = RunConfig.from_dict({"data": "d", "seq_length": 8, "total_steps": TOTAL, "optimizer": {"lr": LR},
                               "schedule": {"name": "cosine", "warmup_steps": 10, "min_lr": 3e-5}})
    assert lr_at(0, cfg) == 0.0 and lr_at(5, cfg) == pytest.approx(LR / 2)
    assert lr_at(10, cfg) == pytest.approx(LR) and lr_at(TOTAL, cfg) == pytest.approx(3e-5)
