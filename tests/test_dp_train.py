"""`migrate train --dp 2` for real: msrun starts two CPU workers in DATA_PARALLEL (mccl),
each reading half of every global batch; the curve is the single-process one.

One dp=2 run (micro batch 2 per rank) against one dp=1 run (micro batch 4) of
the tiny Llama, both global batch 8 = 2 micro-batches × 4 rows, fp32, 50
steps; then a dp=1 run resumed from the dp=2 checkpoint of step 25, a merge
of the dp=2 checkpoint, and a run where one worker fails.
"""
import json

import numpy as np
import pytest

from fault_worker import EXIT_ENV as FAULT_ENV
from fault_worker import use_fault_worker
from migrate.cli import main
from migrate.errors import MigrateError
from migrate.models.loading import load_model
from migrate.train.checkpoint.folder import open_checkpoint
from migrate.train.checkpoint.shards import LAYOUT_FILE
from migrate.train.ms_data import micro_batches
from migrate.train.trainer import check_resumable, train
from train_setup import RUN, load_cfg, make_run_dir, metrics, rel

# slow as a whole: its module fixtures build a dp=1/dp=2 pair of trained runs (msrun)
pytestmark = pytest.mark.slow

STEPS = 50
RUN_DP1 = RUN.replace("total_steps: 200", f"total_steps: {STEPS}") + "checkpoint_interval: 25\n"
RUN_DP2 = RUN_DP1.replace("micro_batch_size: 4", "micro_batch_size: 2")
SAME = ("step", "lr", "tokens")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    root = make_run_dir(tmp_path_factory.mktemp("dp"), run_yaml=RUN_DP1)
    (root / "run_dp2.yaml").write_text(RUN_DP2)
    return root


@pytest.fixture(scope="module")
def dp1(run_dir):
    return metrics(train(load_cfg(run_dir), run_dir / "dp1", progress=False, peak_flops=1e12))


@pytest.fixture(scope="module")
def dp2(run_dir):
    out = run_dir / "dp2"
    assert main(["train", "--config", str(run_dir / "run_dp2.yaml"), "--dp", "2", "--out", str(out)]) == 0
    return metrics(out)


def test_dp2_follows_the_single_process_curve(dp1, dp2):
    assert [[r[k] for k in SAME] for r in dp2] == [[r[k] for k in SAME] for r in dp1]
    assert len(dp2) == STEPS and dp2[-1]["tokens"] == STEPS * 8 * 16  # global tokens, logged once
    loss = np.array([rel(a["loss"], b["loss"]) for a, b in zip(dp1, dp2, strict=True)])
    norm = np.array([rel(a["grad_norm"], b["grad_norm"]) for a, b in zip(dp1, dp2, strict=True)])
    print(f"\n[dp=2 vs dp=1, {STEPS} steps fp32] loss rel max {loss.max():.2e} mean {loss.mean():.2e}; "
          f"grad_norm rel max {norm.max():.2e}; loss {dp1[0]['loss']:.4f} -> {dp1[-1]['loss']:.4f}")
    assert loss.max() <= 1e-5
    assert norm.max() <= 1e-5
    assert dp2[-1]["loss"] < dp2[0]["loss"] - 0.5  # it trains


def test_mindspore_data_parallel_engine_and_rank0_writes(dp2, run_dir):
    out = run_dir / "dp2"
    parallel = json.loads((out / "effective_hparams.json").read_text())["parallel"]
    assert parallel["context"] == {"device_num": 2, "parallel_mode": "data_parallel", "gradients_mean": True}
    assert parallel["grad_reducer"] == {"class": "mindspore.nn.wrap.grad_reducer.DistributedGradReducer",
                                        "mean": True, "degree": 2}
    assert parallel["world_size"] == 2 and parallel["global_batch"] == 8
    names = sorted(p.name for p in out.iterdir())
    events = [n for n in names if n.startswith("events.out.tfevents.")]  # TensorBoard's, rank 0's alone
    assert len(events) == 1 and [n for n in names if n not in events] == [
        "checkpoints", "effective_hparams.json", "health.jsonl", "logs", "metrics.jsonl"]
    logs = out / "logs"
    assert {"msrun.log", "scheduler.log", "worker_0.log", "worker_1.log"} <= {p.name for p in logs.iterdir()}
    assert [(logs / f"worker_{r}.exit").read_text().strip() for r in (0, 1)] == ["0", "0"]
    assert "migrate[rank 1]: step 50/50" in (logs / "worker_1.log").read_text()  # rank 1 trained, wrote no file
    layout = json.loads((out / "checkpoints" / "checkpoint-50" / LAYOUT_FILE).read_text())
    assert (layout["dp"], layout["mp"], layout["pp"], layout["world_size"], layout["optimizer_shard"]) == \
        (2, 1, 1, 2, False)
    assert layout["files"]["model.ckpt"] == layout["files"]["optimizer.ckpt"] == {"saved_by": 0, "kind": "whole"}


