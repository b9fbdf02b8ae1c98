"""Faults only the backward pass shows (`migrate diff --grads --inject mlp_grad_scale@L`): the forward
is bit-identical, the first gradient divergence is named in layer L, and without --grads the fault is
refused in one line (it would pass unseen)."""
import pytest

from hf_fixtures import build_hf_model, save_hf_model
from migrate.align import run_diff
from migrate.align.model_faults import FAULTS, GRAD_FAULTS
from migrate.cli import main
from migrate.convert import convert


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    root = tmp_path_factory.mktemp("grad_faults")
    save_hf_model(build_hf_model("gqa", seed=11, num_hidden_layers=3), root / "hf")
    convert(root / "hf", root / "ms")
    return root / "hf", root / "ms"


def test_gradient_faults_are_their_own_registry():
    assert set(GRAD_FAULTS).isdisjoint(FAULTS)
    assert all("grads" in f.needs and f.block == "grad" for f in GRAD_FAULTS.values())


@pytest.mark.slow
@pytest.mark.parametrize("layer", [0, 1, 2])
def test_mlp_gradient_scaled_in_one_layer_is_located_there(converted, layer):
    hf_dir, ms_dir = converted
    report = run_diff(hf_dir, ms_dir, grads=True, inject=f"mlp_grad_scale@{layer}")
    assert report.first_divergence is None  # the forward is untouched
    first = report.first_grad_divergence
    assert not report.passed and first is not None
    assert first.kind == "grad" and first.layer == layer and ".feed_forward." in first.name, first.describe()
    # every layer above it (earlier in backward order) agrees
    above = [e for e in report.backward if e.kind == "grad" and e.layer is not None and e.layer > layer]
    assert len(above) == 9 * (2 - layer) and all(e.passed for e in above)


def test_without_grads_the_fault_is_refused_in_one_line(converted, capsys):
    hf_dir, ms_dir = converted
    assert main(["diff", str(hf_dir), str(ms_dir), "--inject", "mlp_grad_scale@1"]) == 2
    err = capsys.readouterr().err
    assert "add --grads" in err and len(err.strip().splitlines()) == 1


def test_listed_with_the_other_faults(capsys):
    assert main(["diff", "--list-faults"]) == 0
    assert "mlp_grad_scale" in capsys.readouterr().out
