"""A tiny end-to-end training setup shared by the trainer, resume and hparams tests.

Tiny HF Llama (random weights, no download) + its MindSpore conversion, a BPE
tokenizer trained on three stdlib modules, the tokenized corpus (679 rows of
16 + 1 tokens) and a run.yaml both sides read.
"""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from hf_fixtures import build_hf_model, save_hf_model
from migrate.convert import convert
from migrate.data.corpus import train_bpe_tokenizer, write_stdlib_corpus
from migrate.data.tokenize import tokenize_corpus
from migrate.train.config import RunConfig

REPO = Path(__file__).resolve().parent.parent
VOCAB = 320
RUN = """\
hf_model: hf
ms_model: ms
data: data
seq_length: 16
micro_batch_size: 4
grad_accum_steps: 2
total_steps: 200
max_grad_norm: 1.0
data_seed: 5
optimizer: {lr: 3e-3, weight_decay: 0.1}
schedule: {name: cosine, warmup_steps: 20, min_lr_rate: 0.1}
out_dir: {golden: golden, ms: ms_out}
"""


def make_run_dir(root: Path, variant: str = "gqa", run_yaml: str = RUN) -> Path:
    files = write_stdlib_corpus(root / "corpus", modules=["textwrap", "heapq", "json"])
    train_bpe_tokenizer(files, VOCAB, root / "tok")
    tokenize_corpus(files, root / "tok", 16, root / "data")
    save_hf_model(build_hf_model(variant, vocab_size=VOCAB), root / "hf")
    convert(root / "hf", root / "ms")
    (root / "run.yaml").write_text(run_yaml)
    return root


def load_cfg(root: Path, **changes) -> RunConfig:
    cfg = RunConfig.load(root / "run.yaml")
    return cfg.replace(**changes) if changes else cfg


def load_golden():
    spec = importlib.util.spec_from_file_location("golden_train_torch_for_trainer_tests",
                                                  REPO / "golden" / "train_torch.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines() if line.strip()]


def rel(a: float, b: float) -> float:
    return abs(a - b) / abs(a)