def test_each_rank_reads_its_share_of_the_global_batch(run_dir):
    one, two = load_cfg(run_dir), load_cfg(run_dir, micro_batch_size=2)
    whole = list(micro_batches(one))
    shares = [list(micro_batches(two, shard=(2, r))) for r in (0, 1)]
    assert len(whole) == len(shares[0]) == len(shares[1]) == STEPS * 2
    for (s, m, rows), (s0, m0, rows0), (s1, m1, rows1) in zip(whole, *shares, strict=True):
        assert (s, m) == (s0, m0) == (s1, m1)
        np.testing.assert_array_equal(np.concatenate([rows0, rows1]), rows[[0, 2, 1, 3]])


def test_resume_from_dp2_into_dp1_continues_the_curve(dp1, dp2, run_dir):
    out = train(load_cfg(run_dir), run_dir / "resumed", progress=False, peak_flops=1e12,
                resume=run_dir / "dp2" / "checkpoints" / "checkpoint-25")
    resumed = metrics(out)
    assert resumed[:25] == dp2[:25]
    assert [[r[k] for k in SAME] for r in resumed] == [[r[k] for k in SAME] for r in dp1]
    after = [max(rel(a["loss"], c["loss"]), rel(b["loss"], c["loss"]))
             for a, b, c in zip(dp1[25:], dp2[25:], resumed[25:], strict=True)]
    print(f"\n[resume dp=2 -> dp=1 at step 25] loss rel max {max(after):.2e} over steps 26..{STEPS}")
    assert max(after) <= 1e-5


def test_resume_with_another_global_batch_is_refused(dp2, run_dir):
    checkpoint = open_checkpoint(run_dir / "dp2")
    with pytest.raises(MigrateError, match="its global batch is 8 samples per step, this run's is global batch 4"):
        check_resumable(checkpoint, load_cfg(run_dir, micro_batch_size=2), ())


def test_ckpt_merge_of_a_dp2_checkpoint(dp2, run_dir, capsys):
    src = run_dir / "dp2" / "checkpoints" / "checkpoint-50"
    out = run_dir / "merged"
    assert main(["ckpt", "merge", str(src), str(out)]) == 0
    assert not (out / LAYOUT_FILE).exists()
    merged, original = open_checkpoint(out), open_checkpoint(src)
    for name, value in original.optimizer_state().items():
        np.testing.assert_array_equal(merged.optimizer_state()[name], value)
    assert merged.state["merged_from"]["layout"]["dp"] == 2
    model, _ = load_model(out)  # still a converted-model folder
    assert model.model.norm_out.weight.shape == (32,)


def test_a_failing_worker_makes_the_run_exit_with_its_code(dp2, run_dir, monkeypatch, capsys):
    use_fault_worker(monkeypatch)               # the test-side worker (tests/fault_worker.py)
    monkeypatch.setenv(FAULT_ENV, "1:3")       # rank 1 exits 3 right after joining the cluster
    monkeypatch.setenv("MS_NODE_TIMEOUT", "5")  # the msrun scheduler's wait for a dead rank (default 30 s)
    code = main(["train", "--config", str(run_dir / "run_dp2.yaml"), "--dp", "2", "--out", str(run_dir / "fail")])
    err = capsys.readouterr().err
    assert code == 3
    assert err.startswith("migrate: error: distributed run failed: rank 1 exited with 3")
    assert (run_dir / "fail" / "logs" / "worker_1.exit").read_text().strip() == "3"
