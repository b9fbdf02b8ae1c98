"""A run trains on step graphs compiled for an earlier one only where that changes nothing
(`migrate.train.step.reuse`): a second run in a process that keeps compiled steps, and a fault
starting mid-run that changes graph inputs only, train on the graphs already compiled, and their
metrics, checkpoints and read-back hyperparameters are bit for bit those of a fresh build; a run
whose graphs bake in something else, one that is still training, and one with dropout get graphs
of their own.
"""
import dataclasses
import json

import numpy as np
import pytest

from migrate.models.mode import execution_mode
from migrate.train import trainer
from migrate.train.building import build_training
from migrate.train.checkpoint.folder import open_checkpoint
from migrate.train.config import RunConfig
from migrate.train.step import reuse
from migrate.train.step.optimizer import step_graphs
from train_setup import make_run_dir, metrics

RUN = """\
hf_model: hf
ms_model: ms
data: data
seq_length: 16
micro_batch_size: 4
grad_accum_steps: 2
total_steps: 4
max_grad_norm: 0.5
data_seed: 5
checkpoint_interval: 4
reference: off
tensorboard: false
peak_flops: 1.0e12
optimizer: {lr: 1e-2, weight_decay: 0.5}
schedule: {name: cosine, warmup_steps: 2, min_lr_rate: 0.1}
out_dir: {golden: golden, ms: ms_out}
"""
WALL_CLOCK = ("time", "tokens_per_s", "mfu")  # left out of the comparison: they differ run to run

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return make_run_dir(tmp_path_factory.mktemp("reuse"), variant="bias", run_yaml=RUN)


@pytest.fixture
def spy(monkeypatch):
    """Every (training, graphs) pair a recipe trains with, in order."""
    pairs = []
    adopt = trainer.MindSporeRecipe._adopt

    def recording(self, training, held=None):
        pair = adopt(self, training, held)
        pairs.append(pair)
        return pair

    monkeypatch.setattr(trainer.MindSporeRecipe, "_adopt", recording)
    return pairs


def run(root, out, faults=(), **changes):
    cfg = RunConfig.load(root / "run.yaml")
    if "optimizer" in changes:
        changes["optimizer"] = dataclasses.replace(cfg.optimizer, **changes["optimizer"])
    cfg = cfg.replace(**changes) if changes else cfg
    return trainer.train(cfg, root / out, faults=faults, progress=False)


def fresh_run(root, out, faults=(), **changes):
    """The run built and compiled on its own: nothing reused, whatever the process keeps."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(reuse, "signature", lambda training, graphs: None)
        return run(root, out, faults, **changes)


def outcome(out) -> tuple:
    """What a run leaves: metrics without timings, the read-back hyperparameters, the last checkpoint."""
    records = [{k: v for k, v in record.items() if k not in WALL_CLOCK} for record in metrics(out)]
    hparams = json.loads((out / "effective_hparams.json").read_text())
    hparams.pop("peak_flops_source", None)
    checkpoint = open_checkpoint(out / "checkpoints" / "latest")
    arrays = {**checkpoint.parameters(), **checkpoint.optimizer_state()}
    return records, hparams, {k: np.asarray(v) for k, v in arrays.items()}


def assert_same(a, b):
    assert a[0] == b[0]
    assert a[1] == b[1]
    assert a[2].keys() == b[2].keys()
    for name in a[2]:
        assert np.array_equal(a[2][name], b[2][name]), name


def test_a_second_run_and_its_fault_from_step_3_train_on_the_first_runs_graphs_as_a_fresh_build_would(root, spy):
    """The second run's setup takes the first run's graphs (other eps, lr, data order and step count:
    inputs and host values), its beta2 from step 3 keeps them, and every number is a fresh build's."""
    second = dict(faults=["beta2@3"], optimizer={"lr": 3e-3, "weight_decay": 0.5}, data_seed=7)
    fresh = outcome(fresh_run(root, "fresh", **second))
    assert spy[1][1] is not spy[0][1]  # nothing reused: the fault's objects compiled their own
    with reuse.keep_compiled_steps():
        run(root, "kept_a", faults=["adam_eps"], total_steps=3)
        run(root, "kept_b", **second)
    first, setup, from_3 = spy[2:5]
    assert setup[1] is first[1] and setup[0].model is first[0].model  # the same compiled graphs
    assert from_3[1] is first[1]
    assert_same(outcome(root / "kept_b"), fresh)


def test_graphs_that_bake_in_something_else_get_their_own(root, spy):
    with reuse.keep_compiled_steps():
        run(root, "a")
        run(root, "b", optimizer={"lr": 1e-2, "weight_decay": 0.0})  # no decayed group: another graph
        run(root, "c", faults=["decay_biases@3"])  # biases and norms join the decayed group at step 3
    a, b, c_setup, c_from_3 = spy
    assert b[1] is not a[1]
    assert c_setup[1] is a[1]
    assert c_from_3[1] is not a[1]


def test_a_graph_with_dropout_is_never_reused(root):
    """Its random state would go on from the last run instead of starting at the run's seed."""
    cfg = RunConfig.load(root / "run.yaml")
    training = build_training(cfg)
    graphs = step_graphs(training)
    assert reuse.signature(training, graphs) is not None
    assert reuse.signature(build_training(cfg.replace(dropout=0.1)), graphs) is None


def test_a_run_still_training_keeps_its_graphs_to_itself(root, spy):
    with reuse.keep_compiled_steps():
        run(root, "done")
        with execution_mode("graph"):
            first = trainer.MindSporeRecipe(RunConfig.load(root / "run.yaml"), root / "busy_a")
            first.setup()  # set up, not trained to its end: busy
        run(root, "busy_b")
    assert spy[1][1] is spy[0][1]
    assert spy[2][1] is not spy[1][1]


def test_the_process_keeps_the_last_runs_it_was_asked_to(monkeypatch):
    monkeypatch.setattr(reuse, "_kept", type(reuse._kept)())
    monkeypatch.setattr(reuse, "_keeping", False)
    with reuse.keep_compiled_steps(runs=2):
        for sig in ("a", "b", "c"):
            reuse._keep(sig, object(), object())
        assert list(reuse._kept) == ["b", "c"]  # least recently used first out
        with reuse.keep_compiled_steps(runs=3):
            reuse._keep("d", object(), object())
            assert list(reuse._kept) == ["b", "c", "d"]
        reuse._keep("e", object(), object())
        assert list(reuse._kept) == ["d", "e"]  # the outer limit again
    assert not reuse._kept
