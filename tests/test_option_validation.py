"""Numeric options and bad input, through the command line: every refusal one `migrate: error:` line,
exit 2, nothing written -- before a model is built where the argument alone is wrong, before the
allocation where the model or the machine bounds it (sizes far past any machine: refused everywhere)."""
import json

import numpy as np
import pytest
from safetensors.numpy import save_file

from hf_fixtures import build_hf_model, save_hf_model
from migrate.cli import main
from migrate.convert import convert

HUGE = str(10**12)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """One tiny HF Llama (2 layers, hidden 32, 64 positions) and its conversion."""
    root = tmp_path_factory.mktemp("options")
    save_hf_model(build_hf_model("tied", seed=3), root / "hf")
    convert(root / "hf", root / "ms")
    return root


def refused(capsys, argv, words, *absent):
    """Exit 2 with one line holding `words`; none of the `absent` paths exists afterwards."""
    capsys.readouterr()
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("migrate: error: ") and words in err[0], err[0]
    for path in absent:
        assert not path.exists(), path
    return err[0]


# ---------------------------------------------------------------- the argument alone (no model built)

@pytest.mark.parametrize("argv, words", [
    (["vocab", "check", "HF", "--max-unk-share", "-1"], "argument --max-unk-share: must be a finite number in [0, 1]"),
    (["vocab", "check", "HF", "--max-token-share", "nan"], "argument --max-token-share: must be a finite number"),
    (["vocab", "check", "HF", "--mono-row-share", "2"], "argument --mono-row-share"),
    (["diff", "HF", "MS", "--seed", "-1"], "argument --seed: must be an integer in 0..4294967295, got '-1'"),
    (["diff", "HF", "MS", "--seed", str(2**32)], "argument --seed"),           # torch's manual_seed raised
    (["diff", "HF", "MS", "--lr", "nan"], "argument --lr: must be a finite number > 0"),  # ran, and PASSed
    (["diff", "HF", "MS", "--generate", "-1"], "argument --generate: must be an integer >= 0"),  # HF's ValueError
    (["diff", "HF", "MS", "--text", "caf\udce9"], "argument --text: is not valid UTF-8 text (byte 0xe9"),
    (["dump", "MS", "OUT", "--seed", "-3"], "dump: argument --seed"),
    (["generate", "MS", "--prompt", "caf\udce9"], "argument --prompt: is not valid UTF-8 text (byte 0xe9"),
    (["generate", "MS", "--ids", "1,2", "--cache-len", "0"], "argument --cache-len: must be an integer >= 1"),
    (["vocab", "resize", "MS", "OUT", "--to", "400", "--init", "normal", "--seed", "-1"], "argument --seed"),
    (["plan", "--model", "MS", "--devices", "1", "--device-memory", "64GB", "--seq-length", "8", "--global-batch",
      "8", "--top", "0"], "plan: argument --top: must be an integer >= 1, got '0'"),     # listed no layout
    (["plan", "--model", "MS", "--devices", "1", "--device-memory", "0GB", "--seq-length", "8",
      "--global-batch", "8"], "a memory size must be positive, got '0GB'"),            # "nothing fits", exit 1
    (["mindformers-config", "MS", "--out", "OUT.yaml", "--device-memory", "0GB"], "a memory size must be positive"),
    (["plan", "--model", "MS"], "plan: the following arguments are required: --devices"),  # was a usage block
    (["nosuchverb"], "argument command: invalid choice: 'nosuchverb'"),
])
def test_a_bad_argument_is_one_line(capsys, tmp_path, argv, words):
    names = {"HF": tmp_path / "hf", "MS": tmp_path / "ms", "OUT": tmp_path / "out", "OUT.yaml": tmp_path / "o.yaml"}
    refused(capsys, [names.get(a, a) for a in argv], words, *names.values())


# ---------------------------------------------------------------- sizes the model or the machine bounds

