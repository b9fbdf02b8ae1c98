"""RoPE types and activations real checkpoints use (yarn: Qwen2/DeepSeek; longrope: Phi-3;
dynamic NTK; relu2), run by the bundled Llama as HF runs them: proved with `migrate diff`
against HF, including sequences past the length where longrope and dynamic change their
frequencies. What the bundled model still cannot run is refused by `convert` before any
byte is written, naming the field and value."""
import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from transformers import LlamaConfig as HFLlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from family_fixtures import build_family_model
from hf_fixtures import build_hf_model, save_hf_model
from migrate.cli import main
from migrate.models.rope import rope_frequencies

THETA = 10000.0
# Tiny max positions, so that "longer than the original / maximum length" is cheap.
ROPE = {
    "yarn": dict(max_position_embeddings=32, rope_parameters={
        "rope_type": "yarn", "rope_theta": THETA, "factor": 4.0, "original_max_position_embeddings": 8}),
    "yarn_options": dict(max_position_embeddings=32, rope_parameters={
        "rope_type": "yarn", "rope_theta": THETA, "factor": 2.5, "original_max_position_embeddings": 16,
        "beta_fast": 16.0, "beta_slow": 2.0, "truncate": False, "mscale": 1.0, "mscale_all_dim": 0.5}),
    "longrope": dict(max_position_embeddings=32, rope_parameters={
        "rope_type": "longrope", "rope_theta": THETA, "original_max_position_embeddings": 8,
        "short_factor": [1.0, 1.2, 1.5, 2.0], "long_factor": [2.0, 3.0, 5.0, 9.0]}),
    "dynamic": dict(max_position_embeddings=16, rope_parameters={
        "rope_type": "dynamic", "rope_theta": THETA, "factor": 2.0}),
}


def ulps(a, b) -> int:
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return int(np.abs(a.view(np.int32).astype(np.int64) - b.view(np.int32).astype(np.int64)).max())


@pytest.mark.parametrize("name", sorted(ROPE))
@pytest.mark.parametrize("theta", [THETA, 500000.0])
def test_frequencies_equal_transformers(name, theta):
    fields = ROPE[name]
    params = {**fields["rope_parameters"], "rope_theta": theta}
    hf = HFLlamaConfig(vocab_size=16, hidden_size=32, num_attention_heads=4, head_dim=8,
                       max_position_embeddings=fields["max_position_embeddings"], rope_parameters=dict(params))
    rope_type = params["rope_type"]
    init = ROPE_INIT_FUNCTIONS[rope_type]
    ref, attention = init(hf, "cpu")
    mine = rope_frequencies(8, theta, {k: v for k, v in hf.rope_parameters.items() if k != "rope_theta"},
                            hf.max_position_embeddings)
    assert ulps(mine.inv_freq, ref.numpy()) == 0 and mine.attention_scaling == attention
    if rope_type == "longrope":  # HF's longrope_frequency_update: the long set past the original length
        long, _ = init(hf, "cpu", seq_len=params["original_max_position_embeddings"] + 1)
        assert ulps(mine.for_length(9), long.numpy()) == 0 and ulps(mine.for_length(8), ref.numpy()) == 0
    if rope_type == "dynamic":  # HF's dynamic_frequency_update: recomputed from a tensor seq_len
        for seq_len in range(17, 200):
            again, _ = init(hf, "cpu", seq_len=torch.tensor(seq_len))
            # torch's vectorised powf is within an ulp of the correctly rounded value we compute
            assert ulps(mine.for_length(seq_len), again.numpy()) <= 2, seq_len
        assert mine.for_length(16) is mine.inv_freq


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("rope")
    out = {}
    for name, fields in {**ROPE, "relu2": dict(hidden_act="relu2")}.items():
        save_hf_model(build_hf_model("gqa", seed=21, **fields), root / name / "hf")
        out[name] = root / name / "hf"
    qwen = build_family_model("hf_qwen2", seed=22, **ROPE["yarn"])
    save_hf_model(qwen, root / "qwen2_yarn" / "hf")
    out["qwen2_yarn"] = root / "qwen2_yarn" / "hf"
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name, seq_lens", [
    ("yarn", (24,)),
    ("yarn_options", (24,)),
    ("longrope", (6, 24)),      # short factors up to 8 positions, long ones past them
    ("dynamic", (12, 24)),      # base frequencies up to 16 positions, recomputed past them
    ("relu2", (16,)),
    ("qwen2_yarn", (24,)),
])
def test_diff_passes_against_hf(models, tmp_path, capsys, name, seq_lens):
    ms = tmp_path / "ms"
    src = "hf_qwen2" if name.startswith("qwen2") else "hf_llama"
    assert main(["convert", "--src", src, str(models[name]), str(ms)]) == 0
    for seq_len in seq_lens:
        report = tmp_path / f"report{seq_len}"
        code = main(["diff", str(models[name]), str(ms), "--seq-len", str(seq_len), "--detail",
                     "--report", str(report)])
        headline = json.loads((report / "report.json").read_text())["summary"]["headline"]
        print(f"\n[{name} seq {seq_len}] logits max abs {headline['logits_max_abs']:.2e}")
        assert code == 0, capsys.readouterr().out[-3000:]
        assert headline["logits_max_abs"] <= 1e-5


