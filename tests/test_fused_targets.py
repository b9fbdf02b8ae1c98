"""`migrate convert --qkv-concat` and `--target mcore`: MindFormers' fused layouts.

attention.w_qkv / linear_qkv holds, per KV group g, [the query heads of g | k_g | v_g]
(biases alike); feed_forward.w_gate_hidden / mlp.linear_fc1 interleaves gate and up rows
(g0, u0, g1, u1, ...). The expected layouts are rebuilt here row by row, independently of
migrate.transforms. Tiny HF Llamas (hidden 32, 4 heads, 2 layers) from a seed."""
import json

import numpy as np
import pytest
import torch
import yaml

from hf_fixtures import build_hf_model, save_hf_model
from migrate.align import run_diff
from migrate.checkpoints.hf_reader import open_hf_checkpoint
from migrate.checkpoints.ms_reader import open_ms_checkpoint
from migrate.cli import main
from migrate.convert import convert
from migrate.export import export

# case -> (hf_fixtures variant, overrides, source dtype); both with q/k/v/o and MLP biases
CASES = {
    "gqa": ("bias", {}, torch.float32),                                       # 4 heads, 2 kv heads
    "mha_bf16": ("mha", dict(attention_bias=True, mlp_bias=True), torch.bfloat16),
}
MCORE = {  # bundled fused name (after model.layers.N. / top level) -> MindFormers 2.x name
    "attention_norm.weight": "input_layernorm.weight",
    "attention.w_qkv.weight": "self_attention.linear_qkv.weight",
    "attention.w_qkv.bias": "self_attention.linear_qkv.bias",
    "attention.wo.weight": "self_attention.linear_proj.weight",
    "attention.wo.bias": "self_attention.linear_proj.bias",
    "ffn_norm.weight": "pre_mlp_layernorm.weight",
    "feed_forward.w_gate_hidden.weight": "mlp.linear_fc1.weight",
    "feed_forward.w_gate_hidden.bias": "mlp.linear_fc1.bias",
    "feed_forward.w2.weight": "mlp.linear_fc2.weight",
    "feed_forward.w2.bias": "mlp.linear_fc2.bias",
}
TOP = {"model.tok_embeddings.embedding_weight": "embedding.word_embeddings.weight",
       "model.norm_out.weight": "decoder.final_layernorm.weight", "lm_head.weight": "output_layer.weight"}


def expected_names(layers: int, mcore: bool, tied: bool = False, bias: bool = True) -> set[str]:
    top = {k: v for k, v in TOP.items() if not (tied and k == "lm_head.weight")}
    per_layer = {k: v for k, v in MCORE.items() if bias or not k.endswith(".bias")}
    if mcore:
        return set(top.values()) | {f"decoder.layers.{i}.{v}" for i in range(layers) for v in per_layer.values()}
    return set(top) | {f"model.layers.{i}.{k}" for i in range(layers) for k in per_layer}


def reference_qkv(q, k, v, n_kv):
    """Row blocks per KV group: the group's query heads, its key head, its value head."""
    rows_q, rows_kv = q.shape[0] // n_kv, k.shape[0] // n_kv
    blocks = []
    for g in range(n_kv):
        blocks += [q[g * rows_q:(g + 1) * rows_q], k[g * rows_kv:(g + 1) * rows_kv], v[g * rows_kv:(g + 1) * rows_kv]]
    return np.concatenate(blocks)


def reference_gate_up(gate, up):
    out = np.empty((2 * gate.shape[0],) + gate.shape[1:], gate.dtype)
    for i in range(gate.shape[0]):
        out[2 * i], out[2 * i + 1] = gate[i], up[i]
    return out