@pytest.mark.parametrize("argv, words", [
    # the cache's zeros: numpy's MemoryError (_ArrayMemoryError: 7.28 TiB) before
    (["generate", "{ms}", "--ids", "1,2,3", "--max-new-tokens", HUGE],
     "the KV cache for prompt + --max-new-tokens 1,000,000,000,000 (1,000,000,000,003 slots) needs at least 232.8 TiB; "
     "this machine has"),
    (["generate", "{ms}", "--ids", "1,2,3", "--cache-len", HUGE], "the KV cache for --cache-len 1,000,000,000,000 "
                                                                  "needs at least 232.8 TiB"),
    (["export", "--format", "mindir", "{ms}", "{out}", "--cache-len", HUGE],
     "the KV cache for --cache-len 1,000,000,000,000 (batch 1) needs at least 232.8 TiB"),
    (["vocab", "resize", "{ms}", "{out}", "--to", HUGE], "resizing to 1,000,000,000,000 rows needs at least 232.8 TiB"),
    # the seeded ids alone were 15 GiB (killed for memory here); one head's attention scores are more
    (["dump", "{ms}", "{out}", "--seq-len", str(10**9)], "a forward of --batch 2 × --seq-len 1,000,000,000 needs"),
    # 0 was read as "not given" and the export written with the default 1 / 64
    (["export", "--format", "mindir", "{ms}", "{out}", "--batch", "0"], "--batch must be positive, got 0"),
    (["export", "--format", "mindir", "{ms}", "{out}", "--prefill-len", "0"], "--prefill-len must be positive, got 0"),
    # MindFormers' RoPE table has max_position_embedding rows: a longer seq_length was written into the YAML
    (["mindformers-config", "{ms}", "--out", "{out}.yaml", "--seq-length", HUGE],
     "seq_length 1,000,000,000,000 exceeds the model's max_position_embeddings 64"),
])
def test_a_size_past_the_model_or_the_machine_is_refused_before_allocating(tiny, tmp_path, capsys, argv, words):
    out = tmp_path / "out"
    argv = [a.format(ms=tiny / "ms", out=out) for a in argv]
    message = refused(capsys, argv, words, out, tmp_path / "out.yaml")
    assert "needs" not in words or message.endswith("of memory available")   # the machine's figure beside
    assert "needs" not in words or "needs at least" in message   # a lower bound (the model comes on top): said so


@pytest.mark.parametrize("argv, words", [
    (["--ids", "-1,2"], "--ids: token ids are 0 or more, got -1 in '-1,2'"),   # was "expected one argument"
    (["--ids", "-1 2"], "--ids: token ids are 0 or more, got -1"),
    (["--ids=-1,2"], "--ids: token ids are 0 or more, got -1"),
    (["--ids", "1_000"], "--ids takes token ids separated by commas or spaces, got '1_000'"),  # int() read 1000
    (["--ids", "+1,2"], "--ids takes token ids separated by commas or spaces, got '+1,2'"),
    (["--ids", "\u0661,2"], "--ids takes token ids"),                  # an Arabic-Indic one: int() read 1
    (["--ids", "1.5,2"], "--ids takes token ids"),
])
def test_generate_ids_are_plain_non_negative_numbers(tiny, capsys, argv, words):
    refused(capsys, ["generate", tiny / "ms", *argv, "--max-new-tokens", "2"], words)


def test_a_config_with_no_layers_is_refused(tmp_path, capsys, tiny):
    hf = tmp_path / "hf"
    hf.mkdir()
    config = json.loads((tiny / "hf" / "config.json").read_text())
    (hf / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 0}))   # plan listed layouts, exit 0
    refused(capsys, ["plan", "--model", hf, "--devices", "1", "--device-memory", "64GB", "--seq-length", "8",
                     "--global-batch", "8"], "model config field num_layers must be positive, got 0")


