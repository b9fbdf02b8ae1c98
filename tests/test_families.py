"""Qwen2 and Mistral through the Llama keymap family: convert, match HF, diff, round trip."""
import numpy as np
import pytest
import torch
from family_fixtures import build_family_model
from hf_fixtures import save_hf_model
from ms_helpers import compare as compare_logits
from ms_helpers import seeded_batch

from migrate.align import compare
from migrate.checkpoints.hf_reader import open_hf_checkpoint
from migrate.convert import convert
from migrate.export import export
from migrate.hf_config import load_hf_config
from migrate.models.loading import load_model

CASES = {
    "qwen2": ("hf_qwen2", {}),
    "qwen2_tied": ("hf_qwen2", {"tie_word_embeddings": True}),
    "qwen2_window": ("hf_qwen2", {"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 1}),
    "mistral_window": ("hf_mistral", {"sliding_window": 4}),
    "mistral_full": ("hf_mistral", {"sliding_window": None}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_family_converts_matches_hf_and_round_trips(tmp_path, case):
    family, overrides = CASES[case]
    hf = build_family_model(family, seed=21, **overrides)
    layout = "bin" if case == "qwen2" else "safetensors"
    src = save_hf_model(hf, tmp_path / "hf", layout)
    convert(src, tmp_path / "ms", keymap=family)

    model, config = load_model(tmp_path / "ms")
    ids = seeded_batch(128, length=12)
    max_abs, loss_rel = compare_logits(hf, model, ids)
    print(f"\n[{case}] logits max abs {max_abs:.2e} · loss rel {loss_rel:.2e}")
    assert max_abs <= 1e-5 and loss_rel <= 1e-6
    if "window" in case:
        assert config.sliding_window == 4

    report = compare(tmp_path / "hf", tmp_path / "ms", detail=True, grads=True)  # keymap from conversion.json
    assert report.passed, report.first_divergence

    export(tmp_path / "ms", tmp_path / "back", keymap=family)
    with open_hf_checkpoint(src) as a, open_hf_checkpoint(tmp_path / "back") as b:
        assert set(a.names()) == set(b.names())
        for name in a.names():
            assert np.array_equal(a.read(name).view(np.uint8), b.read(name).view(np.uint8)), name
    before, after = load_hf_config(src), load_hf_config(tmp_path / "back")
    for cfg in (before, after):
        for key in ("transformers_version", "_name_or_path"):
            cfg.pop(key, None)
    assert after == before


def test_sliding_window_changes_the_numbers():
    """The window case is meaningful: HF's own logits differ with and without it."""
    windowed = build_family_model("hf_mistral", seed=22, sliding_window=4)
    full = build_family_model("hf_mistral", seed=22, sliding_window=None)
    ids = torch.from_numpy(seeded_batch(128, length=12))
    with torch.no_grad():
        assert not torch.allclose(windowed(ids).logits, full(ids).logits, atol=1e-4)


def test_qwen2_keymap_names_q_k_v_biases_only():
    from migrate.keymap import Keymap

    km = Keymap.load("hf_qwen2")
    ms = km.hf_to_ms_config(build_family_model("hf_qwen2").config.to_dict())
    assert ms["qkv_has_bias"] is True and ms["out_proj_has_bias"] is False
    dst = {p.dst for p in km.pairs(ms)[0]}
    assert "model.layers.0.attention.wk.bias" in dst and "model.layers.0.attention.wo.bias" not in dst


def test_src_auto_picks_the_family_and_names_known_ones(tmp_path, capsys):
    import json

    from migrate.cli import main

    hf = build_family_model("hf_qwen2", seed=23)
    src = save_hf_model(hf, tmp_path / "hf")
    assert main(["convert", "--src", "auto", str(src), str(tmp_path / "ms")]) == 0
    assert json.loads((tmp_path / "ms" / "conversion.json").read_text())["keymap"]["name"] == "hf_qwen2"
    assert main(["export", str(tmp_path / "ms"), str(tmp_path / "back")]) == 0  # keymap from conversion.json

    cfg = json.loads((src / "config.json").read_text())
    cfg.update(model_type="gpt_neox", architectures=["GPTNeoXForCausalLM"])
    (src / "config.json").write_text(json.dumps(cfg))
    capsys.readouterr()
    assert main(["convert", "--src", "auto", str(src), str(tmp_path / "ms2")]) == 2
    err = capsys.readouterr().err
    assert "no keymap knows 'GPTNeoXForCausalLM'" in err and "hf_qwen2 (Qwen2ForCausalLM)" in err