@pytest.fixture(scope="module", params=list(CASES))
def converted(request, tmp_path_factory):
    variant, overrides, dtype = CASES[request.param]
    root = tmp_path_factory.mktemp(request.param)
    hf = build_hf_model(variant, seed=41, dtype=dtype, **overrides)
    src = save_hf_model(hf, root / "hf", "bin" if dtype == torch.bfloat16 else "safetensors")
    for target in ("qkv_concat", "mcore"):
        convert(src, root / target, target=target)
    return request.param, hf, src, root


def ms_tensors(folder):
    ckpt = open_ms_checkpoint(folder)
    return dict(ckpt.tensors())


def hf_tensors(folder):
    with open_hf_checkpoint(folder) as ckpt:
        return {name: ckpt.read(name) for name in ckpt.names()}


def test_names_and_fused_layouts(converted):
    case, hf, src, root = converted
    cfg = hf.config
    n_kv, layers = cfg.num_key_value_heads, cfg.num_hidden_layers
    state = hf_tensors(src)
    fused, mcore = ms_tensors(root / "qkv_concat"), ms_tensors(root / "mcore")
    assert set(fused) == expected_names(layers, mcore=False)
    assert set(mcore) == expected_names(layers, mcore=True)
    for i in range(layers):
        hf_layer, ms_layer = f"model.layers.{i}.", f"model.layers.{i}."
        for p in ("weight", "bias"):
            q, k, v = (state[f"{hf_layer}self_attn.{x}_proj.{p}"] for x in "qkv")
            want = reference_qkv(q, k, v, n_kv)
            assert fused[f"{ms_layer}attention.w_qkv.{p}"].dtype == want.dtype
            assert np.array_equal(fused[f"{ms_layer}attention.w_qkv.{p}"].view(np.uint8), want.view(np.uint8))
            gate, up = state[f"{hf_layer}mlp.gate_proj.{p}"], state[f"{hf_layer}mlp.up_proj.{p}"]
            want = reference_gate_up(gate, up)
            assert np.array_equal(fused[f"{ms_layer}feed_forward.w_gate_hidden.{p}"].view(np.uint8),
                                  want.view(np.uint8))
    # mcore holds the same bytes under MindFormers 2.x names.
    for name, value in fused.items():
        layer = name.split(".")[2] if name.startswith("model.layers.") else None
        mc = TOP[name] if layer is None else f"decoder.layers.{layer}.{MCORE[name.split('.', 3)[3]]}"
        assert np.array_equal(mcore[mc].view(np.uint8), value.view(np.uint8)), name

    for target in ("qkv_concat", "mcore"):
        model_yaml = yaml.safe_load((root / target / "model.yaml").read_text())
        assert model_yaml["qkv_concat"] is True and model_yaml["keymap_target"] == target
        manifest = json.loads((root / target / "conversion.json").read_text())
        assert manifest["keymap"]["target"] == target
        qkv = next(t for t in manifest["tensors"] if t["target"].endswith(("w_qkv.weight", "linear_qkv.weight")))
        assert qkv["layout"] == "qkv_groups" and len(qkv["source"]) == 3


def test_export_inverts_bit_exactly(converted):
    case, hf, src, root = converted
    before = hf_tensors(src)
    for target in ("qkv_concat", "mcore"):
        export(root / target, root / f"back_{target}")
        after = hf_tensors(root / f"back_{target}")
        assert set(after) == set(before)
        for name, value in before.items():
            assert after[name].dtype == value.dtype, name
            assert np.array_equal(after[name].view(np.uint8), value.view(np.uint8)), (target, name)


def test_fused_model_passes_diff(converted):
    case, hf, src, root = converted
    if case == "gqa":
        for target in ("qkv_concat", "mcore"):
            report = run_diff(src, root / target, detail=True, grads=target == "qkv_concat")
            h = report.summary["headline"]
            print(f"\n[{case} {target}] {report.verdict_text()}")
            assert report.passed, report.first_divergence or report.first_grad_divergence
            assert h["logits_max_abs"] <= 1e-5
    else:  # bf16 source: compare in fp32 (parameters upcast exactly), then in bf16
        report = run_diff(src, root / "mcore", dtype="fp32")
        print(f"\n[{case} mcore fp32] {report.verdict_text()}")
        assert report.passed and report.summary["headline"]["logits_max_abs"] <= 1e-5
        report = run_diff(src, root / "mcore", dtype="bf16")
        print(f"[{case} mcore bf16] {report.verdict_text()}")
        assert report.passed