def test_hparams_refuses_a_seq_length_the_data_was_not_tokenized_with(tmp_path, capsys):
    """`hparams` said 'all knobs agree' on seq_length 10**12; both trainers refuse it against the data."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "data.json").write_text(json.dumps({"seq_length": 16, "samples": 4}))
    (tmp_path / "run.yaml").write_text(f"hf_model: hf\nms_model: ms\ndata: data\nseq_length: {HUGE}\n"
                                       "total_steps: 2\nmicro_batch_size: 2\ngrad_accum_steps: 1\n")
    refused(capsys, ["hparams", tmp_path / "run.yaml"],
            f"run config seq_length is {HUGE} but {tmp_path / 'data'} was tokenized with seq_length 16")


def test_compare_refuses_a_log_holding_two_formats(tmp_path, capsys):
    log = tmp_path / "train.log"
    log.write_text(" [2025-01-01 00:00:00] iteration        1/      10 | consumed samples:            8 | "
                   "learning rate: 1.000000E-04 | lm loss: 3.200000E+00 | loss scale: 1.0 | grad norm: 1.000 |\n"
                   "2025-01-01 00:00:01 - INFO - { Epoch:[  1/  1], step:[    1/   10], loss: 3.210, "
                   "per_step_time: 10ms, lr: 0.0001, overflow cond: False, loss_scale: 1.0, global_norm: [1.0]\n")
    refused(capsys, ["compare", log, log, "--json", tmp_path / "c.json"],
            "holds Megatron-LM iteration log lines and MindSpore Transformers MFLossMonitor log lines; compare "
            "reads one format per file", tmp_path / "c.json")


# ---------------------------------------------------------------- PEFT adapter_config.json fields

def _peft(folder, tiny, config=None, dtype=np.float32):
    """A PEFT folder for q_proj of layer 0 of the tiny model (rank 2)."""
    folder.mkdir()
    prefix = "base_model.model.model.layers.0.self_attn.q_proj"
    save_file({f"{prefix}.lora_A.weight": np.ones((2, 32), dtype), f"{prefix}.lora_B.weight": np.ones((32, 2), dtype)},
              str(folder / "adapter_model.safetensors"))
    base = {"peft_type": "LORA", "r": 2, "lora_alpha": 4, "lora_dropout": 0.0, "target_modules": ["q_proj"],
            "bias": "none", "use_dora": False, "fan_in_fan_out": False}
    (folder / "adapter_config.json").write_text(json.dumps({**base, **(config or {})}))
    return folder


@pytest.mark.parametrize("init", [True, False, "gaussian", "eva", "orthogonal"])  # the base left as it was
def test_a_plain_peft_adapter_imports(tiny, tmp_path, init):
    assert main(["lora", "import", str(_peft(tmp_path / "peft", tiny, {"init_lora_weights": init})),
                 str(tmp_path / "out"), "--model", str(tiny / "ms")]) == 0


@pytest.mark.parametrize("config, dtype, words", [
    ({"layer_replication": [[0, 2], [1, 2]]}, np.float32, "layer_replication (layers repeated from the base)"),
    ({"target_parameters": ["mlp.experts.down_proj"]}, np.float32, "target_parameters (LoRA on parameters"),
    ({"trainable_token_indices": [0, 1]}, np.float32, "trainable_token_indices (trained embedding rows)"),
    ({"use_dora": "true"}, np.float32, "use_dora must be true or false, got 'true'"),   # a string was read as off
    ({"lora_something_new": {"k": 1}}, np.float32, "'lora_something_new' is not a LoraConfig field of PEFT 0.21"),
    ({}, np.int8, "is I8; LoRA weights are floating point"),            # int8 A and B were cast and imported
    # these subtract their initial B·A from the base weights: imported as plain LoRA on the original base before
    ({"init_lora_weights": "pissa"}, np.float32, "init_lora_weights 'pissa' (PiSSA) changed the base model's weights"),
    ({"init_lora_weights": "pissa_niter_4"}, np.float32, "init_lora_weights 'pissa_niter_4' (PiSSA) changed"),
    ({"init_lora_weights": "olora"}, np.float32, "init_lora_weights 'olora' (OLoRA) changed the base model's"),
    ({"init_lora_weights": "corda"}, np.float32, "(CorDA) changed the base model's weights"),
    ({"init_lora_weights": "loftq"}, np.float32, "(LoftQ) changed the base model's weights"),
    ({"init_lora_weights": "mica"}, np.float32, "init_lora_weights 'mica' (MiCA: lora_B frozen in training)"),
    ({"init_lora_weights": "pissa_plus"}, np.float32, "init_lora_weights 'pissa_plus' is not an initialisation"),
    ({"init_lora_weights": ["pissa"]}, np.float32, "init_lora_weights ['pissa'] is not an initialisation"),
    ({"init_lora_weights": 1}, np.float32, "init_lora_weights 1 is not an initialisation"),
])
def test_peft_features_lora_cannot_express_are_refused(tiny, tmp_path, capsys, config, dtype, words):
    peft = _peft(tmp_path / "peft", tiny, config, dtype)
    refused(capsys, ["lora", "import", peft, tmp_path / "out", "--model", tiny / "ms"], words, tmp_path / "out")
