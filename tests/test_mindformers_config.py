"""`migrate mindformers-config` / `convert --mindformers-yaml`: the MindFormers 2.0.0 run YAML.

What MindFormers itself does with these YAMLs (build, strict load, logits, 20 training steps
against the golden) is tests/test_mindformers_live.py, which needs a MindFormers env. Here:
the YAML against the pinned field table, the values it carries, the layouts and every refusal.
"""
from __future__ import annotations

import dataclasses
import math

import pytest
import yaml

from family_fixtures import build_family_model
from hf_fixtures import build_hf_model, save_hf_model
from mf_fixtures import make_mf_root
from migrate.cli import main
from migrate.convert import convert
from migrate.errors import MigrateError
from migrate.mindformers.fields import check_run_yaml
from migrate.mindformers.hparams_vs_golden import planned_steps, steps_trained
from migrate.mindformers.model import check_expressible
from migrate.mindformers.run import PREDICT_SEQ_LENGTH, mindformers_run
from migrate.mindformers.table import TABLE
from migrate.models.config import LlamaConfig
from migrate.train.config import RunConfig


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return make_mf_root(tmp_path_factory.mktemp("mf"))


@pytest.fixture(scope="module")
def cfg(root):
    return RunConfig.load(root / "run.yaml")


def test_training_yaml_fits_mindformers_and_carries_the_golden_knobs(root, cfg):
    doc = mindformers_run(run_config=cfg).doc
    assert check_run_yaml(doc) == []
    mc = doc["model"]["model_config"]
    assert (mc["seq_length"], mc["max_position_embedding"], mc["n_kv_heads"]) == (16, 64, 2)
    assert mc["pad_token_id"] == -1 and mc["param_init_type"] == mc["compute_dtype"] == "float32"
    assert mc["qkv_has_bias"] and mc["attn_proj_has_bias"] and not mc["qkv_concat"]
    assert (mc["use_flash_attention"], mc["fused_rms_norm"], mc["use_rope_slice"]) == (True, True, False)  # Ascend
    assert doc["optimizer"] == {"type": "AdamW", "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1,
                                "use_fused": False}
    assert doc["lr_schedule"] == {"type": "CosineWithWarmUpLR", "learning_rate": 3e-3, "warmup_steps": 5,
                                  "warmup_lr_init": 0.0, "total_steps": 40, "decay_steps": 40, "num_cycles": 0.5,
                                  "lr_end": pytest.approx(3e-4)}
    # global batch 8 = 4 rows × 2 accumulated; accumulation needs semi_auto_parallel and the dividing wrapper
    assert doc["runner_config"]["batch_size"] == 4 and doc["runner_config"]["gradient_accumulation_steps"] == 2
    assert doc["use_parallel"] and doc["parallel"]["parallel_mode"] == 1
    assert doc["runner_wrapper"]["type"] == "MFPipelineWithLossScaleCell"
    assert doc["runner_wrapper"]["micro_batch_num"] == 2 and doc["runner_wrapper"]["use_clip_grad"]
    # 400 rows / 8 = 50 steps per epoch; 40 steps = int(50 × 0.81) sink steps of 1
    assert doc["runner_config"]["sink_size"] == 1 and int(50 * doc["runner_config"]["epochs"]) == 40
    assert doc["load_checkpoint"] == str((root / "ms" / "model.ckpt").resolve())
    assert doc["train_dataset"]["data_loader"]["dataset_dir"].endswith("data/train.mindrecord")


def test_fused_and_cpu_yaml(root, cfg):
    doc = mindformers_run(root / "ms_fused", cfg, device="cpu").doc
    mc = doc["model"]["model_config"]
    assert check_run_yaml(doc) == [] and mc["qkv_concat"]
    assert (mc["use_flash_attention"], mc["fused_rms_norm"], mc["use_rope_slice"]) == (False, False, True)
    assert doc["context"]["device_target"] == "CPU" and not doc["use_parallel"]
    assert doc["runner_config"]["batch_size"] == 8 and doc["runner_config"]["gradient_accumulation_steps"] == 1


