"""`migrate generate --fused` decodes an unfused Llama-family folder in MindFormers' fused layout
(migrate/models/fused_loading.py): the parameters made while the checkpoint streams in are the very
tensors `convert --qkv-concat` writes, the tokens are the unfused run's, the compile cache keeps the
two layouts apart, and a folder that cannot be fused loads as it is."""
import json

import numpy as np
import pytest

from hf_fixtures import build_hf_model, save_hf_model
from migrate.cli import main
from migrate.convert import convert
from migrate.errors import MigrateError
from migrate.infer.request import Options, _compile_cache_folder
from migrate.models.fused_layout import fused_plans
from migrate.models.fused_loading import load_fused_model
from migrate.models.loading import load_model
from migrate.models.registry import load_model_config

# "bias": GQA with attention and MLP biases (the qkv and gate/up bias rows too); "tied": tied embeddings
VARIANTS = {"gqa": {}, "bias": {}, "tied": {}}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("fused")
    for variant in VARIANTS:
        save_hf_model(build_hf_model(variant, seed=3, initializer_range=0.1), root / variant / "hf")
        convert(root / variant / "hf", root / variant / "ms")
        convert(root / variant / "hf", root / variant / "fused", target="qkv_concat")
    return root


def _arrays(model) -> dict:
    return {p.name: p.asnumpy() for p in model.get_parameters()}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_the_fused_parameters_are_the_ones_convert_writes(folders, variant):
    model, config = load_fused_model(folders / variant / "ms")
    written, written_config = load_model(folders / variant / "fused")
    ours, theirs = _arrays(model), _arrays(written)
    assert config.qkv_concat and sorted(ours) == sorted(theirs)
    assert any("w_qkv" in name for name in ours) and any("w_gate_hidden" in name for name in ours)
    assert all(np.array_equal(ours[name], theirs[name]) for name in ours)


def test_folders_that_cannot_be_fused_load_as_they_are(folders):
    fused = folders / "gqa" / "fused"  # converted to a target already
    assert fused_plans(fused, load_model_config(fused / "model.yaml")) is None
    assert load_fused_model(fused) is None


def test_a_checkpoint_missing_a_tensor_does_not_fit(folders, tmp_path):
    import mindspore as ms

    src = folders / "gqa" / "ms"
    bare = tmp_path / "bare"
    bare.mkdir()
    for f in src.iterdir():
        if f.suffix != ".ckpt":
            (bare / f.name).write_bytes(f.read_bytes())
    params = ms.load_checkpoint(str(src / "model.ckpt"))
    del params["model.layers.1.attention.wk.weight"]
    ms.save_checkpoint([{"name": k, "data": v} for k, v in params.items()], str(bare / "model.ckpt"))
    with pytest.raises(MigrateError, match="does not fit the fused model: 1 parameters not made"):
        load_fused_model(bare)


def test_generate_gives_the_unfused_tokens_and_says_which_layout_ran(folders, capsys):
    ms_dir = folders / "bias" / "ms"
    runs = {}
    for flag in (("--fused",), ()):
        capsys.readouterr()
        assert main(["generate", str(ms_dir), "--ids", "5,9,17,33,3,8", "--max-new-tokens", "16", "--ignore-eos",
                     "--no-stream", *flag]) == 0
        out = capsys.readouterr().out
        runs[flag] = out
    fused, plain = runs[("--fused",)], runs[()]
    assert "KV cache, fused q/k/v and gate/up, GRAPH_MODE" in " ".join(fused.split())
    assert "fused" not in plain
    assert fused.splitlines()[0] == plain.splitlines()[0] and len(fused.splitlines()[0].split()) == 16


def test_the_two_layouts_compile_into_different_cache_folders(folders):
    fields = load_model_config(folders / "gqa" / "ms" / "model.yaml").to_dict()
    options = Options(max_new_tokens=8)
    assert _compile_cache_folder(fields, options, 1, 32, 64, "kv_cache_fused") != \
        _compile_cache_folder(fields, options, 1, 32, 64, "kv_cache")
    assert json.loads((folders / "gqa" / "fused" / "conversion.json").read_text())["keymap"]["target"] == "qkv_concat"
