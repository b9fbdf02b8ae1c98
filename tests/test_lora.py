"""LoRA without training: the adapter on the MindSpore model against PEFT's, adapters moving between
PEFT folders and the converted model, merging, the planner, and bad input (issue 16).

Tiny Llama (GQA) converted plain, --qkv-concat and mcore; adapters with random non-zero B so
that every part of the update shows in the logits.
"""
import json

import mindspore as ms
import numpy as np
import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import LlamaForCausalLM

import migrate.align.runner as runner
from hf_fixtures import build_hf_model, save_hf_model
from migrate.align.adapters import attach_to_ms, load_adapter
from migrate.align.runner import run_diff
from migrate.cli import main
from migrate.convert import convert
from migrate.errors import MigrateError
from migrate.export import export
from migrate.keymap import Keymap, recorded_keymap
from migrate.lora.cells import attach_lora
from migrate.lora.memory import adapter_params, lora_estimate
from migrate.lora.spec import LoraSpec
from migrate.lora.targets import resolve_targets
from migrate.lora.transfer import export_adapter, import_adapter, merge_adapter
from migrate.memory_plan import GiB, estimate_memory
from migrate.models.config import LlamaConfig
from migrate.models.conversion_plan import ConversionPlan
from migrate.models.loading import load_model
from migrate.parallel.layout import Layout
from migrate.train.config import RunConfig

IDS = np.random.default_rng(0).integers(0, 128, (2, 8))


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    save_hf_model(build_hf_model("gqa"), root / "hf")
    save_hf_model(build_hf_model("gqa", seed=1), root / "hf_other")      # same shapes, other weights
    save_hf_model(build_hf_model("gqa", hidden_size=48), root / "hf_wide")  # other shapes
    for target in (None, "qkv_concat", "mcore"):
        convert(root / "hf", root / f"ms_{target}", target=target)
    convert(root / "hf_other", root / "ms_other")
    convert(root / "hf_wide", root / "ms_wide")
    return root


def peft_model(hf_dir, targets, seed=1, rank=4, alpha=8):
    """HF + PEFT with random non-zero adapters (PEFT's own init for A, then B drawn)."""
    torch.manual_seed(seed)
    model = get_peft_model(LlamaForCausalLM.from_pretrained(hf_dir), LoraConfig(r=rank, lora_alpha=alpha,
                                                                                 target_modules=targets))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.1 * torch.randn_like(p))
    return model.eval()


def peft_logits(model):
    with torch.no_grad():
        return model(input_ids=torch.from_numpy(IDS)).logits.numpy()


def ms_logits(ms_dir, adapter=None):
    model, _ = load_model(ms_dir, compute_dtype="float32")
    if adapter is not None:
        attach_to_ms(model, *load_adapter(adapter, ms_dir))
    return model(ms.Tensor(IDS.astype(np.int32)))[0].asnumpy()


@pytest.mark.parametrize("target, targets", [
    (None, ["q_proj", "v_proj"]), (None, "all-linear"), ("qkv_concat", "all-linear"),
    ("qkv_concat", ["k_proj", "up_proj"]), ("mcore", ["q_proj", "v_proj"])])
def test_the_kernel_computes_what_peft_computes_on_every_layout(models, target, targets):
    ms_dir = models / f"ms_{target}"
    base, config = load_model(ms_dir, compute_dtype="float32")
    plan = ConversionPlan(Keymap.load(recorded_keymap(ms_dir)).for_model(config.to_dict()), config)
    ref_model = peft_model(models / "hf", targets)
    ref = peft_logits(ref_model)
    layers = {n.removeprefix("base_model.model."): m for n, m in ref_model.named_modules() if hasattr(m, "lora_A")}
    spec = LoraSpec(rank=4, alpha=8, target_modules=targets)
    sites = resolve_targets(spec, plan)
    assert sorted(s.hf_module for s in sites) == sorted(layers)
    weights = {s.hf_module: (layers[s.hf_module].lora_A["default"].weight.detach().numpy(),
                             layers[s.hf_module].lora_B["default"].weight.detach().numpy()) for s in sites}
    effect = np.abs(ref - base(ms.Tensor(IDS.astype(np.int32)))[0].asnumpy()).max()
    attach_lora(base, sites, spec, weights, plan.fields)
    got = base(ms.Tensor(IDS.astype(np.int32)))[0].asnumpy()
    print(f"\n[LoRA kernel, {target or 'plain'}, {targets}] max abs vs PEFT {np.abs(got - ref).max():.2e}, "
          f"adapter moves logits by {effect:.2e}")
    assert np.abs(got - ref).max() <= 1e-5 and effect > 1e-2
    if target == "qkv_concat":
        # Negative control: the rsLoRA scaling (alpha / sqrt(r)) in place of PEFT's alpha / r.
        wrong, _ = load_model(ms_dir, compute_dtype="float32")
        attach_lora(wrong, sites, LoraSpec(rank=4, alpha=8, target_modules=targets, use_rslora=True), weights,
                    plan.fields)
        assert np.abs(wrong(ms.Tensor(IDS.astype(np.int32)))[0].asnumpy() - ref).max() > 1e-3