@pytest.mark.parametrize("device", ["cpu", "ascend"])
@pytest.mark.parametrize("total", [40, 50, 100, 120, 137])
def test_mindformers_trains_exactly_total_steps(cfg, device, total):
    """400 rows / global batch 8 = 50 steps per epoch; by MindFormers' own arithmetic (check_runner_config,
    Model.train, TrainCallBack), as `migrate hparams --mindformers` computes it, the run is total_steps long."""
    doc = mindformers_run(run_config=cfg.replace(total_steps=total), device=device).doc
    assert check_run_yaml(doc) == []
    assert steps_trained(doc, 400, 8) == total and doc["lr_schedule"]["total_steps"] == total
    stops = [c for c in doc["callbacks"] if c["type"] == "TrainCallBack"]
    if device == "cpu":  # no dataset sink on CPU: whole epochs, stopped by the callback MindFormers adds
        assert doc["runner_config"]["sink_mode"] is False and doc["runner_config"]["epochs"] == math.ceil(total / 50)
        assert stops == [{"type": "TrainCallBack", "stop_step": total}]
        assert planned_steps(doc, 400, 8) == 50 * math.ceil(total / 50)
    else:
        assert doc["runner_config"]["sink_size"] == 1 and stops == []


def test_on_cpu_mindspore_runs_a_sink_yaml_without_the_sink(cfg):
    doc = mindformers_run(run_config=cfg).doc  # Ascend: 40 sinks of 1 step
    assert steps_trained(doc, 400, 8) == 40
    doc["context"]["device_target"] = "CPU"  # MindSpore's Model.train takes the non-sink loop: 40 whole epochs
    assert steps_trained(doc, 400, 8) == 40 * 50 and planned_steps(doc, 400, 8) == 40


def test_a_remainder_of_rows_is_noted_when_epochs_repeat(root, cfg):
    (root / "data4").mkdir(exist_ok=True)
    meta = (root / "data" / "data.json").read_text().replace('"samples": 400', '"samples": 404')
    (root / "data4" / "data.json").write_text(meta)
    notes = mindformers_run(run_config=cfg.replace(data=str(root / "data4"), total_steps=60), device="cpu").notes
    assert any("drops the last 4 rows of every epoch" in n and "from step 51" in n for n in notes)
    assert not any("drop" in n for n in mindformers_run(run_config=cfg, device="cpu").notes)


def test_pinned_field_check_fails_on_a_wrong_yaml(cfg):
    doc = mindformers_run(run_config=cfg).doc
    doc["model"]["model_config"]["head_dim"] = 8          # HF's name: the legacy Llama ignores it
    doc["model"]["model_config"]["pad_token_id"] = None   # fails later in MindFormers' NotEqual
    doc["runner_wrapper"]["type"] = "TrainOneStepCell"
    doc["callbacks"] += [{"type": "EarlyStop", "stop_step": 3}, {"type": "TrainCallBack", "stop_steps": 3}]
    problems = check_run_yaml(doc)
    assert any("callbacks[2].type 'EarlyStop' is not one of" in p for p in problems)
    assert any("callbacks[3].stop_steps is not a MindFormers 2.0.0 field" in p for p in problems)
    assert any("head_dim is not a MindFormers 2.0.0 field" in p for p in problems)
    assert any("pad_token_id = None" in p for p in problems)
    assert any("runner_wrapper.type 'TrainOneStepCell'" in p for p in problems)


@pytest.mark.parametrize("dp, mp, pp, micro, want", [
    (2, 1, 1, 1, (4, 1, 1)),            # dp replaces accumulation: 4 × dp 2
    (4, 2, 1, 1, (2, 1, 1)),            # 8 = 2 × dp 4
    (2, 1, 2, 2, (2, 1, 2)),            # pipeline: 8 = 2 × dp 2 × micro-batches 2
])
def test_layouts_keep_the_global_batch(cfg, dp, mp, pp, micro, want):
    doc = mindformers_run(run_config=cfg, dp=dp, mp=mp, pp=pp, micro_batches=micro).doc
    pc, rc = doc["parallel_config"], doc["runner_config"]
    assert (pc["data_parallel"], pc["model_parallel"], pc["pipeline_stage"]) == (dp, mp, pp)
    assert (rc["batch_size"], rc["gradient_accumulation_steps"], pc["micro_batch_num"]) == want
    assert check_run_yaml(doc) == []


