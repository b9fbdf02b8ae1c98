"""`make demo`: build small HF Llama checkpoints locally, convert them, prove them.

For each model: save with HF's own `save_pretrained`, run `migrate convert`,
load the result into the bundled MindSpore Llama, compare logits and loss with
HF's PyTorch model on the same seeded token ids, and export back to HF to check
the round trip is bit-identical. Prints one table; exits 1 if any row fails.
"""
from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("GLOG_v", "3")

DEMO_DIR = Path("demo_out")
TOLERANCE = 1e-5

MODELS = {
    "llama-mha": dict(),
    "llama-gqa-tied": dict(num_key_value_heads=2, tie_word_embeddings=True),
    "llama3-rope-bias": dict(num_key_value_heads=4, attention_bias=True,
                             rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                              "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                              "original_max_position_embeddings": 64}),
}
BASE = dict(vocab_size=1024, hidden_size=128, intermediate_size=344, num_hidden_layers=4, num_attention_heads=8,
            num_key_value_heads=8, max_position_embeddings=256, rms_norm_eps=1e-5)


def build_hf(name: str, folder: Path, seed: int):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**{**BASE, **MODELS[name]})).eval()
    model.save_pretrained(folder, max_shard_size="500KB")  # sharded, like hub checkpoints
    return model


def prove(name: str, seed: int) -> dict:
    import mindspore as ms
    import torch

    from migrate.checkpoints.hf_reader import open_hf_checkpoint
    from migrate.convert import convert
    from migrate.export import export
    from migrate.models.loading import load_model

    root = DEMO_DIR / name
    shutil.rmtree(root, ignore_errors=True)
    hf = build_hf(name, root / "hf", seed)
    result = convert(root / "hf", root / "ms")
    ms.set_context(mode=ms.GRAPH_MODE)
    model, _ = load_model(root / "ms")

    ids = np.random.default_rng(seed).integers(0, BASE["vocab_size"], size=(2, 64))
    with torch.no_grad():
        ref = hf(input_ids=torch.from_numpy(ids), labels=torch.from_numpy(ids))
    tensor = ms.Tensor(ids.astype(np.int32))
    logits, loss, _ = model(tensor, None, tensor)
    max_abs = float(np.abs(ref.logits.numpy() - logits.asnumpy()).max())
    loss_rel = abs(float(ref.loss) - float(loss.asnumpy())) / float(ref.loss)

    export(root / "ms", root / "hf_roundtrip")
    with open_hf_checkpoint(root / "hf") as a, open_hf_checkpoint(root / "hf_roundtrip") as b:
        identical = a.names() and set(a.names()) == set(b.names()) and all(
            np.array_equal(a.read(n).view(np.uint8), b.read(n).view(np.uint8)) for n in a.names()
        )
    return dict(model=name, params=result.parameters, seconds=result.seconds, max_abs=max_abs,
                loss_rel=loss_rel, roundtrip=bool(identical),
                passed=max_abs <= TOLERANCE and loss_rel <= 1e-6 and bool(identical))


def main() -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # an entry point: local folders only, never the hub
    from rich.table import Table

    from migrate.ui import console

    started = time.perf_counter()
    rows = [prove(name, seed) for seed, name in enumerate(MODELS)]
    table = Table(title="migrate demo: HF Llama -> MindSpore, checked against HF's PyTorch model (fp32, GRAPH_MODE)")
    for col in ("model", "parameters", "conversion", "logits max abs vs HF", "loss rel diff", "round trip", "result"):
        table.add_column(col, justify="right" if col not in ("model", "result") else "left")
    for r in rows:
        table.add_row(r["model"], f"{r['params']:,}", f"{r['seconds']:.2f}s", f"{r['max_abs']:.2e}",
                      f"{r['loss_rel']:.2e}", "bit-identical" if r["roundtrip"] else "DIFFERS",
                      "[green]PASS[/]" if r["passed"] else "[red]FAIL[/]")
    console().print(table)
    console().print(f"tolerance: logits max abs ≤ {TOLERANCE:g}, loss rel ≤ 1e-6 · outputs in {DEMO_DIR}/ · "
                    f"{time.perf_counter() - started:.1f}s")

    from migrate.demo_train import run as continue_pretraining

    console().rule("continued pretraining: golden PyTorch vs MindSpore, same run.yaml")
    trained = continue_pretraining(DEMO_DIR / "pretrain", console())
    return 0 if all(r["passed"] for r in rows) and trained else 1


if __name__ == "__main__":
    sys.exit(main())