def test_a_peft_adapter_imports_merges_and_exports(models, tmp_path):
    ref_model = peft_model(models / "hf", "all-linear")
    ref_model.save_pretrained(tmp_path / "peft")
    ref = peft_logits(ref_model)
    # PEFT folder -> MindSpore adapter on the converted (fused) model: the same logits.
    for target in (None, "mcore"):
        ms_dir = models / f"ms_{target}"
        import_adapter(tmp_path / "peft", ms_dir, tmp_path / f"imported_{target}")
        got = ms_logits(ms_dir, tmp_path / f"imported_{target}")
        assert np.abs(got - ref).max() <= 1e-5
    # Merged weights: base + scaling·B·A, against PEFT's own merge_and_unload.
    merge_adapter(tmp_path / "imported_mcore", tmp_path / "merged")
    unloaded = peft_model(models / "hf", "all-linear").merge_and_unload()
    merged_ref = {k: v.numpy() for k, v in unloaded.state_dict().items()}
    back = tmp_path / "merged_hf"
    export(tmp_path / "merged", back)
    merged = LlamaForCausalLM.from_pretrained(back).state_dict()
    assert [k for k in merged_ref if not np.array_equal(merged[k].numpy(), merged_ref[k])] == []  # bit for bit
    assert np.abs(ms_logits(tmp_path / "merged") - ref).max() <= 1e-5
    # And back to PEFT: the exported folder loads into PeftModel with the same logits.
    export_adapter(tmp_path / "imported_None", tmp_path / "exported")
    again = PeftModel.from_pretrained(LlamaForCausalLM.from_pretrained(models / "hf"), tmp_path / "exported").eval()
    assert np.abs(peft_logits(again) - ref).max() <= 1e-6
    config = json.loads((tmp_path / "exported" / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["lora_alpha"] == 8 and config["peft_type"] == "LORA"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_lora_merge_is_peft_merge_and_unload_bit_for_bit(tmp_path, cli, dtype):
    # Hidden 40, rank 32: shapes where numpy's matmul (OpenBLAS) rounds B @ A differently from torch's
    # (MKL), which PEFT's get_delta_weight uses; the merge used numpy's and was 1 ulp off there.
    # bf16: the adapter file is bf16 too, as PEFT upcasts it to fp32 (autocast_adapter_dtype) on load.
    hf, ms_dir = tmp_path / "hf40", tmp_path / "ms40"
    save_hf_model(build_hf_model("gqa", hidden_size=40, dtype=dtype), hf)
    convert(hf, ms_dir)
    torch.manual_seed(3)
    model = get_peft_model(LlamaForCausalLM.from_pretrained(hf, dtype=dtype),
                           LoraConfig(r=32, lora_alpha=16, target_modules="all-linear"), autocast_adapter_dtype=False)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.1 * torch.randn_like(p))
    model.save_pretrained(tmp_path / "peft")
    assert cli("lora", "merge", tmp_path / "peft", tmp_path / "merged", "--model", ms_dir) == (0, [])
    export(tmp_path / "merged", tmp_path / "merged_hf")
    got = LlamaForCausalLM.from_pretrained(tmp_path / "merged_hf", dtype=dtype).state_dict()
    base = LlamaForCausalLM.from_pretrained(hf, dtype=dtype)
    before = {k: v.clone() for k, v in base.state_dict().items()}
    ref = PeftModel.from_pretrained(base, tmp_path / "peft").merge_and_unload().state_dict()
    assert len([k for k in ref if not torch.equal(ref[k], before[k])]) == 14  # every linear layer adapted
    assert [k for k in ref if not torch.equal(got[k], ref[k])] == []


def test_diff_with_an_adapter_on_both_sides(models, tmp_path, monkeypatch):
    peft_model(models / "hf", ["q_proj", "v_proj"]).save_pretrained(tmp_path / "peft")
    for dtype in ("fp32", "bf16"):
        report = run_diff(models / "hf", models / "ms_qkv_concat", adapter=tmp_path / "peft", dtype=dtype)
        assert report.exit_code == 0, report.verdict_line() if hasattr(report, "verdict_line") else ""
    # Negative control: the adapter on the MindSpore side alone.
    monkeypatch.setattr(runner, "attach_to_hf", lambda model, adapter, sites: None)
    assert run_diff(models / "hf", models / "ms_qkv_concat", adapter=tmp_path / "peft").exit_code == 1


@pytest.fixture
def cli(capsys):
    """`migrate ARGS` in this process: (exit code, stderr lines)."""
    def run(*args):
        capsys.readouterr()
        code = main([str(a) for a in args])
        return code, capsys.readouterr().err.strip().splitlines()
    return run


def test_an_adapter_for_another_base_is_refused(models, tmp_path, cli):
    peft_model(models / "hf", ["q_proj", "v_proj"]).save_pretrained(tmp_path / "peft")
    # By shape: hidden size 48 against an adapter made for 32.
    code, err = cli("lora", "import", tmp_path / "peft", tmp_path / "wide", "--model", models / "ms_wide")
    assert code == 2 and len(err) == 1 and "adapter for another base model" in err[0], err
    assert not (tmp_path / "wide").exists()
    # By the base fingerprint: same shapes, other weights (the fingerprint travels in the PEFT file).
    import_adapter(tmp_path / "peft", models / "ms_None", tmp_path / "ms_adapter")
    export_adapter(tmp_path / "ms_adapter", tmp_path / "peft_hashed")
    code, err = cli("lora", "import", tmp_path / "peft_hashed", tmp_path / "other", "--model", models / "ms_other")
    assert code == 2 and len(err) == 1 and "trained on another base model" in err[0], err
    code, err = cli("lora", "merge", tmp_path / "ms_adapter", tmp_path / "m", "--model", models / "ms_other")
    assert code == 2 and "trained on another base model" in err[0] and not (tmp_path / "m").exists()
    # A module the base does not have (a 2-layer base, an adapter naming layer 5).
    with pytest.raises(MigrateError, match="has no linear layer named: an adapter for another base model"):
        from migrate.lora.transfer import Adapter, base_plan, fit_to_base
        a = np.zeros((4, 32), np.float32)
        fit_to_base(Adapter(tmp_path, LoraSpec(4), {"model.layers.5.self_attn.q_proj": (a, a.T.copy())}, None),
                    models / "ms_None", base_plan(models / "ms_None"))


@pytest.mark.parametrize("lora, message", [
    ({"rank": 0}, "lora.rank: must be an integer >= 1, got 0"),
    ({"rank": 8, "alpha": -1}, "lora.alpha: must be a number > 0"),
    ({"use_dora": True}, "lora.use_dora: DoRA is not supported"),
    ({"target_modules": "q_proj"}, "lora.target_modules: must be a list of module names or 'all-linear'"),
    ({"target_modules": []}, "lora.target_modules: must be a non-empty list"),
    ({"ranks": 8}, "lora.ranks: unknown key (did you mean 'rank'?)"),
])
def test_bad_lora_config_is_one_line(lora, message):
    with pytest.raises(MigrateError) as err:
        RunConfig.from_dict({"data": "d", "seq_length": 8, "total_steps": 1, "lora": lora})
    assert message in str(err.value) and "\n" not in str(err.value)


def test_an_unknown_target_module_is_one_line(models):
    plan = ConversionPlan(Keymap.load("hf_llama"), LlamaConfig.load(models / "ms_None"))
    with pytest.raises(MigrateError, match=r"no linear layer of hf_llama is named 'qq_proj'; its linear layers: "
                                           r"q_proj, k_proj, v_proj, o_proj, gate_proj, down_proj, up_proj, lm_head"):
        resolve_targets(LoraSpec(target_modules=["q_proj", "qq_proj"]), plan)


def test_plan_counts_lora_memory_next_to_full_training_7b(tmp_path, cli):
    config = LlamaConfig(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_layers=32, num_heads=32)
    config.save(tmp_path / "model.yaml")
    plan = ConversionPlan(Keymap.load("hf_llama"), config)
    sites = resolve_targets(LoraSpec(rank=16, target_modules=["q_proj", "v_proj"]), plan)
    assert len(sites) == 64 and adapter_params(sites, 16) == 8_388_608  # 32 layers × 2 × 16 × (4096 + 4096)
    one = Layout(micro_batch_size=1)
    full = estimate_memory(config, one, 2048, "bf16", "full")
    lora = lora_estimate(config, one, 2048, "bf16", "full", sites=sites, rank=16)
    print(f"\n[plan 7B, one device, seq 2048, full recompute] full training {full.total / GiB:.1f} GiB "
          f"(optimizer {full.optimizer / GiB:.1f}), LoRA r16 q,v {lora.total / GiB:.1f} GiB "
          f"(optimizer {lora.optimizer / GiB:.3f})")
    assert lora.grads == 8_388_608 * 4 and lora.optimizer == 8_388_608 * 8
    assert lora.weights == full.params * 2 + 8_388_608 * 4
    assert lora.total < 24 * GiB < full.total  # "a 7B model fits one 24 GB card with LoRA"
    code, err = cli("plan", "--model", tmp_path, "--devices", 1, "--device-memory", "24GiB", "--seq-length", 2048,
                     "--global-batch", 8, "--lora-rank", 0)
    assert code == 2 and err == ["migrate: error: --lora-rank: must be an integer >= 1, got 0"]
