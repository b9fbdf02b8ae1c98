"""The custom-keymap walkthrough of docs/convert.md, run as written: the keymap YAML is
taken from docs/convert.md, applied to a checkpoint saved under the user's own names."""
import json
import re
from pathlib import Path

import pytest
from safetensors.torch import save_file

from hf_fixtures import build_hf_model
from migrate.cli import main
from migrate.models.loading import load_model
from ms_helpers import compare as compare_logits
from ms_helpers import seeded_batch

DOC = Path(__file__).resolve().parent.parent / "docs" / "convert.md"

# The user's training code: same tensors as HF Llama, its own names.
RENAME = [
    (r"model\.embed_tokens\.weight", "tok_emb.weight"),
    (r"model\.layers\.(\d+)\.self_attn\.q_proj\.weight", r"blocks.\1.attn.q.weight"),
    (r"model\.layers\.(\d+)\.self_attn\.k_proj\.weight", r"blocks.\1.attn.k.weight"),
    (r"model\.layers\.(\d+)\.self_attn\.v_proj\.weight", r"blocks.\1.attn.v.weight"),
    (r"model\.layers\.(\d+)\.self_attn\.o_proj\.weight", r"blocks.\1.attn.out.weight"),
    (r"model\.layers\.(\d+)\.mlp\.gate_proj\.weight", r"blocks.\1.mlp.gate.weight"),
    (r"model\.layers\.(\d+)\.mlp\.down_proj\.weight", r"blocks.\1.mlp.down.weight"),
    (r"model\.layers\.(\d+)\.mlp\.up_proj\.weight", r"blocks.\1.mlp.up.weight"),
    (r"model\.layers\.(\d+)\.input_layernorm\.weight", r"blocks.\1.norm1.weight"),
    (r"model\.layers\.(\d+)\.post_attention_layernorm\.weight", r"blocks.\1.norm2.weight"),
    (r"model\.norm\.weight", "final_norm.weight"),
    (r"lm_head\.weight", "head.weight"),
]


def readme_keymap() -> str:
    blocks = re.findall(r"```yaml\n(# file: my_tinylm\.yaml\n.*?)```", DOC.read_text(), re.S)
    assert len(blocks) == 1, "docs/convert.md must hold exactly one my_tinylm.yaml block"
    return blocks[0]


def user_checkpoint(folder: Path, hf) -> Path:
    folder.mkdir(parents=True)
    state = {}
    for name, tensor in hf.state_dict().items():
        for pattern, repl in RENAME:
            if re.fullmatch(pattern, name):
                state[re.sub(pattern, repl, name)] = tensor.contiguous()
                break
        else:
            raise AssertionError(f"walkthrough does not rename {name}")
    save_file(state, folder / "model.safetensors")
    c = hf.config
    (folder / "config.json").write_text(json.dumps({
        "model_type": "tinylm", "vocab": c.vocab_size, "dim": c.hidden_size, "ffn_dim": c.intermediate_size,
        "n_layers": c.num_hidden_layers, "n_heads": c.num_attention_heads, "n_kv_heads": c.num_key_value_heads,
        "norm_eps": c.rms_norm_eps, "rope_base": c.rope_parameters["rope_theta"],
        "max_seq": c.max_position_embeddings,
    }))
    return folder


@pytest.fixture
def walkthrough(tmp_path):
    hf = build_hf_model("gqa", seed=31)
    keymap = tmp_path / "my_tinylm.yaml"
    keymap.write_text(readme_keymap())
    return hf, keymap, user_checkpoint(tmp_path / "tinylm", hf)


def test_walkthrough_converts_and_matches(walkthrough, tmp_path, capsys):
    hf, keymap, ckpt = walkthrough
    assert main(["keymap", "check", str(keymap), "--hf", str(ckpt)]) == 0
    assert "complete: every tensor maps" in capsys.readouterr().out
    assert main(["convert", "--keymap", str(keymap), str(ckpt), str(tmp_path / "ms")]) == 0
    model, _ = load_model(tmp_path / "ms")
    max_abs, loss_rel = compare_logits(hf, model, seeded_batch(hf.config.vocab_size))
    assert max_abs <= 1e-5 and loss_rel <= 1e-6
    assert main(["export", "--keymap", str(keymap), str(tmp_path / "ms"), str(tmp_path / "back")]) == 0
    back = json.loads((tmp_path / "back" / "config.json").read_text())
    assert back == {**json.loads((ckpt / "config.json").read_text()), "dtype": "float32"}


def test_check_names_the_gaps(walkthrough, tmp_path, capsys):
    _, keymap, ckpt = walkthrough
    text = keymap.read_text().replace("  head.weight: lm_head.weight\n", "")
    keymap.write_text(text)
    assert main(["keymap", "check", str(keymap), "--hf", str(ckpt)]) == 1
    out = capsys.readouterr().out
    assert "HF tensors no rule consumes (1):" in out and "head.weight" in out
    assert "model parameters no rule fills (1):" in out and "lm_head.weight" in out


def test_registry_refuses_a_taken_family(walkthrough, capsys):
    _, keymap, ckpt = walkthrough
    keymap.write_text(keymap.read_text().replace("family: my_tinylm", "family: hf_llama"))
    assert main(["keymap", "check", str(keymap), "--hf", str(ckpt)]) == 2
    err = capsys.readouterr().err
    assert "keymap family 'hf_llama'" in err and "my_tinylm.yaml" in err and "hf_llama.yaml" in err