@pytest.mark.parametrize("kwargs, words", [
    (dict(mp=3), "num_heads (4) is not divisible by mp (3)"),
    (dict(pp=2, micro_batches=1), "micro_batches (1) must be >= pp (2)"),
    (dict(dp=3), "global batch 8 (micro_batch_size × grad_accum_steps) is not divisible by dp 3"),
    (dict(dp=2, device="cpu"), "--device cpu runs one process"),
    (dict(optimizer_shard=True), "--optimizer-shard needs dp >= 2"),
    (dict(dp=0), "--dp must be a positive integer, got 0"),     # was a ZeroDivisionError
    (dict(dp=-2), "--dp must be a positive integer, got -2"),
    (dict(pp=2, micro_batches=0), "--micro-batches must be a positive integer, got 0"),
    (dict(seq_length=0), "--seq-length must be a positive integer, got 0"),
])
def test_layout_rules_refuse(cfg, kwargs, words):
    with pytest.raises(MigrateError, match=words.replace("(", r"\(").replace(")", r"\)")):
        mindformers_run(run_config=cfg, **kwargs)


@pytest.mark.parametrize("change, field", [
    (dict(head_dim=16), "head_dim"),
    (dict(hidden_act="gelu"), "hidden_act"),
    (dict(mlp_bias=True), "mlp_bias"),
    (dict(sliding_window=8), "sliding_window"),
    (dict(rope_scaling={"rope_type": "yarn", "factor": 2.0}), "rope_scaling.rope_type"),
    (dict(scale_embeddings=True, rms_norm_unit_offset=True), "scale_embeddings"),
])
def test_what_the_legacy_llama_cannot_express_is_refused_naming_the_field(change, field):
    base = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, seq_length=64)
    check_expressible(base, 16)
    with pytest.raises(MigrateError, match=field.replace(".", r"\.")) as err:
        check_expressible(dataclasses.replace(base, **change), 16)
    assert "\n" not in str(err.value)


def test_mcore_and_training_refusals(root, cfg, tmp_path):
    base = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4)
    with pytest.raises(MigrateError, match="no mcore"):
        check_expressible(base, 16, "hf_llama", "mcore")
    with pytest.raises(MigrateError, match="no_decay"):
        mindformers_run(run_config=cfg.replace(optimizer=dataclasses.replace(cfg.optimizer, no_decay=["bias"])))
    with pytest.raises(MigrateError, match="dropout"):
        mindformers_run(run_config=cfg.replace(dropout=0.1))
    convert(root / "hf", tmp_path / "ms_bf16", dtype="bf16")
    with pytest.raises(MigrateError, match="convert with --dtype fp32"):
        mindformers_run(tmp_path / "ms_bf16", cfg)
    assert mindformers_run(tmp_path / "ms_bf16").doc["model"]["model_config"]["param_init_type"] == "bfloat16"


def test_sharded_checkpoint_loads_from_its_folder(root, tmp_path):
    convert(root / "hf", tmp_path / "sharded", max_shard_size="20KB")
    doc = mindformers_run(tmp_path / "sharded").doc
    assert doc["load_checkpoint"] == str((tmp_path / "sharded").resolve()) and doc["run_mode"] == "predict"


def test_cli_writes_and_guards_its_output(root, tmp_path, capsys):
    out = tmp_path / "mf.yaml"
    assert main(["mindformers-config", "--config", str(root / "run.yaml"), "--out", str(out)]) == 0
    text = out.read_text()
    assert text.startswith("# written by migrate mindformers-config") and "# note: clipping below" in text
    assert check_run_yaml(yaml.safe_load(text)) == []
    assert main(["mindformers-config", "--config", str(root / "run.yaml"), "--out", str(out)]) == 2
    assert "already exists" in capsys.readouterr().err
    assert main(["mindformers-config", "--config", str(root / "run.yaml"), "--out", str(out), "--overwrite"]) == 0
    foreign = tmp_path / "theirs.yaml"
    foreign.write_text("seed: 1\n")
    assert main(["mindformers-config", str(root / "ms"), "--out", str(foreign), "--overwrite"]) == 2
    assert "not written by migrate" in capsys.readouterr().err and foreign.read_text() == "seed: 1\n"