def test_cli_flags_tied_mcore_and_bad_input(tmp_path, capsys):
    hf = build_hf_model("tied", seed=42)   # GQA with tied embeddings
    src = save_hf_model(hf, tmp_path / "hf")
    assert main(["convert", "--qkv-concat", str(src), str(tmp_path / "fused")]) == 0
    assert main(["convert", "--target", "mcore", "--format", "safetensors", str(src), str(tmp_path / "mcore")]) == 0
    layers = hf.config.num_hidden_layers
    names = ms_tensors(tmp_path / "mcore")
    assert set(names) == expected_names(layers, mcore=True, tied=True, bias=False)  # no output_layer
    assert set(ms_tensors(tmp_path / "fused")) == expected_names(layers, mcore=False, tied=True, bias=False)
    assert main(["export", str(tmp_path / "mcore"), str(tmp_path / "back")]) == 0
    assert set(hf_tensors(tmp_path / "back")) == set(hf_tensors(src))

    from family_fixtures import build_family_model

    gpt2 = save_hf_model(build_family_model("hf_gpt2"), tmp_path / "gpt2")
    capsys.readouterr()
    assert main(["convert", "--src", "hf_gpt2", "--qkv-concat", str(gpt2), str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "hf_gpt2 has no target 'qkv_concat'" in err
    assert main(["convert", "--target", "megatron", str(src), str(tmp_path / "bad")]) == 2
    assert "its targets: qkv_concat, mcore" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists() and not list(tmp_path.glob(".bad*"))


@pytest.mark.parametrize("family", ["hf_qwen2", "hf_mistral"])
def test_llama_family_keymaps_inherit_the_targets(tmp_path, family):
    """Qwen2 (q/k/v biases, no o bias) and Mistral take the targets from hf_llama."""
    from family_fixtures import build_family_model

    src = save_hf_model(build_family_model(family, seed=43), tmp_path / "hf")
    assert main(["convert", "--src", "auto", "--target", "mcore", str(src), str(tmp_path / "ms")]) == 0
    names = set(ms_tensors(tmp_path / "ms"))
    assert ("decoder.layers.0.self_attention.linear_qkv.bias" in names) == (family == "hf_qwen2")
    assert "decoder.layers.0.self_attention.linear_proj.bias" not in names
    report = run_diff(src, tmp_path / "ms")
    assert report.passed and report.summary["headline"]["logits_max_abs"] <= 1e-5
    assert main(["export", str(tmp_path / "ms"), str(tmp_path / "back")]) == 0
    before, after = hf_tensors(src), hf_tensors(tmp_path / "back")
    assert set(before) == set(after)
    assert all(np.array_equal(before[n].view(np.uint8), after[n].view(np.uint8)) for n in before)


def test_weights_that_do_not_fit_the_layout_are_refused(tmp_path, capsys):
    """config.json says 1 kv head, the weights have 2: the fused row's shape rule names it."""
    src = save_hf_model(build_hf_model("gqa", seed=44), tmp_path / "hf")
    cfg = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**cfg, "num_key_value_heads": 1}))
    capsys.readouterr()
    assert main(["convert", "--qkv-concat", str(src), str(tmp_path / "ms")]) == 2
    err = capsys.readouterr().err
    assert "self_attn.q_proj.weight + " in err and "(qkv_groups)" in err and err.count("\n") == 1
    assert not (tmp_path / "ms").exists()
    assert main(["keymap", "check", "hf_llama", "--hf", str(src)]) == 1  # the unfused rows disagree too
