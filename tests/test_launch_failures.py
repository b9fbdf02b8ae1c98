"""A `--dp 2` worker that dies without a word (SIGKILL: the OOM killer, a kill -9) is named
by `migrate train`: its rank, its signal and its last log line, and every rank's
worker_<rank>.exit file is written.

One real run through msrun on CPU (tiny Llama, 6 steps, rank 1 SIGKILLs itself after
step 2), and the launcher's reading of msrun's log checked on hand-made log folders.
"""
import signal

import pytest

from fault_worker import KILL_ENV, use_fault_worker
from migrate.cli import main
from migrate.train.launch.msrun import MSRUN_LOG, _outcome
from migrate.train.launch.worker_files import exit_file, pid_file
from train_setup import RUN, make_run_dir

DP_RUN = (RUN.replace("total_steps: 200", "total_steps: 6").replace("warmup_steps: 20", "warmup_steps: 2")
          .replace("micro_batch_size: 4", "micro_batch_size: 2"))


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return make_run_dir(tmp_path_factory.mktemp("dp_kill"), run_yaml=DP_RUN)


@pytest.mark.slow
def test_a_sigkilled_worker_is_named_with_its_signal_and_last_line(run_dir, monkeypatch, capsys):
    use_fault_worker(monkeypatch)                # the test-side worker (tests/fault_worker.py)
    monkeypatch.setenv(KILL_ENV, "1:2")         # rank 1 SIGKILLs itself right after logging step 2
    monkeypatch.setenv("MS_NODE_TIMEOUT", "5")  # msrun's scheduler waits this long for the dead rank (default 30)
    out = run_dir / "killed"
    code = main(["train", "--config", str(run_dir / "run.yaml"), "--dp", "2", "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert code == 128 + signal.SIGKILL
    assert len(err.splitlines()) == 1, err
    assert err.startswith("migrate: error: distributed run failed: rank 1 was killed by SIGKILL (exit 137); "
                          "last log line: migrate[rank 1]: step 2/6 loss "), err
    assert err.endswith(f"; msrun then stopped rank 0 (logs in {out / 'logs'})"), err
    logs = out / "logs"
    assert [exit_file(logs, r).read_text().strip() for r in (0, 1)] == ["137", "137"]
    assert "Error code: -9" in (logs / MSRUN_LOG).read_text()  # what msrun itself said: a pid and -9


def _logs(tmp_path, pids, exits=(), msrun=""):
    for rank, pid in pids.items():
        pid_file(tmp_path, rank).write_text(f"{pid}\n")
        (tmp_path / f"worker_{rank}.log").write_text(f"migrate[rank {rank}]: step 3/9 loss 1.5\n[ERROR] noise\n")
    for rank, code in dict(exits).items():
        exit_file(tmp_path, rank).write_text(f"{code}\n")
    (tmp_path / MSRUN_LOG).write_text(msrun)
    return tmp_path


def _msrun_line(pid, code):
    return (f"[ERROR] ME(1:2,MainProcess):2026 [mindspore/parallel/cluster/process_entity/_api.py:365] "
            f"Worker process {pid} exit with exception. Error code: {code}.\n")


def test_the_first_rank_msrun_saw_die_sets_the_code(tmp_path):
    logs = _logs(tmp_path, {0: 100, 1: 101, 2: 102, 3: 103}, msrun=_msrun_line(102, -11))
    result = _outcome(logs, [0, 1, 2, 3], 1, [])
    assert result.code == 139 and result.first_failed == 2
    assert result.summary() == (f"rank 2 was killed by SIGSEGV (exit 139); last log line: migrate[rank 2]: step 3/9 "
                                f"loss 1.5; msrun then stopped ranks 0, 1, 3 (logs in {logs})")
    assert [exit_file(logs, r).read_text() for r in range(4)] == ["137\n", "137\n", "139\n", "137\n"]


def test_a_worker_that_exited_by_itself_keeps_its_own_code_and_error_line(tmp_path):
    logs = _logs(tmp_path, {0: 100, 1: 101}, exits={1: 2}, msrun=_msrun_line(101, 2))
    (logs / "worker_1.log").write_text("migrate: error: cannot resume from x: seed differs\n")
    result = _outcome(logs, [0, 1], 1, [])
    assert result.code == 2
    assert result.summary() == f"rank 1 exited with 2: cannot resume from x: seed differs; msrun then stopped rank 0 " \
                               f"(logs in {logs})"
    assert exit_file(logs, 1).read_text() == "2\n"  # the worker's own file is left as it wrote it


def test_a_dead_worker_without_a_pid_file_is_still_reported(tmp_path):
    logs = _logs(tmp_path, {0: 100}, msrun=_msrun_line(555, -9))
    result = _outcome(logs, [0, 1], 1, [])
    assert result.code == 137
    assert result.summary() == f"a worker (pid 555) was killed by SIGKILL (exit 137) (logs in {logs})"
    assert not exit_file(logs, 1).exists()  # which rank it was is unknown: nothing is written in its name


def test_a_clean_run_reports_nothing(tmp_path):
    logs = _logs(tmp_path, {0: 100, 1: 101}, exits={0: 0, 1: 0})
    result = _outcome(logs, [0, 1], 0, [])
    assert result.code == 0 and result.failed_ranks() == [] and result.causes == {}