@pytest.mark.slow
def test_dynamic_generation_across_the_maximum_length(models, tmp_path):
    # Greedy decoding grows the sequence from 14 past max_position_embeddings (16): HF
    # recomputes the frequencies at every longer length, and so does the bundled model.
    ms = tmp_path / "ms"
    assert main(["convert", str(models["dynamic"]), str(ms)]) == 0
    assert main(["diff", str(models["dynamic"]), str(ms), "--batch", "1", "--seq-len", "14",
                 "--generate", "6", "--mode", "graph"]) == 0


# ---------------------------------------------------------------- what is still refused, at convert time

def _refused(capsys, tmp_path, config_edit, contains):
    hf = tmp_path / "hf"
    save_hf_model(build_hf_model("gqa", seed=23), hf)
    config = json.loads((hf / "config.json").read_text())
    config_edit(config)
    (hf / "config.json").write_text(json.dumps(config))
    capsys.readouterr()
    code = main(["convert", str(hf), str(tmp_path / "ms")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith("migrate: error: "), err
    assert contains in err, err
    assert not (tmp_path / "ms").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["hf"]


@pytest.mark.parametrize("edit, contains", [
    (lambda c: c.update(rope_parameters={"rope_type": "proportional", "rope_theta": THETA}),
     "rope_type 'proportional' (config.json rope_parameters / rope_scaling) is not supported"),
    (lambda c: c.update(hidden_act="quick_gelu"), "hidden_act 'quick_gelu' is not supported"),
    (lambda c: c.update(rope_parameters={"rope_type": "linear", "rope_theta": THETA, "factor": 2.0,
                                         "partial_rotary_factor": 0.5}),
     "rope_scaling.partial_rotary_factor 0.5 is not supported"),
    (lambda c: c.update(rope_parameters={**ROPE["longrope"]["rope_parameters"], "long_factor": [1.0, 2.0]}),
     "rope_scaling.long_factor holds 2 values; the model's rotary dimension needs 4"),
    (lambda c: c.update(rope_parameters={"rope_type": "dynamic", "rope_theta": THETA, "factor": "2"}),
     "rope_scaling.factor must be a number, got '2'"),
])
def test_convert_refuses_what_the_model_cannot_run(capsys, tmp_path, edit, contains):
    _refused(capsys, tmp_path, edit, contains)


def test_refusing_imports_no_mindspore(tmp_path):
    hf = tmp_path / "hf"
    save_hf_model(build_hf_model("gqa", seed=23), hf)
    config = json.loads((hf / "config.json").read_text())
    (hf / "config.json").write_text(json.dumps({**config, "hidden_act": "quick_gelu"}))
    script = ("import sys; from migrate.cli import main; "
              f"code = main(['convert', {str(hf)!r}, {str(tmp_path / 'ms')!r}]); "
              "assert 'mindspore' not in sys.modules; sys.exit(code)")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "hidden_act 'quick_gelu'" in done.stderr


def test_activation_tables_are_the_models_own():
    from migrate.models import common, llama, support

    assert set(llama._ACTIVATIONS) == set(support.LLAMA_ACTIVATIONS)
    assert set(common.ACTIVATIONS) == set(support.COMMON_ACTIVATIONS)
