"""`migrate train` parallel options: every validation line, the global batch line, the
CPU refusal of SEMI_AUTO_PARALLEL, and the msrun command line of each node.

Nothing here starts a process or opens a connection: the run folder holds only
run.yaml and the model's model.yaml, which is all the checks read.
"""
import pytest

from migrate.cli import main
from migrate.models.config import LlamaConfig
from migrate.parallel.layout import Layout
from migrate.train.launch.cluster import Cluster, cluster_errors
from migrate.train.launch.msrun import (
    RETRY_INTERVAL_ENV,
    as_exit_status,
    free_port,
    local_ranks,
    msrun_command,
    one_node_intervals,
    worker_args,
    worst_exit_code,
)

RUN = """\
ms_model: ms
data: data
seq_length: 16
micro_batch_size: 2
grad_accum_steps: 4
total_steps: 10
"""


@pytest.fixture(scope="module")
def run_yaml(tmp_path_factory):
    root = tmp_path_factory.mktemp("launch")
    # The tiny test Llama's shape: 2 layers, 4 heads, 2 kv heads, vocab 320, ffn 64.
    (root / "ms").mkdir()
    LlamaConfig(vocab_size=320, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                n_kv_heads=2).save(root / "ms" / "model.yaml")
    (root / "run.yaml").write_text(RUN)
    (root / "run_ckpt.yaml").write_text(RUN + "checkpoint_interval: 5\n")
    return root / "run.yaml"


def _train(capsys, run_yaml, *options):
    code = main(["train", "--config", str(run_yaml), *options])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _errors(err: str) -> list[str]:
    lines = err.strip().splitlines()
    assert all(line.startswith("migrate: error: ") for line in lines), err  # one line each, no traceback
    return [line[len("migrate: error: "):] for line in lines]


@pytest.mark.parametrize("options, messages", [
    (["--dp", "0"], ["--dp must be a positive integer, got 0"]),
    (["--micro-batches", "-1"], ["--micro-batches must be a positive integer, got -1"]),
    (["--mp", "3"], [
        "num_heads (4) is not divisible by mp (3): attention heads are split across mp",
        "n_kv_heads (2) and mp (3): kv heads are split when n_kv_heads % mp == 0 "
        "or replicated when mp % n_kv_heads == 0, and neither holds",
        "vocab_size (320) is not divisible by mp (3): the embedding and lm_head are split over the vocabulary; "
        "pad it with `migrate vocab resize MS_DIR OUT --pad-to-multiple 3`",
        "intermediate_size (64) is not divisible by mp (3): gate/up/down projections are split over it"]),
    (["--pp", "3", "--micro-batches", "3"],
     ["num_layers (2) is not divisible by pp (3): every pipeline stage needs the same number of layers"]),
    (["--pp", "2"], ["micro_batches (1) must be >= pp (2) so that every pipeline stage has work"]),
    (["--micro-batches", "4"], ["micro_batches (4) applies only with pp > 1; "
                                "use grad_accum_steps to accumulate without a pipeline"]),
    (["--optimizer-shard"], ["--optimizer-shard needs --dp of at least 2 (it splits the AdamW states over the "
                             "data-parallel ranks), got --dp 1"]),
    (["--dp", "3", "--nodes", "2", "--node-rank", "2"], [
        "dp × mp × pp = 3 ranks cannot be spread evenly over --nodes 2",
        "--node-rank 2 is outside 0..1 for --nodes 2",
        "--nodes 2 needs --master-addr (the address of node 0, reachable from every node)",
        "--nodes 2 needs --master-port (the same free port on every node)"]),
    (["--dp", "2", "--nodes", "0"], ["--nodes must be a positive integer, got 0"]),
    (["--dp", "2", "--master-port", "80"], ["--master-port must be in 1024..65535, got 80"]),
])
def test_every_validation_message(capsys, run_yaml, options, messages):
    code, out, err = _train(capsys, run_yaml, *options)
    assert code == 2
    assert _errors(err) == messages
    assert "global batch" not in out  # refused before anything starts


def test_checkpoints_of_tensor_parallel_runs_are_refused(capsys, run_yaml):
    code, _, err = _train(capsys, run_yaml.with_name("run_ckpt.yaml"), "--mp", "2")
    assert code == 2
    assert _errors(err) == ["checkpoints of tensor/pipeline-parallel runs (--mp 2, --pp 1) are not implemented; "
                            "set checkpoint_interval: 0 or use --dp only"]


