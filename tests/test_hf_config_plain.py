"""config.json read without transformers (`migrate.hf_config.plain_fields`) says what AutoConfig says.

`convert` reads the fields its keymap needs straight from the JSON when the file spells them all, so
that a conversion imports neither transformers nor torch (seconds of start-up for a copy that may take
less). Each case here goes both ways and the MindSpore fields must be equal: configs of every bundled
family saved by the installed transformers, the RoPE types, sliding windows, and configs as older
transformers versions wrote them to the Hub (no head_dim, rope_theta beside rope_scaling, a window
with use_sliding_window off). A file that leaves a read field to a class default goes through
transformers, and must.
"""
import json
import subprocess
import sys

import pytest

from family_fixtures import _classes
from hf_fixtures import VARIANTS, build_hf_model, hf_config, save_hf_model
from migrate.hf_config import load_hf_config, plain_fields, read_raw_config
from migrate.keymap import resolve
from test_rope_types import ROPE


def _saved():
    cases = {f"llama {v}": lambda v=v: hf_config(v) for v in VARIANTS}
    cases.update({f"rope {r}": lambda r=r: hf_config("gqa", **ROPE[r]) for r in ROPE})
    for family in ("hf_qwen2", "hf_mistral", "hf_gpt2", "hf_bert"):
        cases[family] = lambda f=family: _classes(f)[0](**_classes(f)[2])
    qwen2, _, small = _classes("hf_qwen2")
    cases["qwen2 window"] = lambda: qwen2(**small, use_sliding_window=True, sliding_window=8, max_window_layers=1)
    cases["qwen2 window off"] = lambda: qwen2(**small, use_sliding_window=False, sliding_window=8)
    mistral, _, small = _classes("hf_mistral")
    cases["mistral window"] = lambda: mistral(**small, sliding_window=8)
    return cases


SAVED = _saved()
LLAMA2 = {"architectures": ["LlamaForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
          "hidden_size": 256, "initializer_range": 0.02, "intermediate_size": 688, "max_position_embeddings": 4096,
          "model_type": "llama", "num_attention_heads": 8, "num_hidden_layers": 2, "num_key_value_heads": 8,
          "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 10000.0,
          "tie_word_embeddings": False, "torch_dtype": "float16", "transformers_version": "4.31.0.dev0",
          "use_cache": True, "vocab_size": 320, "attention_bias": False, "mlp_bias": False,
          "attention_dropout": 0.0, "pad_token_id": None}
# As older transformers wrote them: no head_dim (derived), theta and scaling apart, a window switched off.
HUB = {
    "llama2 4.31": LLAMA2,
    "llama3.1 4.43": {**LLAMA2, "num_key_value_heads": 2, "rope_theta": 500000.0, "eos_token_id": [2, 3],
                      "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                       "original_max_position_embeddings": 1024, "rope_type": "llama3"}},
    "llama linear, legacy 'type'": {**LLAMA2, "rope_scaling": {"type": "linear", "factor": 2.0}},
    "llama without num_key_value_heads": {k: v for k, v in LLAMA2.items() if k != "num_key_value_heads"},
    # Llama 3 as 4.40 wrote it: no mlp_bias, head_dim, pad_token_id (class defaults)
    "llama3 4.40": {k: v for k, v in LLAMA2.items() if k not in ("mlp_bias", "pad_token_id", "attention_dropout")}
    | {"rope_theta": 500000.0, "num_key_value_heads": 2},
    "llama without bos_token_id": {k: v for k, v in LLAMA2.items() if k != "bos_token_id"},
    "llama without rope_theta": {k: v for k, v in LLAMA2.items() if k not in ("rope_theta", "rope_scaling")},
    "qwen2, window on, no size": {**{k: v for k, v in LLAMA2.items() if k not in ("attention_bias", "mlp_bias")},
                                  "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"],
                                  "use_sliding_window": True, "max_window_layers": 1,
                                  "layer_types": ["full_attention", "sliding_attention"]},
    "mistral 4.45": {**{k: v for k, v in LLAMA2.items() if k not in ("attention_bias", "mlp_bias", "pretraining_tp")},
                     "model_type": "mistral", "architectures": ["MistralForCausalLM"], "sliding_window": 4096,
                     "num_key_value_heads": 2, "head_dim": 32},
    "qwen2 4.45, window off": {**{k: v for k, v in LLAMA2.items() if k not in ("attention_bias", "mlp_bias")},
                               "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"],
                               "use_sliding_window": False, "sliding_window": 4096, "max_window_layers": 1,
                               "layer_types": ["full_attention", "full_attention"]},
}
# Files that leave a field to what only transformers knows (no keymap default, a derivation that differs
# between versions): they go through it.
THROUGH_TRANSFORMERS = {
    "llama without hidden_size": {k: v for k, v in LLAMA2.items() if k != "hidden_size"},
    "llama scaling without theta": {**{k: v for k, v in LLAMA2.items() if k != "rope_theta"},
                                    "rope_scaling": {"rope_type": "linear", "factor": 2.0}},
    "qwen2 without layer_types (4.x)": {k: v for k, v in HUB["qwen2 4.45, window off"].items() if k != "layer_types"},
    # transformers 4.57 keeps Mistral's missing head_dim None, 5.x derives it: the installed one decides
    "mistral 4.34, no head_dim": {**{k: v for k, v in LLAMA2.items() if k not in ("attention_bias", "mlp_bias")},
                                  "model_type": "mistral", "architectures": ["MistralForCausalLM"],
                                  "sliding_window": 4096, "num_key_value_heads": 2},
    "gemma": {**LLAMA2, "model_type": "gemma", "architectures": ["GemmaForCausalLM"], "head_dim": 32},
}


