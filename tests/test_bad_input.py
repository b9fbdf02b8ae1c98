"""Bad input: one clear line on stderr, exit code 2, nothing left behind."""
import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from hf_fixtures import build_hf_model, save_hf_model
from migrate.cli import main


@pytest.fixture(scope="module")
def good_model():
    return build_hf_model("gqa", seed=5)


def run_cli(capsys, *argv):
    capsys.readouterr()  # drop what building the fixture printed
    code = main(list(map(str, argv)))
    err = capsys.readouterr().err.strip()
    return code, err


def assert_refused(capsys, tmp_path, src, pattern):
    out = tmp_path / "out" / "ms"
    code, err = run_cli(capsys, "convert", "--src", "hf_llama", src, out)
    assert code == 2
    assert len(err.splitlines()) == 1, err
    assert err.startswith("migrate: error: ")
    assert pattern in err, err
    assert not out.exists()
    leftovers = list((tmp_path / "out").iterdir()) if (tmp_path / "out").exists() else []
    assert leftovers == []
    return err


class Evil:
    pass


def test_missing_folder(capsys, tmp_path):
    assert_refused(capsys, tmp_path, tmp_path / "nope", "model folder not found")


def test_missing_shard(capsys, tmp_path, good_model):
    src = save_hf_model(good_model, tmp_path / "hf", "sharded_safetensors")
    shard = sorted(src.glob("model-*.safetensors"))[1]
    shard.unlink()
    assert_refused(capsys, tmp_path, src, f"missing shard {shard.name}")


def test_index_escaping_the_folder(capsys, tmp_path, good_model):
    src = save_hf_model(good_model, tmp_path / "hf", "sharded_safetensors")
    index_path = src / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    name = next(iter(index["weight_map"]))
    (tmp_path / "outside.safetensors").write_bytes(b"")
    index["weight_map"][name] = "../outside.safetensors"
    index_path.write_text(json.dumps(index))
    assert_refused(capsys, tmp_path, src, "outside the model folder: ../outside.safetensors")


def test_truncated_safetensors(capsys, tmp_path, good_model):
    src = save_hf_model(good_model, tmp_path / "hf")
    data = (src / "model.safetensors").read_bytes()
    (src / "model.safetensors").write_bytes(data[: len(data) - 1000])
    assert_refused(capsys, tmp_path, src, "corrupt safetensors file model.safetensors")


def test_garbage_safetensors(capsys, tmp_path, good_model):
    src = save_hf_model(good_model, tmp_path / "hf")
    (src / "model.safetensors").write_bytes(b"\xff" * 64)
    assert_refused(capsys, tmp_path, src, "corrupt safetensors file model.safetensors")


def test_bin_with_pickled_objects(capsys, tmp_path, good_model):
    src = save_hf_model(good_model, tmp_path / "hf", "bin")
    torch.save({"model.embed_tokens.weight": Evil()}, src / "pytorch_model.bin")
    assert_refused(capsys, tmp_path, src, "pickled objects other than tensors")


def test_bin_holding_a_list(capsys, tmp_path, good_model):
    src = save_hf_model(good_model, tmp_path / "hf", "bin")
    torch.save([torch.zeros(2)], src / "pytorch_model.bin")
    assert_refused(capsys, tmp_path, src, "holds a list, not a mapping of tensors")


def test_unknown_architecture(capsys, tmp_path, good_model):
    src = save_hf_model(good_model, tmp_path / "hf")
    cfg = json.loads((src / "config.json").read_text())
    cfg.update(model_type="gpt2", architectures=["GPT2LMHeadModel"])
    (src / "config.json").write_text(json.dumps(cfg))
    assert_refused(capsys, tmp_path, src, "does not know architecture 'GPT2LMHeadModel'")


def test_config_disagreeing_with_weights(capsys, tmp_path, good_model):
    src = save_hf_model(good_model, tmp_path / "hf")
    cfg = json.loads((src / "config.json").read_text())
    cfg["intermediate_size"] = 96
    (src / "config.json").write_text(json.dumps(cfg))
    err = assert_refused(capsys, tmp_path, src, "mis-shaped")
    assert "model.layers.0.mlp.gate_proj.weight [64, 32] vs model model.layers.0.feed_forward.w1.weight [96, 32]" in err


def test_missing_and_unexpected_tensors_are_named(capsys, tmp_path, good_model):
    src = save_hf_model(good_model, tmp_path / "hf")
    state = load_file(src / "model.safetensors")
    del state["model.layers.1.mlp.up_proj.weight"]
    state["model.layers.0.extra.weight"] = torch.zeros(3)
    save_file(state, src / "model.safetensors", metadata={"format": "pt"})
    err = assert_refused(capsys, tmp_path, src, "coverage check failed")
    assert "1 missing: model.layers.1.mlp.up_proj.weight" in err
    assert "1 unexpected: model.layers.0.extra.weight" in err


def test_existing_output_is_not_touched(capsys, tmp_path, good_model):
    src = save_hf_model(good_model, tmp_path / "hf")
    out = tmp_path / "ms"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    code, err = run_cli(capsys, "convert", src, out)
    assert code == 2 and "already exists" in err
    assert (out / "keep.txt").read_text() == "mine"


def test_cli_subprocess_prints_no_traceback(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "migrate", "convert", str(tmp_path / "nope"), str(tmp_path / "o")],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("migrate: error: model folder not found")
