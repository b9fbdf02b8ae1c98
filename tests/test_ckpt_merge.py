"""Distributed checkpoints: per-rank optimizer shards with a layout file, stitched back on
resume and merged by `migrate ckpt merge`.

Optimizer sharding only runs on Ascend/GPU, so the ranks are simulated here:
each writes its shard file the way the trainer's `_save` does, then "rank 0"
assembles the folder. The data-parallel checkpoint of a real `--dp 2` run is
merged in tests/test_dp_train.py.
"""
import json

import mindspore as ms
import numpy as np
import pytest

from migrate.cli import main
from migrate.errors import MigrateError
from migrate.models.config import LlamaConfig
from migrate.models.llama import LlamaForCausalLM
from migrate.parallel.layout import Layout
from migrate.train.checkpoint.folder import (
    OPTIMIZER_FILE,
    merge_checkpoint,
    open_checkpoint,
    save_checkpoint,
    shard_staging_dir,
)
from migrate.train.checkpoint.shards import LAYOUT_FILE, layout_record, shard_file, slice_table, write_optimizer_shard
from migrate.train.optim import AdamW

DP = 2


def _model_and_optimizer():
    # vocab 33 (odd): the embedding's and lm_head's moments cannot split over 2 ranks and stay whole on rank 0.
    config = LlamaConfig(vocab_size=33, hidden_size=16, intermediate_size=32, num_layers=1, num_heads=2,
                         n_kv_heads=1)
    model = LlamaForCausalLM(config, seed=1)
    optimizer = AdamW([{"params": list(model.trainable_params()), "weight_decay": 0.0}], lr=1e-3)
    rng = np.random.default_rng(0)
    for p in (*optimizer.exp_avg, *optimizer.exp_avg_sq):
        p.set_data(ms.Tensor(rng.standard_normal(p.shape).astype(np.float32)))
    optimizer.step_count = 7
    return model, config, optimizer


def _sharded_checkpoint(run_dir):
    """What a dp=2 optimizer-sharded run writes at step 7."""
    model, config, optimizer = _model_and_optimizer()
    moments = {p.name: p.asnumpy() for p in (*optimizer.exp_avg, *optimizer.exp_avg_sq)}
    shapes = {name: value.shape for name, value in moments.items()}
    staging = shard_staging_dir(run_dir, 7)
    table = slice_table(shapes, DP)
    for rank in range(DP):  # each rank holds only its block, as MindSpore's parallel optimizer keeps it
        local = {n: (v[slice(*table[n]["rows"][str(rank)])] if str(rank) in table[n]["rows"] else None)
                 for n, v in moments.items()}
        write_optimizer_shard(staging, rank, DP, {n: v for n, v in local.items() if v is not None}, shapes)
    record = {**layout_record(Layout(dp=DP, optimizer_shard=True, micro_batch_size=2, grad_accum_steps=1)),
              "optimizer_slices": table}
    state = {"step": 7, "scheduler_step": 7, "tokens": 0, "elapsed": 1.0, "loss_scale": None, "rng": {"x": 1},
             "config": {}, "parallel": {"global_batch": 4}}
    folder = save_checkpoint(run_dir, 7, model=model, model_config=config, optimizer=optimizer, state=state,
                             metrics_text="", parallel_layout=record, shard_staging=staging)
    return folder, moments, table


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    return _sharded_checkpoint(tmp_path_factory.mktemp("sharded"))


def test_each_rank_saves_its_block_and_the_layout_says_so(sharded):
    folder, moments, table = sharded
    names = {p.name for p in folder.iterdir()}
    assert {shard_file(0), shard_file(1), LAYOUT_FILE, "model.ckpt"} <= names and OPTIMIZER_FILE not in names
    assert not list(folder.parent.glob(".*"))  # the staging folder is gone, nothing half-written left
    layout = json.loads((folder / LAYOUT_FILE).read_text())
    assert layout["dp"] == 2 and layout["optimizer_shard"] is True
    assert layout["files"][shard_file(1)] == {"saved_by": 1, "kind": "optimizer shard"}
    assert layout["files"]["model.ckpt"] == {"saved_by": 0, "kind": "whole"}
    wq = "adam_m.model.layers.0.attention.wq.weight"
    assert layout["optimizer_slices"][wq]["rows"] == {"0": [0, 8], "1": [8, 16]}
    emb = "adam_v.model.tok_embeddings.embedding_weight"
    assert layout["optimizer_slices"][emb]["rows"] == {"0": [0, 33]}  # 33 rows do not split in two
    rank1 = ms.load_checkpoint(str(folder / shard_file(1)))
    assert emb not in rank1 and rank1[wq].shape == (8, 16)


def test_resume_stitches_the_shards(sharded):
    folder, moments, _ = sharded
    state = open_checkpoint(folder).optimizer_state()
    assert int(state.pop("step")) == 7
    assert state.keys() == moments.keys()
    for name, value in moments.items():
        np.testing.assert_array_equal(state[name], value)


def test_ckpt_merge_writes_one_single_process_checkpoint(sharded, tmp_path, capsys):
    folder, moments, _ = sharded
    out = tmp_path / "merged"
    assert main(["ckpt", "merge", str(folder), str(out)]) == 0
    assert "merged" in capsys.readouterr().out
    names = {p.name for p in out.iterdir()}
    assert OPTIMIZER_FILE in names and LAYOUT_FILE not in names
    assert not any(n.startswith("optimizer.rank") for n in names)
    merged = ms.load_checkpoint(str(out / OPTIMIZER_FILE))
    for name, value in moments.items():
        np.testing.assert_array_equal(merged[name].asnumpy(), value)
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["merged_from"]["layout"]["dp"] == 2 and state["step"] == 7
    again = open_checkpoint(out)
    assert again.parallel_layout is None and again.step == 7
    # The output exists now: refused without --overwrite, one line.
    assert main(["ckpt", "merge", str(folder), str(out)]) == 2
    assert capsys.readouterr().err.strip() == f"migrate: error: output {out} already exists (pass --overwrite to " \
                                              f"replace it)"
    assert main(["ckpt", "merge", str(folder), str(out), "--overwrite"]) == 0


def test_a_missing_shard_is_one_clear_error(tmp_path):
    folder, _, _ = _sharded_checkpoint(tmp_path / "run")
    (folder / shard_file(1)).unlink()
    # The checkpoint's manifest names it first (tests/test_ckpt_integrity.py covers the layout's own check).
    with pytest.raises(MigrateError, match=f"is damaged: {shard_file(1)} missing"):
        open_checkpoint(folder).optimizer_state()
    with pytest.raises(MigrateError, match=f"{shard_file(1)} missing"):
        merge_checkpoint(folder, tmp_path / "out")
    assert not (tmp_path / "out").exists()  # nothing half-written under the output name


def test_merge_of_something_else_is_refused(tmp_path, capsys):
    (tmp_path / "other").mkdir()  # beside the output: an output inside its input is refused first
    assert main(["ckpt", "merge", str(tmp_path / "other"), str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.startswith("migrate: error: no training checkpoint at")
