"""The model-class trust opt-in is an argument, never process state: `check_model_class` decides
from the registry, `allow_model_class` and its `trust` argument alone; only entry points read
MIGRATE_TRUST_MODEL_CLASS (the `migrate` command, msrun's worker); the launcher hands the opt-in
to its workers through the environment it builds for them, and no command writes os.environ.

Nothing here starts a process: msrun's Popen and the worker's run are replaced where they would.
"""
import os
import sys

import pytest

from migrate.errors import MigrateError
from migrate.models.config import LlamaConfig
from migrate.models.registry import TRUST_ENV, check_model_class, load_model_config, model_class, trust_from_env
from migrate.parallel.layout import Layout
from migrate.train.launch import msrun, worker
from migrate.train.launch.cluster import Cluster


@pytest.fixture(autouse=True)
def _untrusted(monkeypatch):
    monkeypatch.delenv(TRUST_ENV, raising=False)


def test_the_environment_does_not_opt_a_library_call_in(monkeypatch, tmp_path):
    monkeypatch.setenv(TRUST_ENV, "1")
    sys.modules.pop("this", None)
    for call in (lambda: check_model_class("this:s"), lambda: model_class("this:s")):
        with pytest.raises(MigrateError, match="refusing to import model class 'this:s'"):
            call()
    folder = tmp_path / "ms"
    folder.mkdir()
    LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_layers=1, num_heads=2,
                n_kv_heads=2).save(folder / "model.yaml")
    text = (folder / "model.yaml").read_text()
    (folder / "model.yaml").write_text(text + "model_class: this:s\n")
    with pytest.raises(MigrateError, match="refusing to import model class 'this:s'"):
        load_model_config(folder)
    assert "this" not in sys.modules  # the module never ran
    # The caller's argument is what opts in (checked only: nothing is imported by the check).
    assert check_model_class("this:s", trust=True) == "this:s"
    assert "this" not in sys.modules


@pytest.mark.parametrize("value, trusted", [("1", True), ("true", True), ("YES", True), ("", False),
                                            ("0", False), ("false", False), ("no", False), (None, False)])
def test_an_entry_point_reads_the_variable(value, trusted):
    assert trust_from_env({} if value is None else {TRUST_ENV: value}) is trusted


def test_the_workers_environment_carries_the_opt_in_exactly_when_given(monkeypatch, tmp_path):
    env = msrun.worker_env(tmp_path, {"EXTRA": "x"}, trust=True)
    assert env[TRUST_ENV] == "1" and env["EXTRA"] == "x"
    assert TRUST_ENV not in os.environ  # built for the child; this process's environment is left alone
    assert TRUST_ENV not in msrun.worker_env(tmp_path)
    # A variable left in the launcher's own environment is not what the workers trust: its argument is.
    monkeypatch.setenv(TRUST_ENV, "1")
    assert TRUST_ENV not in msrun.worker_env(tmp_path, trust=False)
    assert TRUST_ENV not in msrun.worker_env(tmp_path, {TRUST_ENV: "1"}, trust=False)


class _Started(Exception):
    """Raised by the fake Popen: msrun would have started here."""


def test_launch_hands_msrun_the_environment_it_built(monkeypatch, tmp_path):
    seen = {}

    def popen(command, **kwargs):
        seen.update(command=command, env=kwargs["env"])
        raise _Started

    monkeypatch.setattr(msrun.subprocess, "Popen", popen)
    for trust in (True, False):
        with pytest.raises(_Started):
            msrun.launch(tmp_path / "run.yaml", tmp_path / "out", Layout(dp=2), Cluster(), trust=trust)
        assert (seen["env"].get(TRUST_ENV) == "1") is trust
        assert seen["command"][seen["command"].index("python"):][:3] == ["python", "-m", msrun.WORKER_MODULE]


@pytest.mark.parametrize("value, trusted", [("1", True), (None, False)])
def test_the_worker_reads_the_opt_in_once_and_passes_it_down(monkeypatch, tmp_path, value, trusted):
    if value is not None:
        monkeypatch.setenv(TRUST_ENV, value)
    monkeypatch.delenv("RANK_ID", raising=False)
    seen = []
    monkeypatch.setattr(worker, "_run", lambda args, *, trust: seen.append(trust) or 0)
    assert worker.main(["--config", str(tmp_path / "run.yaml"), "--out", str(tmp_path / "out"),
                        "--log-dir", str(tmp_path / "logs")]) == 0
    assert seen == [trusted]


RUN = "ms_model: ms\ndata: data\nseq_length: 16\nmicro_batch_size: 2\ntotal_steps: 10\n"


@pytest.mark.parametrize("how", ["flag", "environment", "neither"])
def test_migrate_train_hands_its_opt_in_to_the_launcher(monkeypatch, tmp_path, capsys, how):
    from migrate.cli import main
    from migrate.train import run

    (tmp_path / "ms").mkdir()
    LlamaConfig(vocab_size=320, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                n_kv_heads=2).save(tmp_path / "ms" / "model.yaml")
    (tmp_path / "run.yaml").write_text(RUN)
    seen = {}

    def launch(*args, trust=False, **kwargs):
        seen["trust"] = trust
        return msrun.LaunchResult(0, {}, 0, tmp_path / "logs")

    monkeypatch.setattr(run, "launch", launch)
    monkeypatch.chdir(tmp_path)
    argv = ["train", "--config", str(tmp_path / "run.yaml"), "--dp", "2"]
    if how == "flag":
        argv.append("--trust-model-class")
    if how == "environment":
        monkeypatch.setenv(TRUST_ENV, "1")
    assert main(argv) == 0, capsys.readouterr().err
    assert seen == {"trust": how != "neither"}
    assert os.environ.get(TRUST_ENV) == ("1" if how == "environment" else None)  # the command wrote nothing