def _both_ways(folder):
    raw = read_raw_config(folder)
    km = resolve("auto", raw).for_source(raw)
    return km, plain_fields(raw, km), km.hf_to_ms_config(load_hf_config(folder))


def _write(folder, fields):
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(fields))
    return folder


@pytest.mark.parametrize("case", sorted(SAVED))
def test_configs_the_installed_transformers_saved_read_the_same_without_it(tmp_path, case):
    SAVED[case]().save_pretrained(tmp_path)
    km, plain, through = _both_ways(tmp_path)
    assert plain is not None, "a config transformers saved spells every field"
    assert km.hf_to_ms_config(plain) == through


@pytest.mark.parametrize("case", sorted(HUB))
def test_configs_older_transformers_wrote_read_the_same_without_it(tmp_path, case):
    km, plain, through = _both_ways(_write(tmp_path / "hf", HUB[case]))
    assert plain is not None
    assert km.hf_to_ms_config(plain) == through


@pytest.mark.parametrize("case", sorted(THROUGH_TRANSFORMERS))
def test_a_field_left_to_a_class_default_goes_through_transformers(tmp_path, case):
    km, plain, through = _both_ways(_write(tmp_path / "hf", THROUGH_TRANSFORMERS[case]))
    assert plain is None
    assert through  # AutoConfig filled it in


@pytest.mark.parametrize("family", ["hf_llama", "hf_mistral", "hf_qwen2"])
def test_the_keymaps_defaults_are_the_config_classes(family):
    from transformers import AutoConfig

    from migrate.hf_config import join_rope

    km = resolve(family)
    assert km.hf_defaults, "the family reads configs without transformers"
    for model_type, defaults in km.hf_defaults.items():
        fields = join_rope(AutoConfig.for_model(model_type).to_dict())
        if model_type == "qwen2":  # its window size shows only when the window is on
            fields["sliding_window"] = AutoConfig.for_model(model_type, use_sliding_window=True).sliding_window
        assert {name: fields[name] for name in defaults} == defaults


def test_the_derived_fields_are_transformers_values():
    km = resolve("hf_llama")
    plain = plain_fields(HUB["llama without num_key_value_heads"], km)
    assert plain["num_key_value_heads"] == 8 and plain["head_dim"] == 32
    qwen = plain_fields(HUB["qwen2 4.45, window off"], resolve("hf_qwen2"))
    assert qwen["sliding_window"] is None  # transformers drops a window that is switched off


def _loaded(folder):
    from transformers import AutoConfig

    fields = AutoConfig.from_pretrained(str(folder), local_files_only=True).to_dict()
    for where in ("transformers_version", "_name_or_path"):  # the writer's version, the folder's path
        fields.pop(where, None)
    return fields


@pytest.mark.parametrize("case", sorted(SAVED))
def test_a_config_written_without_transformers_loads_as_the_one_it_writes(tmp_path, case, monkeypatch):
    """export's config.json (`write_hf_config`): transformers loads the plain file as its own."""
    import migrate.hf_config as hf_config_module

    SAVED[case]().save_pretrained(tmp_path / "src")
    raw = read_raw_config(tmp_path / "src")
    km = resolve("auto", raw).for_source(raw)
    fields = {**km.passthrough, **km.ms_to_hf_config(km.hf_to_ms_config(load_hf_config(tmp_path / "src")))}
    (tmp_path / "plain").mkdir()
    hf_config_module.write_hf_config(tmp_path / "plain", fields)
    monkeypatch.setattr(hf_config_module, "PLAIN_TYPES", frozenset())  # the AutoConfig way
    (tmp_path / "through").mkdir()
    hf_config_module.write_hf_config(tmp_path / "through", fields)
    assert _loaded(tmp_path / "plain") == _loaded(tmp_path / "through")


@pytest.mark.slow
def test_convert_and_export_of_safetensors_import_neither_torch_nor_transformers(tmp_path):
    src = save_hf_model(build_hf_model("gqa", seed=2), tmp_path / "hf")
    code = ("import sys\nfrom migrate.cli import main\n"
            f"assert main(['convert', {str(src)!r}, {str(tmp_path / 'ms')!r}]) == 0\n"
            f"assert main(['export', {str(tmp_path / 'ms')!r}, {str(tmp_path / 'back')!r}]) == 0\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'transformers', 'mindspore'}))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"
    assert _loaded(tmp_path / "back") == _loaded(src)  # save_pretrained of the model wrote its architectures too