@pytest.mark.parametrize("options, asked", [
    (["--mp", "2"], "--mp 2"),
    (["--dp", "2", "--pp", "2", "--micro-batches", "4"], "--pp 2"),
    (["--dp", "2", "--optimizer-shard"], "--optimizer-shard"),
])
def test_semi_auto_parallel_is_refused_on_cpu_after_the_batch_line(capsys, run_yaml, options, asked):
    code, out, err = _train(capsys, run_yaml, *options)
    assert code == 2
    assert _errors(err) == [f"{asked} needs MindSpore's SEMI_AUTO_PARALLEL, which runs only on Ascend/GPU; "
                            f"this MindSpore runs on CPU, where only data parallel (--dp) works"]
    assert out.startswith("global batch ")


def test_global_batch_line():
    assert Layout(dp=2, micro_batch_size=2, grad_accum_steps=4).batch_line(16).startswith(
        "global batch 16 = micro batch 2 × dp 2 × grad accum 4 (256 tokens of 16)")
    assert Layout(dp=2, pp=2, micro_batches=4, micro_batch_size=1, grad_accum_steps=2).global_batch == 16


def test_msrun_command_of_each_node(tmp_path):
    layout = Layout(dp=8, micro_batch_size=2, grad_accum_steps=1)
    args = worker_args(tmp_path / "run.yaml", tmp_path / "out", tmp_path / "out" / "logs", layout)
    commands = [msrun_command(layout.devices, Cluster(2, rank, "10.1.2.3", 8118), 8118, tmp_path / "logs", args)
                for rank in (0, 1)]
    for rank, cmd in enumerate(commands):
        start = next(i for i, a in enumerate(cmd) if a.startswith("--"))
        flags = cmd[start:cmd.index("python")]
        assert flags == ["--worker_num=8", "--local_worker_num=4", f"--node_rank={rank}", "--master_addr=10.1.2.3",
                         "--master_port=8118", f"--log_dir={tmp_path / 'logs'}", "--join=True"]
        assert cmd[0].endswith("msrun") or cmd[1:3] == ["-m", "mindspore.parallel.cluster.run"]
        worker = cmd[cmd.index("python"):]
        assert worker[:3] == ["python", "-m", "migrate.train.launch.worker"]
        assert worker[worker.index("--dp") + 1] == "8" and worker[worker.index("--config") + 1].endswith("run.yaml")
    assert local_ranks(8, Cluster(2, 1, "10.1.2.3", 8118)) == [4, 5, 6, 7]


def test_single_node_defaults_to_loopback_and_a_free_port(tmp_path):
    layout = Layout(dp=2)
    port = free_port()
    assert 1024 <= port <= 65535
    cmd = msrun_command(2, Cluster(), port, tmp_path, worker_args(tmp_path / "r.yaml", tmp_path, tmp_path, layout,
                                                                  resume=tmp_path / "ck"))
    assert "--master_addr=127.0.0.1" in cmd and f"--master_port={port}" in cmd and "--node_rank=0" in cmd
    assert "--local_worker_num=2" in cmd and cmd[cmd.index("--resume") + 1] == str(tmp_path / "ck")
    assert cluster_errors(Cluster(), 2) == []


def test_worst_exit_code():
    assert worst_exit_code([0, 0]) == 0
    assert worst_exit_code([0, 3, 1]) == 3
    assert worst_exit_code([1, -9]) == 137  # killed by SIGKILL, as a shell reports it
    assert as_exit_status(-15) == 143 and worst_exit_code([]) == 0


def test_a_one_machine_job_sends_its_cluster_messages_every_second_unless_told(monkeypatch):
    for name in RETRY_INTERVAL_ENV:
        monkeypatch.delenv(name, raising=False)
    assert one_node_intervals() == {"MS_RETRY_INTERVAL_LOWER": "1", "MS_RETRY_INTERVAL_UPPER": "1"}
    monkeypatch.setenv("MS_RETRY_INTERVAL_UPPER", "7")  # the user's choice stands, and its pair is MindSpore's
    assert one_node_intervals() == {}
