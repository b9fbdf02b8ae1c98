"""`migrate hparams run.yaml --mindformers mf.yaml`: the golden against what MindFormers 2.0.0
would do with a YAML, naming the first difference. The emitted YAML agrees knob by knob;
each deliberately broken YAML (or golden) is caught at the knob it breaks."""
from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest
import yaml

from mf_fixtures import make_mf_root
from migrate.cli import main
from migrate.mindformers import schedule as mf_schedule
from migrate.mindformers.hparams_vs_golden import mf_hparams_report
from migrate.mindformers.run import mindformers_run
from migrate.mindformers.training import lr_section
from migrate.train.config import RunConfig
from migrate.train.schedule import lr_table


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = make_mf_root(tmp_path_factory.mktemp("mfh"))
    cfg = RunConfig.load(root / "run.yaml")
    return root, cfg, mindformers_run(run_config=cfg).doc


def report_for(root, cfg, doc, name="mf.yaml"):
    path = root / name
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return mf_hparams_report(cfg, path)


def test_the_emitted_yaml_agrees_knob_by_knob(setup, capsys):
    root, cfg, doc = setup
    report = report_for(root, cfg, doc)
    assert report.first_difference is None, report.first_difference
    assert report.row("lr").same and report.row("decayed_parameters").golden == "16 parameters"
    assert report.row("not_decayed_parameters").mindspore == "13 parameters"  # norms and biases
    (root / "cli.yaml").write_text(yaml.safe_dump(doc))
    assert main(["hparams", str(root / "run.yaml"), "--mindformers", str(root / "cli.yaml")]) == 0
    assert "all knobs agree" in capsys.readouterr().out


@pytest.mark.parametrize("total", [40, 137])
def test_the_cpu_yaml_agrees_and_trains_exactly_total_steps(setup, total):
    root, cfg, _ = setup  # 400 rows / 8 = 50 steps per epoch: 137 is not whole epochs
    run = cfg.replace(total_steps=total)
    report = report_for(root, run, mindformers_run(run_config=run, device="cpu").doc, f"cpu{total}.yaml")
    assert report.first_difference is None, report.first_difference
    row = report.row("steps_trained")
    assert row.mindspore == total and f"TrainCallBack stop_step {total}" in row.detail


def _set(doc, path, value):
    node = doc
    *parents, leaf = path.split(".")
    for key in parents:
        node = node[key]
    if value is None:
        node.pop(leaf)
    else:
        node[leaf] = value


FAULTS = {  # name: (YAML edits, first difference)
    "eps 1e-6": ({"optimizer.eps": 1e-6}, "eps"),
    "betas": ({"optimizer.betas": [0.9, 0.999]}, "betas"),
    "MindSpore's AdamWeightDecay": ({"optimizer.type": "AdamWeightDecay", "optimizer.eps": None,
                                     "optimizer.betas": None}, "optimizer"),
    "no clipping": ({"runner_wrapper.use_clip_grad": False}, "clip_max_norm"),
    "accumulation reset outside semi_auto_parallel": ({"use_parallel": False}, "grad_accum_steps"),
    "accumulation not dividing the loss": ({"micro_batch_interleave_num": 2, "runner_config.batch_size": 2},
                                           "loss_divisor"),
    "warmup off by one": ({"lr_schedule.warmup_steps": 6}, "num_warmup_steps"),
    "warmup_ratio floors": ({"lr_schedule.warmup_steps": None, "lr_schedule.warmup_ratio": 0.12},
                            "num_warmup_steps"),  # HF's ceil(40 × 0.12) = 5, MindFormers' int() = 4
    "a different min lr": ({"lr_schedule.lr_end": 0.0}, "min_lr"),
    "a different total-step count": ({"lr_schedule.total_steps": 41, "lr_schedule.decay_steps": 41},
                                     "num_training_steps"),
    "total_steps -1 and one epoch too many": ({"lr_schedule.total_steps": -1, "runner_config.epochs": 1},
                                              "num_training_steps"),
    "the Ascend YAML run on CPU (no dataset sink: 40 whole epochs)": ({"context.device_target": "CPU"},
                                                                      "steps_trained"),
    "a TrainCallBack stopping early": ({"callbacks": [{"type": "TrainCallBack", "stop_step": 30}]}, "steps_trained"),
    "seed": ({"seed": 4}, "seed"),
    "rms_norm_eps 1e-5 (the model has 1e-6)": ({"model.model_config.rms_norm_eps": 1e-5}, "model.rms_norm_eps"),
    "pad_token_id left at MindFormers' 0": ({"model.model_config.pad_token_id": None}, "model.pad_token_id"),
    "bf16 residual stream": ({"model.model_config.residual_dtype": None, "model.model_config.compute_dtype":
                              "bfloat16"}, "model.precision"),
}


@pytest.mark.parametrize("name", list(FAULTS))
def test_each_fault_is_named_as_the_first_difference(setup, name):
    root, cfg, doc = setup
    edits, knob = FAULTS[name]
    broken = copy.deepcopy(doc)
    for path, value in edits.items():
        _set(broken, path, value)
    report = report_for(root, cfg, broken)
    assert report.first_difference is not None and report.first_difference.knob == knob, report.first_difference
    assert report.exit_status == 1


def test_weight_decay_on_norms_in_the_golden_is_named(setup):
    root, cfg, doc = setup  # MindFormers never decays 1-D parameters; a golden that decays norms differs
    golden = cfg.replace(optimizer=dataclasses.replace(cfg.optimizer, no_decay=["bias"]))
    row = report_for(root, golden, doc).first_difference
    assert row.knob == "decayed_parameters" and "only golden (5 norm weight)" in row.detail


@pytest.mark.parametrize("schedule", [
    {"name": "cosine", "warmup_steps": 5, "min_lr_rate": 0.1}, {"name": "cosine", "warmup_steps": 7, "min_lr": 1e-4},
    {"name": "linear", "warmup_steps": 3}, {"name": "linear", "warmup_steps": 4, "min_lr": 1e-5},
    {"name": "constant", "warmup_steps": 6}, {"name": "constant"}, {"name": "cosine", "warmup_ratio": 0.07},
])
def test_mindformers_schedule_formulas_equal_transformers(schedule):
    cfg = RunConfig.from_dict({"data": "d", "seq_length": 8, "total_steps": 37, "optimizer": {"lr": 3e-4},
                               "schedule": schedule})
    golden = np.array(lr_table(cfg))
    section = lr_section(cfg)
    exact = np.array(mf_schedule.table(section, 37, 37))
    fp32 = np.array(mf_schedule.table(section, 37, 37, dtype=np.float32))
    assert np.abs(exact - golden).max() <= 1e-12 * 3e-4
    assert np.abs(fp32 - golden).max() <= 2e-7 * 3e-4    # MindFormers evaluates in float32
    off = np.array(mf_schedule.table({**section, "warmup_steps": section["warmup_steps"] + 1}, 37, 37))
    assert np.abs(off - golden).max() > 1e-3 * 3e-4 or not section["warmup_steps"]