def test_convert_refuses_gemma_before_writing_anything(tmp_path, capsys):
    save_hf = build_family_model("hf_gemma")
    save_hf.save_pretrained(tmp_path / "gemma")
    code = main(["convert", "--src", "hf_gemma", str(tmp_path / "gemma"), str(tmp_path / "out"),
                 "--mindformers-yaml", str(tmp_path / "mf.yaml")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "Gemma" in err[0] and "scale_embeddings" in err[0]
    assert not (tmp_path / "out").exists() and not (tmp_path / "mf.yaml").exists()


@pytest.mark.parametrize("flag, value", [("--seq-length", "0"), ("--dp", "0"), ("--micro-batches", "-1")])
def test_convert_refuses_a_bad_layout_number_before_converting(root, tmp_path, capsys, flag, value):
    code = main(["convert", str(root / "hf"), str(tmp_path / "ms"), "--mindformers-yaml", str(tmp_path / "mf.yaml"),
                 flag, value])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err == [f"migrate: error: {flag} must be a positive integer, got {value}"]
    assert not (tmp_path / "ms").exists() and not (tmp_path / "mf.yaml").exists()   # nothing converted first


def test_convert_writes_the_yaml_beside(root, tmp_path):
    assert main(["convert", str(root / "hf"), str(tmp_path / "ms"), "--qkv-concat", "--mindformers-yaml",
                 str(tmp_path / "mf.yaml"), "--device", "cpu", "--seq-length", "32"]) == 0
    doc = yaml.safe_load((tmp_path / "mf.yaml").read_text())
    assert check_run_yaml(doc) == [] and doc["model"]["model_config"]["qkv_concat"]
    assert doc["model"]["model_config"]["seq_length"] == 32 and doc["run_mode"] == "predict"


def test_a_predict_yaml_caps_the_default_seq_length(root, tmp_path, capsys):
    """MindFormers pads every prompt to seq_length; a model's max_position_embeddings (8,192 for SmolLM2-135M)
    is too long a default: it is capped, --seq-length sets it, a shorter model keeps its own."""
    save_hf_model(build_hf_model("gqa", max_position_embeddings=8192), tmp_path / "hf")
    assert main(["convert", str(tmp_path / "hf"), str(tmp_path / "ms"), "--mindformers-yaml",
                 str(tmp_path / "mf.yaml"), "--device", "cpu"]) == 0
    text = (tmp_path / "mf.yaml").read_text()
    mc = yaml.safe_load(text)["model"]["model_config"]
    assert PREDICT_SEQ_LENGTH == 512 and (mc["seq_length"], mc["max_position_embedding"]) == (512, 8192)
    assert "# note: seq_length 512 (max_position_embeddings 8192 capped at 512; --seq-length sets it)" in text
    assert "note: seq_length 512" in capsys.readouterr().out
    run = mindformers_run(tmp_path / "ms", device="cpu", seq_length=4096)
    assert run.doc["model"]["model_config"]["seq_length"] == 4096 and "seq_length 4096 (--seq-length)" in run.notes[0]
    assert mindformers_run(root / "ms").doc["model"]["model_config"]["seq_length"] == 64  # its own 64
    assert main(["convert", str(tmp_path / "hf"), str(tmp_path / "ms2"), "--mindformers-yaml",
                 str(tmp_path / "mf2.yaml"), "--device", "cpu", "--seq-length", "1024"]) == 0
    assert yaml.safe_load((tmp_path / "mf2.yaml").read_text())["model"]["model_config"]["seq_length"] == 1024


def test_translation_table_covers_every_run_yaml_knob():
    text = " ".join(t.knob for t in TABLE)
    fields = [f.name for f in dataclasses.fields(RunConfig) if f.name != "source"]
    assert [f for f in fields if f not in text] == []


def test_a_gpt2_folder_is_refused(tmp_path):
    build_family_model("hf_gpt2").save_pretrained(tmp_path / "gpt2")
    convert(tmp_path / "gpt2", tmp_path / "ms", keymap="hf_gpt2")
    with pytest.raises(MigrateError, match="written for the Llama family"):
        mindformers_run(tmp_path / "ms")
