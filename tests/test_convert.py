"""`migrate convert`: every variant from every layout, strict coverage,
bit-exact weights, and the converted model matches HF's own model."""
import hashlib
import json

import mindspore as ms
import numpy as np
import pytest

from hf_fixtures import LAYOUTS, VARIANTS, build_hf_model, save_hf_model
from migrate.checkpoints.dtypes import torch_to_numpy
from migrate.convert import convert
from migrate.keymap import Keymap
from migrate.models.loading import load_checkpoint_dict, load_model
from ms_helpers import compare, seeded_batch


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_convert_is_bit_exact_and_loads(tmp_path, variant, layout):
    hf = build_hf_model(variant, seed=1)
    src = save_hf_model(hf, tmp_path / "hf", layout)
    result = convert(src, tmp_path / "ms", hash_sources=True)
    assert (tmp_path / "ms" / "model.ckpt").is_file()
    assert (tmp_path / "ms" / "model.yaml").is_file()

    km = Keymap.load("hf_llama")
    pairs, tied = km.pairs(result.config.to_dict())
    saved = load_checkpoint_dict(tmp_path / "ms")
    state = hf.state_dict()
    assert set(saved) == {p.dst for p in pairs}
    for pair in pairs:
        assert np.array_equal(saved[pair.dst].asnumpy(), torch_to_numpy(state[pair.src])), pair
    load_model(tmp_path / "ms")  # raises on any missing or unexpected parameter

    manifest = json.loads((tmp_path / "ms" / "conversion.json").read_text())
    assert manifest["keymap"]["name"] == "hf_llama"
    assert len(manifest["tensors"]) == len(pairs)
    weights = {f.name for f in src.iterdir() if f.suffix in (".bin", ".safetensors")}
    assert weights | {"config.json"} <= {s["file"] for s in manifest["sources"]}
    for source in manifest["sources"]:
        assert source["sha256"] == hashlib.sha256((src / source["file"]).read_bytes()).hexdigest()
    assert [t["source"] for t in manifest["tied"]] == [t.src for t in tied]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["pynative", "graph"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_converted_model_matches_hf(tmp_path, variant, mode):
    hf = build_hf_model(variant, seed=2)
    src = save_hf_model(hf, tmp_path / "hf", "safetensors")
    convert(src, tmp_path / "ms")
    ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE)
    model, _ = load_model(tmp_path / "ms")
    max_abs, loss_rel = compare(hf, model, seeded_batch(hf.config.vocab_size))
    print(f"\n[{variant} · {mode}] logits max abs {max_abs:.2e} · loss rel {loss_rel:.2e}")
    assert max_abs <= 1e-5
    assert loss_rel <= 1e-6


def test_safetensors_output_and_dtype_cast(tmp_path):
    hf = build_hf_model("gqa", seed=3)
    src = save_hf_model(hf, tmp_path / "hf")
    convert(src, tmp_path / "ms", fmt="safetensors", dtype="bf16")
    saved = load_checkpoint_dict(tmp_path / "ms")
    assert (tmp_path / "ms" / "model.safetensors").is_file()
    assert all(v.dtype == ms.bfloat16 for v in saved.values())
    ref = hf.state_dict()["model.embed_tokens.weight"].bfloat16()
    assert np.array_equal(saved["model.tok_embeddings.embedding_weight"].asnumpy(), torch_to_numpy(ref))
    load_model(tmp_path / "ms")


def test_bf16_and_fp16_sources_keep_their_dtype(tmp_path):
    import torch

    for dtype, ms_dtype in ((torch.bfloat16, ms.bfloat16), (torch.float16, ms.float16)):
        hf = build_hf_model("mha", seed=4, dtype=dtype)
        src = save_hf_model(hf, tmp_path / f"hf_{ms_dtype}")
        result = convert(src, tmp_path / f"ms_{ms_dtype}")
        saved = load_checkpoint_dict(result.out_dir)
        assert {v.dtype for v in saved.values()} == {ms_dtype}
        w = hf.state_dict()["model.layers.0.self_attn.q_proj.weight"]
        assert np.array_equal(saved["model.layers.0.attention.wq.weight"].asnumpy().view(np.uint16),
                              torch_to_numpy(w).view(np.uint16))
        assert result.config.compute_dtype == {torch.bfloat16: "bfloat16", torch.float16: "float16"}[dtype]
