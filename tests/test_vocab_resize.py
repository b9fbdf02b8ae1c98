"""`migrate vocab resize`: a resized model (both sides, the same new rows) converts to the same
checkpoint, passes `migrate diff`, and trains on both sides alike; padding to a multiple of mp
satisfies the parallel layout's divisibility rule, which names the command."""
from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors.numpy import load_file

from migrate.align.runner import run_diff
from migrate.checkpoints.ms_reader import open_ms_checkpoint
from migrate.cli import main
from migrate.convert import convert
from migrate.models.registry import load_model_config
from migrate.parallel.layout import Layout, validate
from migrate.train.config import ScheduleConfig
from migrate.train.trainer import train
from migrate.vocab.resize import resize_vocab
from train_setup import VOCAB, load_cfg, load_golden, make_run_dir, metrics, rel

EMB, HEAD = "model.tok_embeddings.embedding_weight", "lm_head.weight"
NEW = VOCAB + 16


def ms_tensors(folder) -> dict[str, np.ndarray]:
    return dict(open_ms_checkpoint(folder).tensors())


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    root = make_run_dir(tmp_path_factory.mktemp("resize"), variant="gqa")
    assert main(["vocab", "resize", str(root / "ms"), str(root / "ms_r"), "--to", str(NEW), "--init", "normal",
                 "--std", "0.02", "--seed", "3", "--hf", str(root / "hf"), str(root / "hf_r")]) == 0
    return root


def test_both_sides_get_the_same_new_rows(run_dir):
    old, new = ms_tensors(run_dir / "ms"), ms_tensors(run_dir / "ms_r")
    hf = load_file(run_dir / "hf_r" / "model.safetensors")
    for ms_name, hf_name, k in ((EMB, "model.embed_tokens.weight", 0), (HEAD, "lm_head.weight", 1)):
        assert new[ms_name].shape == (NEW, 32)
        assert np.array_equal(new[ms_name][:VOCAB], old[ms_name])  # old rows untouched
        assert np.array_equal(hf[hf_name], new[ms_name])            # bit for bit on both sides
        drawn = np.random.default_rng([3, k]).normal(0.0, 0.02, size=(16, 32)).astype(np.float32)
        assert np.array_equal(new[ms_name][VOCAB:], drawn)           # the stated init, reproducible
    assert all(np.array_equal(old[n], new[n]) for n in old if n not in (EMB, HEAD))
    assert load_model_config(run_dir / "ms_r").vocab_size == NEW
    assert json.loads((run_dir / "hf_r" / "config.json").read_text())["vocab_size"] == NEW
    record = json.loads((run_dir / "ms_r" / "conversion.json").read_text())["vocab_resize"]
    assert record[-1]["from"] == VOCAB and record[-1]["to"] == NEW and record[-1]["init"] == "normal"
    assert record[-1]["std"] == 0.02 and record[-1]["seed"] == 3 and record[-1]["tensors"] == [EMB, HEAD]


def test_resized_hf_converts_to_the_same_checkpoint_and_diffs(run_dir):
    convert(run_dir / "hf_r", run_dir / "ms_c")
    assert (run_dir / "ms_c" / "model.ckpt").read_bytes() == (run_dir / "ms_r" / "model.ckpt").read_bytes()
    report = run_diff(run_dir / "hf_r", run_dir / "ms_r")
    assert report.exit_code == 0, report.verdict


@pytest.mark.slow
@pytest.mark.usefixtures("one_torch_thread")
def test_resized_model_trains_like_the_golden(run_dir):
    short = ScheduleConfig(name="cosine", warmup_steps=1, min_lr_rate=0.1)
    cfg = load_cfg(run_dir, hf_model=str(run_dir / "hf_r"), ms_model=str(run_dir / "ms_r"), total_steps=3,
                   schedule=short)
    load_golden().train(cfg, run_dir / "golden_r", log=lambda line: None)
    train(cfg, run_dir / "ms_run_r", progress=False)
    g, m = metrics(run_dir / "golden_r"), metrics(run_dir / "ms_run_r")
    assert [r["step"] for r in m] == [1, 2, 3]
    assert max(rel(a["loss"], b["loss"]) for a, b in zip(g, m, strict=True)) <= 1e-5


def test_mean_init_and_padding_for_tensor_parallel(run_dir):
    resize_vocab(run_dir / "ms", run_dir / "ms_322", to=322)  # not a multiple of mp = 4
    config = load_model_config(run_dir / "ms_322")
    errors = validate(Layout(mp=4), config)
    assert errors == ["vocab_size (322) is not divisible by mp (4): the embedding and lm_head are split over the "
                      "vocabulary; pad it with `migrate vocab resize MS_DIR OUT --pad-to-multiple 4`"]
    result = resize_vocab(run_dir / "ms_322", run_dir / "ms_324", multiple=4)
    assert (result.old, result.new) == (322, 324)
    assert validate(Layout(mp=4), load_model_config(run_dir / "ms_324")) == []
    t = ms_tensors(run_dir / "ms_324")
    for name in (EMB, HEAD):  # mean init: each new row is the mean of the old rows of its tensor
        mean = t[name][:VOCAB].mean(axis=0, dtype=np.float64).astype(np.float32)
        assert np.array_equal(t[name][VOCAB], mean) and np.array_equal(t[name][-1], mean)
    history = json.loads((run_dir / "ms_324" / "conversion.json").read_text())["vocab_resize"]
    assert [(r["from"], r["to"], r["reason"]) for r in history] == [(VOCAB, 322, "--to 322"),
                                                                    (322, 324, "--pad-to-multiple 4")]


@pytest.mark.parametrize("argv, message", [
    (["--pad-to-multiple", "64"], "already has 320 embedding rows: nothing to resize"),
    (["--to", "2"], "cannot trim to 2 rows: model.yaml's"),
    (["--to", "400", "--init", "normal", "--std", "-1"], "argument --std: must be a finite number > 0"),
])
def test_refusals_are_one_line_and_write_nothing(run_dir, tmp_path, capsys, argv, message):
    out = tmp_path / "out"
    assert main(["vocab", "resize", str(run_dir / "ms"), str(out), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not out.exists() and not list(tmp_path.iterdir())


def test_never_in_place(run_dir, capsys):
    assert main(["vocab", "resize", str(run_dir / "ms"), str(run_dir / "ms"), "--to", "400", "--overwrite"]) == 2
    assert "ms" in capsys.readouterr().err
    assert load_model_config(run_dir / "ms").vocab_size == VOCAB
