"""Training a folder converted to MindFormers' fused layouts (--qkv-concat, --target mcore):
the fused parameters pair with their HF sources for weight decay and `migrate hparams`,
and the curve follows the golden's. Other families are refused in one line."""
import pytest
import torch

from family_fixtures import build_family_model, save_hf_model
from migrate.cli import main
from migrate.convert import convert
from migrate.train.building import build_training
from migrate.train.config import ScheduleConfig
from migrate.train.hparams import hparams_report
from migrate.train.trainer import train
from train_setup import load_cfg, load_golden, make_run_dir, metrics, rel

SHORT = ScheduleConfig(name="cosine", warmup_steps=2, min_lr_rate=0.1)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    root = make_run_dir(tmp_path_factory.mktemp("fused"), variant="bias")  # q/k/v, o and MLP biases
    for target in ("qkv_concat", "mcore"):
        convert(root / "hf", root / f"ms_{target}", target=target)
    return root


@pytest.mark.parametrize("target", ["qkv_concat", "mcore"])
def test_fused_parameters_decay_as_their_sources(run_dir, target):
    cfg = load_cfg(run_dir, ms_model=str(run_dir / f"ms_{target}"))
    report = hparams_report(cfg)
    assert report.exit_status == 0, report.first_difference
    training = build_training(cfg)
    decayed = set(training.optimizer.param_groups[0]["names"])  # [decayed, not decayed]
    names = {p.name for p in training.model.trainable_params()}
    fused = {n for n in names if n.endswith(("w_qkv.weight", "w_gate_hidden.weight"))}
    fused_bias = {n for n in names if n.endswith(("w_qkv.bias", "w_gate_hidden.bias"))}
    assert fused and fused_bias  # the model really runs fused
    row = report.row("decayed_parameters")
    assert row.same and row.golden == row.mindspore
    assert fused <= decayed and not fused_bias & decayed


@pytest.mark.slow
@pytest.mark.usefixtures("one_torch_thread")
def test_fused_training_follows_the_golden(run_dir):
    cfg = load_cfg(run_dir, ms_model=str(run_dir / "ms_mcore"), total_steps=4, schedule=SHORT)
    load_golden().train(cfg, run_dir / "golden_fused", log=lambda line: None)
    train(cfg, run_dir / "ms_fused_run", progress=False)
    g, m = metrics(run_dir / "golden_fused"), metrics(run_dir / "ms_fused_run")
    assert [r["step"] for r in m] == [1, 2, 3, 4]
    assert rel(g[0]["loss"], m[0]["loss"]) <= 1e-6
    assert max(rel(a["loss"], b["loss"]) for a, b in zip(g, m, strict=True)) <= 1e-5


def test_other_families_are_refused_in_one_line(tmp_path, capsys):
    src = save_hf_model(build_family_model("hf_gpt2"), tmp_path / "hf")
    assert main(["convert", "--src", "hf_gpt2", str(src), str(tmp_path / "ms")]) == 0
    (tmp_path / "run.yaml").write_text(f"hf_model: {src}\nms_model: {tmp_path / 'ms'}\ndata: data\n"
                                       "seq_length: 8\ntotal_steps: 2\n")
    assert main(["train", "--config", str(tmp_path / "run.yaml")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "trains the bundled Llama family" in err[0] and "GPT2LMHeadModel" in err[0]


@pytest.mark.slow
def test_mcore_checkpoints_read_like_the_converted_folder(run_dir):
    """Training checkpoints keep the folder's mcore names: a resume continues the same
    curve, and `migrate export` turns a checkpoint back into an HF folder."""
    import mindspore as ms
    import transformers

    cfg = load_cfg(run_dir, ms_model=str(run_dir / "ms_mcore"), total_steps=4, schedule=SHORT,
                   checkpoint_interval=2)
    train(cfg, run_dir / "mcore_run", progress=False)
    checkpoints = run_dir / "mcore_run" / "checkpoints"
    saved = set(ms.load_checkpoint(str(checkpoints / "checkpoint-4" / "model.ckpt")))
    assert saved == set(ms.load_checkpoint(str(run_dir / "ms_mcore" / "model.ckpt")))
    assert any(name.startswith("decoder.layers.0.self_attention.linear_qkv") for name in saved)

    train(cfg, run_dir / "mcore_resumed", resume=checkpoints / "checkpoint-2", progress=False)
    whole, resumed = metrics(run_dir / "mcore_run"), metrics(run_dir / "mcore_resumed")
    assert [r["loss"] for r in resumed] == [r["loss"] for r in whole]

    assert main(["export", str(checkpoints / "checkpoint-4"), str(run_dir / "hf_trained")]) == 0
    trained = transformers.AutoModelForCausalLM.from_pretrained(run_dir / "hf_trained")
    original = transformers.AutoModelForCausalLM.from_pretrained(run_dir / "hf")
    q_trained = trained.state_dict()["model.layers.0.self_attn.q_proj.weight"]
    q_original = original.state_dict()["model.layers.0.self_attn.q_proj.weight"]
    assert q_trained.shape == q_original.shape and not torch.equal(q_trained, q_original)  # trained, unfused
