"""A tiny converted Llama (attention biases, GQA) and a run.yaml, for the MindFormers YAML tests.

No MindSpore and no data tokenization: `mindformers-config` and `hparams --mindformers`
read only data.json from the data folder.
"""
from __future__ import annotations

import json
from pathlib import Path

from hf_fixtures import build_hf_model, save_hf_model
from migrate.convert import convert
from train_setup import RUN as TRAIN_RUN

# train_setup's run.yaml, with a seed and no shuffling (MindFormers' dataset order) and betas of its own.
RUN = (TRAIN_RUN.replace("total_steps: 200", "total_steps: 40").replace("data_seed: 5", "seed: 3\nshuffle: false")
       .replace("lr: 3e-3,", "lr: 3.0e-3, betas: [0.9, 0.95],").replace("warmup_steps: 20", "warmup_steps: 5"))


def make_mf_root(root: Path, run_yaml: str = RUN) -> Path:
    save_hf_model(build_hf_model("gqa", attention_bias=True), root / "hf")
    convert(root / "hf", root / "ms")
    convert(root / "hf", root / "ms_fused", target="qkv_concat")
    (root / "data").mkdir()
    (root / "data" / "data.json").write_text(json.dumps({"format": "migrate-tokens", "version": 1, "seq_length": 16,
                                                         "samples": 400, "dtype": "int32",
                                                         "tokenizer": {"vocab_size": 128}}))
    (root / "run.yaml").write_text(run_yaml)
    return root
