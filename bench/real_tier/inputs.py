"""Inputs some steps need that no migrate command makes: a LoRA adapter, a faulted MindSpore copy,
run.yaml files; and the checks on outputs that a verdict line does not cover.

Each runs in the calling process (the tests' or the bench's); only the migrate commands are measured.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import yaml

LORA_SEED = 23
LORA_B_STD = 0.02  # small, but the adapter moves the logits: B = 0 (PEFT's init) would be a no-op


def make_lora_adapter(hf_dir: Path, out: Path) -> None:
    """A PEFT LoRA adapter (r 8 on q_proj, v_proj) for the HF model, its B matrices seeded random."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(LORA_SEED)  # PEFT's kaiming-uniform A
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
    draw = torch.Generator().manual_seed(LORA_SEED)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=draw) * LORA_B_STD)
    model.save_pretrained(out)


def swap_bert_query_weights(ms_dir: Path, out: Path, layers: tuple[int, int]) -> None:
    """A copy of a converted BERT folder with two layers' query weights exchanged in the
    checkpoint: a real fault (a layer index off by one), made outside migrate's fault catalogue."""
    import mindspore as ms

    shutil.copytree(ms_dir, out)
    params = ms.load_checkpoint(str(out / "model.ckpt"))
    a, b = (_one_name(params, f"layer.{n}.attention.wq.weight") for n in layers)
    params[a], params[b] = params[b], params[a]
    ms.save_checkpoint([{"name": name, "data": ms.Tensor(p.asnumpy())} for name, p in params.items()],
                       str(out / "model.ckpt"))


def _one_name(params: dict, suffix: str) -> str:
    names = [n for n in params if n.endswith(suffix)]
    if len(names) != 1:
        raise ValueError(f"expected one parameter ending in {suffix}, found {names}")
    return names[0]


def write_run_yaml(path: Path, *, hf: str, ms: str, data: str, golden_out: str, ms_out: str,
                   weight_decay: float = 0.1) -> None:
    """A 6-step fp32 continued-pretraining run both trainers read."""
    run = {
        "hf_model": hf, "ms_model": ms, "data": data,
        "seq_length": 128, "total_steps": 6, "micro_batch_size": 2, "grad_accum_steps": 2,
        "max_grad_norm": 1.0, "seed": 42, "dtype": "fp32",
        "peak_flops": 1.0e11,  # MFU only; given, so neither side spends time measuring a peak
        "optimizer": {"lr": 3.0e-4, "betas": [0.9, 0.95], "eps": 1.0e-8, "weight_decay": weight_decay},
        "schedule": {"name": "cosine", "warmup_steps": 2, "min_lr": 3.0e-5},
        "out_dir": {"golden": golden_out, "ms": ms_out},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(run, sort_keys=False))


def export_differences(hf_dir: Path, ms_dir: Path, exported: Path) -> list[str]:
    """Every tensor `migrate export` wrote must equal the source's bit for bit, and the source
    tensors it did not write must be the buffers conversion.json records as ignored."""
    source, back = _read_safetensors(hf_dir), _read_safetensors(exported)
    ignored = {entry["name"] if isinstance(entry, dict) else entry
               for entry in json.loads((ms_dir / "conversion.json").read_text()).get("ignored", [])}
    problems = [f"{name}: exported but not in the source" for name in sorted(set(back) - set(source))]
    problems += [f"{name}: in the source, not exported, not recorded as ignored"
                 for name in sorted(set(source) - set(back) - ignored)]
    for name in sorted(set(source) & set(back)):
        a, b = source[name], back[name]
        if a.dtype != b.dtype or a.shape != b.shape or a.tobytes() != b.tobytes():
            problems.append(f"{name}: {a.dtype}{list(a.shape)} in the source, {b.dtype}{list(b.shape)} exported, "
                            "not bit-identical")
    return problems


def _read_safetensors(folder: Path) -> dict:
    from safetensors.numpy import load_file

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors file in {folder}")
    tensors = {}
    for file in files:
        tensors.update(load_file(str(file)))
    return tensors


def generated_rows(stdout: str) -> list[str]:
    """The text of each row `migrate generate` printed (`[i] text`, possibly over several lines)."""
    rows: list[str] = []
    for line in stdout.splitlines():
        head, _, rest = line.partition("] ")
        if line.startswith("[") and head[1:].isdigit() and int(head[1:]) == len(rows):
            rows.append(rest)
        elif rows and not _is_summary(line):
            rows[-1] += "\n" + line
        elif rows:
            break
    return rows


def _is_summary(line: str) -> bool:
    # "2 × 24 tokens (greedy; ...)" and "vs HF generate: ..." close the rows
    return " tokens (" in line or line.startswith("vs HF generate")
