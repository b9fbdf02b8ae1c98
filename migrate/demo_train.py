"""The continued-pretraining half of `make demo`: a small HF Llama with a BPE
tokenizer trained on the docstrings of Python's standard library, converted,
then trained 50 steps by the golden PyTorch script and by the MindSpore
trainer from one run.yaml; prints the `migrate compare` summary."""
from __future__ import annotations

import shutil
from pathlib import Path

RUN_YAML = """\
hf_model: hf
ms_model: ms
data: data
seq_length: 64
micro_batch_size: 4
grad_accum_steps: 2
total_steps: 50
max_grad_norm: 1.0
seed: 0
optimizer: {lr: 2.0e-3, weight_decay: 0.1}
schedule: {name: cosine, warmup_steps: 5, min_lr_rate: 0.1}
out_dir: {golden: runs/golden, ms: runs/ms}
"""
VOCAB = 1024
MODEL = dict(hidden_size=128, intermediate_size=344, num_hidden_layers=4, num_attention_heads=8,
             num_key_value_heads=4, max_position_embeddings=128, rms_norm_eps=1e-5)


def prepare(root: Path) -> Path:
    """Corpus, tokenizer, HF model (with the tokenizer in its folder), conversion, data, run.yaml."""
    from migrate.data.corpus import train_bpe_tokenizer, write_stdlib_corpus

    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    files = write_stdlib_corpus(root / "corpus")
    train_bpe_tokenizer(files, VOCAB, root / "tokenizer")
    return prepare_run(root, root / "tokenizer", files, MODEL, 64, RUN_YAML)


def prepare_run(root: Path, tokenizer: Path, files, model: dict, seq_length: int, run_yaml: str) -> Path:
    """In `root`: a seeded HF Llama of `model`'s shape on `tokenizer` (its files beside the weights),
    converted, `files` tokenized at `seq_length`, and run.yaml; returns run.yaml's path."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from migrate.convert import convert
    from migrate.data.tokenize import tokenize_corpus

    # The config's special ids are the tokenizer's (LlamaConfig's defaults, bos 1 / eos 2, would
    # make generation stop at <pad>; `migrate vocab check` flags exactly that).
    tok = AutoTokenizer.from_pretrained(tokenizer)
    ids = dict(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, **ids, **model)).save_pretrained(root / "hf")
    for f in Path(tokenizer).iterdir():
        shutil.copy2(f, root / "hf" / f.name)
    convert(root / "hf", root / "ms")
    tokenize_corpus(files, root / "hf", seq_length, root / "data")
    (root / "run.yaml").write_text(run_yaml)
    return root / "run.yaml"


def run(root: Path, console) -> bool:
    from migrate.compare import compare_runs, print_summary, write_plot
    from migrate.train.config import RunConfig
    from migrate.train.hparams import load_golden
    from migrate.train.trainer import train

    cfg = RunConfig.load(prepare(root))
    console.print("training 50 steps with the golden PyTorch script ...")
    golden = load_golden().train(cfg, log=lambda *_: None)
    console.print("training 50 steps with the MindSpore trainer ...")
    ms_run = train(cfg, progress=False)
    result = compare_runs(golden, ms_run, dtype="fp32")
    print_summary(result, console)
    write_plot(result, root / "runs" / "compare.png")
    console.print(f"loss curves: {root / 'runs' / 'compare.png'}")
    return result.passed
