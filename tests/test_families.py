"""Every bundled family from safetensors and `.bin`: convert, match HF, `migrate diff`, round trip.

Qwen2, Mistral and Gemma (embedding scale and (1 + weight) RMSNorm as model.yaml flags) go
through the Llama keymap; GPT-2 (Conv1D transposes, c_attn split
into q/k/v, learned positions, tied head) and BERT (BertModel with its pooler,
BertForMaskedLM with its MLM head) through their own keymaps. Run with -s for figures."""
import numpy as np
import pytest
import torch

from family_fixtures import build_family_model
from hf_fixtures import save_hf_model
from migrate.align import run_diff
from migrate.checkpoints.hf_reader import open_hf_checkpoint
from migrate.convert import convert
from migrate.errors import MigrateError
from migrate.export import export
from migrate.hf_config import load_hf_config
from migrate.models.loading import load_model
from ms_helpers import compare as compare_logits
from ms_helpers import seeded_batch

CASES = {
    "qwen2": ("hf_qwen2", {}),
    "qwen2_tied": ("hf_qwen2", {"tie_word_embeddings": True}),
    "qwen2_window": ("hf_qwen2", {"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 1}),
    "mistral_window": ("hf_mistral", {"sliding_window": 4}),
    "mistral_full": ("hf_mistral", {"sliding_window": None}),
    "gemma": ("hf_gemma", {}),  # HF's defaults: tied, gelu_pytorch_tanh; head_dim 16 given explicitly
}
BIN_CASES = {"qwen2", "mistral_full", "gemma"}  # the others are read from safetensors


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_family_converts_matches_hf_and_round_trips(tmp_path, case):
    family, overrides = CASES[case]
    hf = build_family_model(family, seed=21, **overrides)
    layout = "bin" if case in BIN_CASES else "safetensors"
    src = save_hf_model(hf, tmp_path / "hf", layout)
    convert(src, tmp_path / "ms", keymap=family)

    model, config = load_model(tmp_path / "ms")
    ids = seeded_batch(128, length=12)
    max_abs, loss_rel = compare_logits(hf, model, ids)
    print(f"\n[{case}] logits max abs {max_abs:.2e} · loss rel {loss_rel:.2e}")
    assert max_abs <= 1e-5 and loss_rel <= 1e-6
    if "window" in case:
        assert config.sliding_window == 4

    report = run_diff(tmp_path / "hf", tmp_path / "ms", detail=True, grads=True)  # keymap from conversion.json
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


def _copy_with_model_yaml(src, dst, **fields):
    import shutil

    import yaml

    shutil.copytree(src, dst)
    data = yaml.safe_load((dst / "model.yaml").read_text())
    (dst / "model.yaml").write_text(yaml.safe_dump({**data, **fields}, sort_keys=False))
    return dst


def test_gemma_from_auto_and_each_of_its_features_is_needed(tmp_path, capsys):
    """`--src auto` picks hf_gemma. The same checkpoint under a model.yaml without either Gemma
    flag fails `migrate diff`, where the feature first acts: the embedding output without the
    √hidden_size scale; layer 0's attention (after the first norm) without the unit offset.
    Nor is it exported as a Llama. The no-upcast fault keeps Gemma's offset: a small error,
    found at the same norm."""
    import json

    from migrate.cli import main

    src = save_hf_model(build_family_model("hf_gemma", seed=24, num_key_value_heads=4), tmp_path / "hf")
    assert main(["convert", "--src", "auto", str(src), str(tmp_path / "ms")]) == 0
    assert json.loads((tmp_path / "ms" / "conversion.json").read_text())["keymap"]["name"] == "hf_gemma"
    assert main(["keymap", "check", "hf_gemma", "--hf", str(src)]) == 0
    assert run_diff(src, tmp_path / "ms", detail=True).passed
    capsys.readouterr()
    assert main(["export", "--src", "hf_llama", str(tmp_path / "ms"), str(tmp_path / "as_llama")]) == 2
    assert "cannot export as hf_llama: model has scale_embeddings=True" in capsys.readouterr().err

    for flag, first in (("scale_embeddings", "embedding output"), ("rms_norm_unit_offset", "layer 0 attention")):
        faulty = _copy_with_model_yaml(tmp_path / "ms", tmp_path / f"no_{flag}", **{flag: False})
        report = run_diff(src, faulty, detail=True)
        print(f"\n[gemma without {flag}] {report.verdict_text()}")
        assert not report.passed
        assert report.summary["first_divergence"]["name"] == first

    report = run_diff(src, tmp_path / "ms", dtype="bf16", inject="rmsnorm_no_upcast")
    print(f"\n[gemma bf16 rmsnorm_no_upcast] {report.verdict_text()}")
    assert not report.passed and report.summary["first_divergence"]["name"] == "layer 0 attention"
    assert report.summary["headline"]["logits_cosine"] > 0.9999

    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "use_bidirectional_attention": True}))
    capsys.readouterr()
    assert main(["convert", "--src", "hf_gemma", str(src), str(tmp_path / "bidirectional")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "use_bidirectional_attention is not supported" in err[0]
    assert not (tmp_path / "bidirectional").exists()


def test_gemma_embedding_scale_is_rounded_to_the_weights_dtype():
    """HF multiplies by √hidden_size cast to the weights' dtype: 5.65625 for hidden 32 in bf16."""
    from family_models import GEMMA, build_hf, ms_config
    from migrate.models.registry import build_model

    hf = build_hf(GEMMA, {})
    for dtype, scale in (("float32", np.float32(32 ** 0.5)), ("bfloat16", 5.65625), ("float16", 5.65625)):
        model = build_model(ms_config(GEMMA, hf.config, compute_dtype=dtype))
        assert model.model.tok_embeddings.scale == float(scale) == float(hf.model.embed_tokens.embed_scale.to(
            getattr(torch, dtype)))


@pytest.mark.parametrize("target", ["qkv_concat", "mcore"])
def test_gemma_fused_targets_diff_and_round_trip(tmp_path, target):
    """hf_llama's targets reach Gemma through `extends`: the bundled model runs them, export splits back."""
    from migrate.cli import main

    src = save_hf_model(build_family_model("hf_gemma", seed=25), tmp_path / "hf")
    assert main(["convert", "--src", "hf_gemma", "--target", target, str(src), str(tmp_path / "ms")]) == 0
    report = run_diff(src, tmp_path / "ms")
    assert report.passed and report.summary["headline"]["logits_max_abs"] <= 1e-5
    assert main(["export", str(tmp_path / "ms"), str(tmp_path / "back")]) == 0
    with open_hf_checkpoint(src) as a, open_hf_checkpoint(tmp_path / "back") as b:
        assert set(a.names()) == set(b.names())
        for name in a.names():
            assert np.array_equal(a.read(name).view(np.uint8), b.read(name).view(np.uint8)), name


@pytest.mark.slow
@pytest.mark.usefixtures("one_torch_thread")
def test_gemma_trains_like_the_golden(tmp_path):
    """`migrate train` trains Gemma (the bundled Llama with its flags; the golden script loads
    it with AutoModelForCausalLM): 4 steps of the golden and the MindSpore trainer, fp32."""
    from migrate.data.corpus import train_bpe_tokenizer, write_stdlib_corpus
    from migrate.data.tokenize import tokenize_corpus
    from migrate.train.config import ScheduleConfig
    from migrate.train.trainer import train
    from train_setup import RUN, load_cfg, load_golden, metrics, rel

    files = write_stdlib_corpus(tmp_path / "corpus", modules=["textwrap", "heapq"])
    train_bpe_tokenizer(files, 320, tmp_path / "tok")
    tokenize_corpus(files, tmp_path / "tok", 16, tmp_path / "data")
    save_hf_model(build_family_model("hf_gemma", seed=26, vocab_size=320), tmp_path / "hf")
    convert(tmp_path / "hf", tmp_path / "ms", keymap="hf_gemma")
    (tmp_path / "run.yaml").write_text(RUN)
    cfg = load_cfg(tmp_path, total_steps=4, schedule=ScheduleConfig(name="cosine", warmup_steps=2, min_lr_rate=0.1))
    load_golden().train(cfg, tmp_path / "golden", log=lambda line: None)
    train(cfg, tmp_path / "ms_run", progress=False)
    g, m = metrics(tmp_path / "golden"), metrics(tmp_path / "ms_run")
    print("\n[gemma train] loss rel per step "
          + ", ".join(f"{rel(a['loss'], b['loss']):.1e}" for a, b in zip(g, m, strict=True)))
    assert [r["step"] for r in m] == [1, 2, 3, 4]
    assert max(rel(a["loss"], b["loss"]) for a, b in zip(g, m, strict=True)) <= 1e-6


# case -> (build_family_model name, keymap --src, layout, config overrides)
OTHER_FAMILIES = {
    "gpt2": ("hf_gpt2", "hf_gpt2", "safetensors", {}),
    "gpt2_untied_bin": ("hf_gpt2", "auto", "bin", {"tie_word_embeddings": False, "n_inner": 48,
                                                   "activation_function": "gelu"}),
    "bert": ("hf_bert", "hf_bert", "bin", {}),
    "bert_sharded": ("hf_bert", "auto", "sharded_safetensors", {"hidden_act": "gelu_new"}),
    "bert_mlm": ("hf_bert_mlm", "hf_bert", "safetensors", {}),
    "bert_mlm_bin": ("hf_bert_mlm", "auto", "bin", {}),
    "bert_mlm_untied": ("hf_bert_mlm", "hf_bert", "safetensors", {"tie_word_embeddings": False}),
}


@pytest.mark.parametrize("case", list(OTHER_FAMILIES))
def test_gpt2_and_bert_convert_diff_and_round_trip(tmp_path, case):
    import json

    builder, src_family, layout, overrides = OTHER_FAMILIES[case]
    hf = build_family_model(builder, seed=31, **overrides)
    src = save_hf_model(hf, tmp_path / "hf", layout)
    result = convert(src, tmp_path / "ms", keymap=src_family)
    manifest = json.loads((tmp_path / "ms" / "conversion.json").read_text())
    family = "gpt2" if "gpt2" in case else "bert"
    assert manifest["keymap"]["name"] == f"hf_{family}"  # also from --src auto
    assert manifest["target"] == f"migrate.models.{family}:{type(hf).__name__}"
    load_model(tmp_path / "ms")  # every parameter filled, none left over
    assert result.tensors == len(manifest["tensors"])

    report = run_diff(tmp_path / "hf", tmp_path / "ms", detail=True, padded=True)
    h = report.summary["headline"]
    figure = h["logits_max_abs"] if h["logits_max_abs"] is not None else h["last_hidden_max_abs"]
    print(f"\n[{case}] {report.verdict_text()}")
    assert report.passed, report.first_divergence
    assert figure <= 1e-5
    if builder == "hf_bert":  # BertModel: the last hidden state and the pooled output, no final norm
        names = [e.name for e in report.forward]
        assert names[-2:] == ["last hidden state", "pooled output"] and "final norm output" not in names
        assert h["pooled_max_abs"] <= 1e-5

    export(tmp_path / "ms", tmp_path / "back")  # keymap, variant: from conversion.json / model.yaml
    ignored = set(manifest["ignored"])
    with open_hf_checkpoint(src) as a, open_hf_checkpoint(tmp_path / "back") as b:
        assert set(a.names()) - ignored == set(b.names())
        for name in b.names():
            assert np.array_equal(a.read(name).view(np.uint8), b.read(name).view(np.uint8)), name
    if case == "bert_mlm_untied":  # transformers 5 keeps an unused cls.predictions.bias when untied
        assert ignored == {"cls.predictions.bias"}
    else:
        assert not ignored
    before, after = load_hf_config(src), load_hf_config(tmp_path / "back")
    for cfg in (before, after):
        for key in ("transformers_version", "_name_or_path"):
            cfg.pop(key, None)
    assert after == before


def test_gpt2_c_attn_is_transposed_and_split(tmp_path):
    """HF's Conv1D c_attn (in, 3*out) becomes dense1/2/3 (out, in); c_proj keeps (in, out)."""
    from migrate.models.loading import load_checkpoint_dict

    hf = build_family_model("hf_gpt2", seed=32)
    convert(save_hf_model(hf, tmp_path / "hf"), tmp_path / "ms", keymap="hf_gpt2")
    saved = load_checkpoint_dict(tmp_path / "ms")
    w = hf.state_dict()["transformer.h.1.attn.c_attn.weight"].numpy()
    b = hf.state_dict()["transformer.h.1.attn.c_attn.bias"].numpy()
    h = w.shape[0]
    for j, dense in enumerate(("dense1", "dense2", "dense3")):
        got = saved[f"backbone.blocks.1.attention.{dense}.weight"].asnumpy()
        assert np.array_equal(got, w[:, j * h:(j + 1) * h].T)
        assert np.array_equal(saved[f"backbone.blocks.1.attention.{dense}.bias"].asnumpy(), b[j * h:(j + 1) * h])
    proj = hf.state_dict()["transformer.h.1.attn.c_proj.weight"].numpy()
    assert np.array_equal(saved["backbone.blocks.1.attention.projection.weight"].asnumpy(), proj)
    assert "lm_head.weight" not in saved  # tied to wte


def test_gpt2_hub_layout_without_prefix_and_with_mask_buffers(tmp_path):
    """The GPT-2 hub files: GPT2Model's names (no `transformer.`), no lm_head, and in old
    `.bin` files the causal-mask buffers attn.bias / attn.masked_bias (ignored, recorded)."""
    import json

    hf = build_family_model("hf_gpt2", seed=33)
    folder = tmp_path / "hf"
    folder.mkdir()
    hf.config.architectures = ["GPT2LMHeadModel"]
    hf.config.save_pretrained(folder)
    state = {k.removeprefix("transformer."): v.contiguous() for k, v in hf.state_dict().items()
             if k.startswith("transformer.")}
    n = hf.config.n_positions
    for i in range(hf.config.n_layer):
        state[f"h.{i}.attn.bias"] = torch.tril(torch.ones(n, n)).view(1, 1, n, n)
        state[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    torch.save(state, folder / "pytorch_model.bin")

    convert(folder, tmp_path / "ms", keymap="auto")
    manifest = json.loads((tmp_path / "ms" / "conversion.json").read_text())
    assert len(manifest["ignored"]) == 2 * hf.config.n_layer
    report = run_diff(folder, tmp_path / "ms")
    assert report.passed and report.summary["headline"]["logits_max_abs"] <= 1e-5
    export(tmp_path / "ms", tmp_path / "back")
    with open_hf_checkpoint(tmp_path / "back") as back:
        assert set(back.names()) == {f"transformer.{k}" for k in state if ".attn.bias" not in k
                                     and "masked_bias" not in k}
        for name in back.names():
            assert np.array_equal(back.read(name), state[name.removeprefix("transformer.")].numpy()), name


def test_bert_variant_follows_the_architecture():
    from migrate.keymap import Keymap

    km = Keymap.load("hf_bert")
    base, mlm = km.for_source({"architectures": ["BertModel"]}), km.for_source({"architectures": ["BertForMaskedLM"]})
    assert base.target.endswith(":BertModel") and mlm.target.endswith(":BertForMaskedLM")
    fields = base.hf_to_ms_config(build_family_model("hf_bert").config.to_dict())
    base_dst = {d for g in base.groups(fields)[0] for d in g.dst}
    mlm_dst = {d for g in mlm.groups(fields)[0] for d in g.dst}
    assert "pooler.dense.weight" in base_dst and "embeddings.layernorm.bias" in base_dst
    assert "bert.embeddings.layernorm.bias" in mlm_dst and "cls.decoder.bias" in mlm_dst
    assert not any(d.startswith("pooler") for d in mlm_dst)
    assert mlm.align["final norm"] == "cls.predictions.transform" and "final norm" not in base.align
    assert km.for_model_class("migrate.models.bert:BertForMaskedLM").variant == "BertForMaskedLM"
    with pytest.raises(MigrateError, match="converts BertModel, BertForMaskedLM; this checkpoint is Bert"):
        km.for_source({"architectures": ["BertForSequenceClassification"]})
