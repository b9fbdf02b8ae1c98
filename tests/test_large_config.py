"""`migrate hparams` and `migrate plan` on a 70B-shaped config.json in bounded memory (issue 18).

A Llama-2-70B shape (8192 hidden, 80 layers, 64 heads / 8 KV heads, 28672 FFN, 32000 vocab) holds
69 B parameters: 276 GB in fp32, 1.1 TB with AdamW's moments. Both commands run in a child process
whose address space is capped at 3 GiB (RLIMIT_AS; MindSpore's own runtime reserves ~2 GiB of it) and
must report a peak RSS under 2 GB: the golden side builds its HF model on torch's meta device, the
MindSpore side its model and AdamW moments under `mindspore.nn.utils.no_init_parameters` (shapes, no
data), and the planner reads config.json alone. No weights file exists at all.
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest

LLAMA_70B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8192,
             "intermediate_size": 28672, "num_attention_heads": 64, "num_key_value_heads": 8,
             "num_hidden_layers": 80, "vocab_size": 32000, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
             "rope_theta": 10000.0, "tie_word_embeddings": False, "hidden_act": "silu", "torch_dtype": "bfloat16"}
RUN = """\
hf_model: hf
data: data
seq_length: 4096
micro_batch_size: 1
grad_accum_steps: 8
total_steps: 20
max_grad_norm: 1.0
optimizer: {lr: 1.5e-4, weight_decay: 0.1}
schedule: {name: cosine, warmup_steps: 3, min_lr_rate: 0.1}
"""
CHILD = """\
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
from migrate.cli import main
rc = main(sys.argv[1:])
# VmHWM is this process's own high-water mark: ru_maxrss would carry the pytest parent's peak over
# the fork/exec that started it (a 2.1 GiB parent made a 0.8 GiB child read as 2.2 GiB).
hwm = next(line for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print("RC", rc, "PEAK_RSS_MIB", int(hwm.split()[1]) >> 10)
"""


def run_bounded(*args):
    # On glibc's malloc, as users run: `make test` preloads mimalloc, whose reserved (not used) address
    # space the RLIMIT_AS above would count against the bound.
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    out = subprocess.run([sys.executable, "-c", CHILD, *args], capture_output=True, text=True, env=env)
    tail = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else out.stderr[-2000:]
    assert out.returncode == 0 and tail.startswith("RC "), tail
    _, rc, _, peak = tail.split()
    return int(rc), int(peak), out.stdout


@pytest.mark.slow
def test_hparams_and_plan_on_a_70b_config_json_stay_under_2gb(tmp_path):
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text(json.dumps(LLAMA_70B))
    (tmp_path / "data").mkdir()
    (tmp_path / "run.yaml").write_text(textwrap.dedent(RUN))

    rc, peak, text = run_bounded("hparams", str(tmp_path / "run.yaml"))
    print(f"\nhparams 70B: exit {rc}, peak RSS {peak} MiB")
    assert rc == 0 and "all knobs agree" in text and peak < 2000
    assert "562 parameters" in text  # 80 layers x 7 matrices + embedding + lm_head decay; norms do not

    rc, peak, text = run_bounded("plan", "--model", str(tmp_path / "hf" / "config.json"), "--devices", "64",
                                 "--device-memory", "64GB", "--seq-length", "4096", "--global-batch", "512",
                                 "--dtype", "bf16")
    print(f"plan 70B: exit {rc}, peak RSS {peak} MiB")
    assert rc == 0 and peak < 2000 and "dp" in text


def test_hparams_on_a_config_json_of_a_family_that_does_not_train_is_one_line(tmp_path, capsys):
    from migrate.cli import main

    gpt2 = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": 64, "n_head": 4, "n_layer": 2,
            "n_positions": 128, "vocab_size": 256}
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text(json.dumps(gpt2))
    (tmp_path / "data").mkdir()
    (tmp_path / "run.yaml").write_text(textwrap.dedent(RUN).replace("seq_length: 4096", "seq_length: 64"))
    capsys.readouterr()
    code = main(["hparams", str(tmp_path / "run.yaml")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "trains the bundled Llama family" in err[0] and "GPT2" in err[0], err
