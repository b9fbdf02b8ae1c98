"""The golden PyTorch script: real training of a tiny Llama on a tiny tokenized corpus."""
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from hf_fixtures import build_hf_model, save_hf_model
from migrate.data.corpus import train_bpe_tokenizer, write_stdlib_corpus
from migrate.data.samples import load_samples, run_order
from migrate.data.tokenize import tokenize_corpus
from migrate.train.config import RunConfig
from migrate.train.decay import hf_decay_names
from migrate.train.schedule import lr_at, lr_table

# slow as a whole: its module fixtures build golden training runs
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "golden" / "train_torch.py"
VOCAB = 320
RUN = """\
hf_model: hf
data: data
seq_length: 16
micro_batch_size: 4
grad_accum_steps: 2
total_steps: 10
max_grad_norm: 1.0
data_seed: 5
optimizer: {lr: 3e-3, weight_decay: 0.1}
schedule: {name: cosine, warmup_steps: 2, min_lr_rate: 0.1}
out_dir: {golden: out}
"""


def _load_golden():
    spec = importlib.util.spec_from_file_location("golden_train_torch", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


golden = _load_golden()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("golden")
    files = write_stdlib_corpus(root / "corpus", modules=["textwrap", "heapq", "json"])
    train_bpe_tokenizer(files, VOCAB, root / "tok")
    tokenize_corpus(files, root / "tok", 16, root / "data")
    save_hf_model(build_hf_model("gqa", vocab_size=VOCAB), root / "hf")
    (root / "run.yaml").write_text(RUN)
    return root


@pytest.fixture(scope="module")
def cfg(run_dir):
    return RunConfig.load(run_dir / "run.yaml")


def metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def quiet(cfg, out, **changes):
    return golden.train(cfg.replace(**changes) if changes else cfg, out, log=lambda line: None)


@pytest.fixture(scope="module")
def first_run(cfg, run_dir):
    return metrics(quiet(cfg, run_dir / "a"))


def test_metrics_follow_the_schedule_and_loss_falls(first_run, cfg):
    assert [m["step"] for m in first_run] == list(range(1, 11))
    for m in first_run:
        assert abs(m["lr"] - lr_at(m["step"] - 1, cfg)) <= 1e-12 * max(m["lr"], 1e-30)
        assert m["tokens"] == m["step"] * 4 * 2 * 16 and m["grad_norm"] > 0 and m["time"] >= 0
    assert first_run[0]["lr"] == 0.0 and first_run[2]["lr"] == pytest.approx(3e-3)
    losses = [m["loss"] for m in first_run]
    assert losses[-1] < losses[0] - 0.1 and np.mean(losses[-3:]) < np.mean(losses[:3])


def test_first_loss_is_the_ordered_rows_on_the_initial_model(first_run, cfg):
    # Step 1 = mean of micro-batch losses on rows run_order[0, m] of the untouched model.
    model = golden.build_model(cfg)
    rows = load_samples(cfg.data)
    order = run_order(cfg, len(rows))
    with torch.no_grad():
        micro = [golden.micro_loss(model, torch.from_numpy(rows[order[0, m]].astype(np.int64))).item()
                 for m in range(cfg.grad_accum_steps)]
        batch = torch.from_numpy(rows[order[0, 0]].astype(np.int64))
        hf_style = model(input_ids=batch, labels=batch).loss.item()  # HF shifting a seq_length+1 row
    assert first_run[0]["loss"] == sum(micro) / len(micro)
    assert hf_style == pytest.approx(micro[0], rel=1e-5)


def test_same_seed_is_bit_identical_and_eval_and_checkpoints_do_not_perturb(first_run, cfg, run_dir):
    out = quiet(cfg, run_dir / "b", checkpoint_interval=4, keep_checkpoints=2, eval_interval=5,
                eval_data=cfg.data, eval_samples=8)
    second = metrics(out)
    assert [(m["loss"], m["grad_norm"], m["lr"]) for m in second] == [
        (m["loss"], m["grad_norm"], m["lr"]) for m in first_run]
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-10", "checkpoint-8"]
    assert (out / "checkpoint-10" / "model.safetensors").is_file()
    assert (out / "checkpoint-10" / "trainer_state.pt").is_file()
    evals = [json.loads(line) for line in (out / "eval.jsonl").read_text().splitlines()]
    assert [e["step"] for e in evals] == [5, 10] and evals[1]["eval_loss"] < evals[0]["eval_loss"]
    other = metrics(quiet(cfg, run_dir / "c", data_seed=6, total_steps=2))
    assert other[0]["loss"] != first_run[0]["loss"]  # another order, other batches


def test_effective_hparams_come_from_the_live_objects(first_run, cfg, run_dir):
    eff = json.loads((run_dir / "a" / "effective_hparams.json").read_text())
    model = golden.build_model(cfg)
    decayed, kept = eff["optimizer"]["groups"]
    assert set(decayed["names"]) == hf_decay_names(model) and decayed["weight_decay"] == 0.1
    assert kept["weight_decay"] == 0.0 and all(n.endswith("norm.weight") for n in kept["names"])
    assert set(decayed["names"]) | set(kept["names"]) == set(dict(model.named_parameters()))
    assert decayed["betas"] == [0.9, 0.999] and decayed["eps"] == 1e-8 and decayed["initial_lr"] == 3e-3
    assert eff["scheduler"]["lr"] == lr_table(cfg) == [m["lr"] for m in first_run]
    assert eff["scheduler"]["hf_name"] == "cosine_with_min_lr"
    assert eff["clipping"]["max_grad_norm"] == 1.0 and eff["accumulation"]["grad_accum_steps"] == 2
    assert eff["model"]["attn_implementation"] == "eager" and eff["model"]["dropout"] == {"attention_dropout": 0.0}


def test_fp16_overflow_skips_the_step_and_the_schedule(cfg, run_dir):
    # A huge first scale overflows: HF skips optimizer *and* scheduler step, then backs off.
    out = quiet(cfg, run_dir / "fp16", dtype="fp16", total_steps=3,
                loss_scale=type(cfg.loss_scale)(init_scale=1e38, backoff_factor=1e-34))
    m = metrics(out)
    assert [r["skipped"] for r in m] == [True, False, False]
    assert [r["loss_scale"] for r in m] == pytest.approx([1e38, 1e4, 1e4]) and m[0]["grad_norm"] is None
    assert [r["lr"] for r in m] == [lr_at(0, cfg.replace(total_steps=3)), lr_at(0, cfg.replace(total_steps=3)),
                                    lr_at(1, cfg.replace(total_steps=3))]
    assert all(np.isfinite(r["loss"]) for r in m)


def test_bf16_autocast_and_recompute(first_run, cfg, run_dir):
    bf16 = metrics(quiet(cfg, run_dir / "bf16", dtype="bf16", total_steps=3))
    assert [m["loss"] for m in bf16] == pytest.approx([m["loss"] for m in first_run[:3]], rel=2e-2)
    recompute = metrics(quiet(cfg, run_dir / "rc", recompute=True, total_steps=4))
    assert json.loads((run_dir / "rc" / "effective_hparams.json").read_text())["model"]["gradient_checkpointing"]
    assert [m["loss"] for m in recompute] == pytest.approx([m["loss"] for m in first_run[:4]], rel=1e-6)


def test_cli(run_dir, capsys):
    small = run_dir / "small.yaml"
    small.write_text(RUN.replace("total_steps: 10", "total_steps: 2"))
    env = {**os.environ, "PYTHONPATH": ""}
    done = subprocess.run([sys.executable, str(SCRIPT), "--config", str(small), "--out", str(run_dir / "cli"),
                           "--seed", "1", "--data-seed", "2"], capture_output=True, text=True, env=env, cwd=run_dir)
    assert done.returncode == 0, done.stderr
    eff = json.loads((run_dir / "cli" / "effective_hparams.json").read_text())
    assert eff["seed"] == 1 and eff["data"]["shuffle_seed"] == 2 and len(metrics(run_dir / "cli")) == 2
    # user mistakes: one line, exit 2 (in-process, same main())
    (run_dir / "bad.yaml").write_text(RUN.replace("micro_batch_size", "micro_batch_sise"))
    assert golden.main(["--config", str(run_dir / "bad.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "micro_batch_sise: unknown key (did you mean 'micro_batch_size'?)" in err
