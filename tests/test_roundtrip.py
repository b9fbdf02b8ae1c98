"""HF -> MindSpore -> HF is bit-identical for every tensor, and the config survives."""

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from hf_fixtures import VARIANTS, build_hf_model, save_hf_model
from migrate.cli import main
from migrate.hf_config import load_hf_config

VOLATILE = {"transformers_version", "_name_or_path"}  # dtype must survive too


def hf_tensors(folder):
    from migrate.checkpoints.hf_reader import open_hf_checkpoint

    with open_hf_checkpoint(folder) as ckpt:
        return {name: ckpt.read(name) for name in ckpt.names()}


@pytest.mark.parametrize("fmt", ["ckpt", "safetensors"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_round_trip_is_bit_identical(tmp_path, variant, fmt):
    dtype = torch.bfloat16 if variant == "bias" else torch.float32  # one bf16 source too
    hf = build_hf_model(variant, seed=6, dtype=dtype)
    src = save_hf_model(hf, tmp_path / "hf", "sharded_safetensors")
    assert main(["convert", str(src), str(tmp_path / "ms"), "--format", fmt]) == 0
    assert main(["export", "--src", "hf_llama", str(tmp_path / "ms"), str(tmp_path / "back")]) == 0

    before, after = hf_tensors(src), hf_tensors(tmp_path / "back")
    assert set(before) == set(after)
    for name, array in before.items():
        assert after[name].dtype == array.dtype, name
        assert np.array_equal(after[name].view(np.uint8), array.view(np.uint8)), name

    cfg_before, cfg_after = load_hf_config(src), load_hf_config(tmp_path / "back")
    for key in VOLATILE:
        cfg_before.pop(key, None), cfg_after.pop(key, None)
    assert cfg_after == cfg_before

    # And HF itself loads the exported folder into an identical model.
    from transformers import LlamaForCausalLM

    reloaded = LlamaForCausalLM.from_pretrained(tmp_path / "back", dtype=dtype).state_dict()
    for name, tensor in hf.state_dict().items():
        assert torch.equal(reloaded[name], tensor), name


def test_export_refuses_a_checkpoint_missing_a_tensor(tmp_path, capsys):
    hf = build_hf_model("mha", seed=7)
    src = save_hf_model(hf, tmp_path / "hf")
    assert main(["convert", str(src), str(tmp_path / "ms"), "--format", "safetensors"]) == 0
    st = load_file(tmp_path / "ms" / "model.safetensors")
    del st["model.norm_out.weight"]
    from safetensors.torch import save_file

    save_file(st, tmp_path / "ms" / "model.safetensors")
    assert main(["export", str(tmp_path / "ms"), str(tmp_path / "back")]) == 2
    assert "missing: model.norm_out.weight" in capsys.readouterr().err
    assert not (tmp_path / "back").exists()
