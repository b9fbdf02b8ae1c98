"""`migrate inspect` lists names, dtypes and shapes without loading tensor data."""
from hf_fixtures import build_hf_model, save_hf_model
from migrate.cli import main
from migrate.convert import convert


def test_inspect_converted_checkpoint_and_hf_folder(tmp_path, capsys):
    hf = build_hf_model("tied", seed=13)
    save_hf_model(hf, tmp_path / "hf", "sharded_safetensors")
    convert(tmp_path / "hf", tmp_path / "ms")
    capsys.readouterr()
    assert main(["inspect", str(tmp_path / "ms" / "model.ckpt")]) == 0
    out = capsys.readouterr().out
    assert "model.layers.1.attention.wk.weight" in out and "16×32" in out
    total = sum(p.numel() for p in hf.parameters())  # tied head counted once
    assert f"20 tensors, {total:,} parameters" in out

    assert main(["inspect", str(tmp_path / "hf")]) == 0
    out = capsys.readouterr().out
    assert "model.layers.0.self_attn.q_proj.weight" in out and "20 tensors" in out


def test_inspect_missing_path_is_an_error(tmp_path, capsys):
    assert main(["inspect", str(tmp_path / "nope.ckpt")]) == 2
    assert "checkpoint not found" in capsys.readouterr().err
