"""Pieces of the conversion benchmark, shared with tests/test_convert_memory.py.

- `make_llama(folder, size)`: a synthetic HF Llama checkpoint of about `size`
  bytes (config.json + sharded bf16 safetensors + index), written in a few
  seconds from a small pool of random values: no torch model is built.
- `measure(mode, src, out)`: runs one conversion in a child process
  (`python harness.py child MODE SRC OUT`) and returns its wall time, the
  conversion time it reports and its peak RSS (the child's own VmHWM).
  Modes: "ours" (`migrate.convert.convert`), "whole" (the field's way: the
  whole state dict loaded with `safetensors.torch.load_file`, renamed, then
  `mindspore.save_checkpoint`), "idle" (imports only, for the fixed overhead).
"""
from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
GiB = 2**30

# Width presets, largest first; `make_llama` picks the first whose fixed part fits.
WIDTHS = [
    dict(hidden_size=2048, intermediate_size=5632, num_attention_heads=32, num_key_value_heads=4, vocab_size=32000),
    dict(hidden_size=1024, intermediate_size=2816, num_attention_heads=16, num_key_value_heads=4, vocab_size=8192),
    dict(hidden_size=256, intermediate_size=688, num_attention_heads=8, num_key_value_heads=2, vocab_size=1024),
]


def parse_size(text: str | int) -> int:
    from migrate.checkpoints.sharding import parse_size as parse

    return parse(text)


def llama_tensors(cfg: dict) -> list[tuple[str, tuple[int, ...]]]:
    """HF Llama parameter names and shapes, in HF's state_dict order."""
    h, i, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    head = h // cfg["num_attention_heads"]
    kv = cfg["num_key_value_heads"] * head
    out = [("model.embed_tokens.weight", (v, h))]
    for n in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{n}."
        out += [
            (p + "self_attn.q_proj.weight", (h, h)), (p + "self_attn.k_proj.weight", (kv, h)),
            (p + "self_attn.v_proj.weight", (kv, h)), (p + "self_attn.o_proj.weight", (h, h)),
            (p + "mlp.gate_proj.weight", (i, h)), (p + "mlp.up_proj.weight", (i, h)),
            (p + "mlp.down_proj.weight", (h, i)),
            (p + "input_layernorm.weight", (h,)), (p + "post_attention_layernorm.weight", (h,)),
        ]
    out += [("model.norm.weight", (h,)), ("lm_head.weight", (v, h))]
    return out


def llama_config(size: int) -> dict:
    for widths in WIDTHS:
        cfg = dict(widths, num_hidden_layers=1)
        fixed = _nbytes(llama_tensors(cfg))
        cfg["num_hidden_layers"] = 2
        per_layer = _nbytes(llama_tensors(cfg)) - fixed
        if size >= fixed + per_layer or widths is WIDTHS[-1]:
            layers = max(1, round((size - fixed + per_layer) / per_layer))
            break
    return dict(
        widths, num_hidden_layers=layers, architectures=["LlamaForCausalLM"], model_type="llama",
        max_position_embeddings=2048, rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
        hidden_act="silu", torch_dtype="bfloat16", bos_token_id=1, eos_token_id=2,
    )


def _nbytes(tensors, itemsize=2) -> int:
    return sum(math.prod(shape) * itemsize for _, shape in tensors)


def make_llama(folder: Path, size: int, shard_size: int = GiB, seed: int = 0) -> dict:
    """Write a synthetic bf16 HF Llama of about `size` bytes; return facts about it."""
    from migrate.checkpoints.dtypes import bfloat16
    from migrate.checkpoints.ms_safetensors import SafetensorsWriter
    from migrate.checkpoints.sharding import plan_shards

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    cfg = llama_config(size)
    tensors = llama_tensors(cfg)
    # 8 MiB of normal(0, 0.02) values as raw bf16 bits (truncated from fp32), reused at random offsets.
    rng = np.random.default_rng(seed)
    pool = (rng.normal(0, 0.02, 4 * 2**20).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    pool = pool.view(np.uint8)
    shards = plan_shards([(n, math.prod(s) * 2) for n, s in tensors], shard_size)
    shape_of = dict(tensors)
    weight_map = {}
    for k, names in enumerate(shards):
        file = "model.safetensors" if len(shards) == 1 else f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        specs = [(n, bfloat16, shape_of[n]) for n in names]
        with SafetensorsWriter(folder / file, specs, metadata={"format": "pt"}) as writer:
            for name in names:
                with writer.open_tensor(name, bfloat16, shape_of[name]) as stream:
                    left = math.prod(shape_of[name]) * 2
                    while left:
                        start = int(rng.integers(0, pool.size // 2)) * 2
                        n = min(left, pool.size - start)
                        stream.write(pool[start:start + n])
                        left -= n
        weight_map.update({n: file for n in names})
    total = _nbytes(tensors)
    if len(shards) > 1:
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    largest = max(math.prod(s) * 2 for _, s in tensors)
    return {"config": cfg, "tensors": len(tensors), "total_bytes": total, "largest_bytes": largest,
            "files": sorted(set(weight_map.values()))}


# ---------------------------------------------------------------- children
def child_ours(src: str, out: str, fmt: str, max_shard_size: str | None, reps: int, with_hash: bool) -> dict:
    """`reps` timed conversions (each output deleted and synced, untimed, before the
    next); with `with_hash`, each rep also runs once with --hash-sources."""
    from migrate.convert import convert
    from migrate.hf_config import load_hf_config

    load_hf_config(Path(src))  # imports transformers (and torch) now: a fixed cost, not timed
    times: dict[str, list[float]] = {"seconds": [], "hashed_seconds": []}
    cpu: dict[str, list[float]] = {"seconds": [], "hashed_seconds": []}
    for _ in range(reps):
        for key in ("seconds", "hashed_seconds") if with_hash else ("seconds",):
            clean(Path(out))
            started, cpu_started = time.perf_counter(), _cpu_seconds()
            convert(src, out, fmt=fmt, max_shard_size=max_shard_size, hash_sources=key == "hashed_seconds")
            times[key].append(time.perf_counter() - started)
            cpu[key].append(_cpu_seconds() - cpu_started)
    result = {key: min(values) for key, values in times.items() if values}
    result |= {f"cpu_{key}": min(values) for key, values in cpu.items() if values}
    return result | {"runs": times}


def _cpu_seconds() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)  # every thread of this process
    return usage.ru_utime + usage.ru_stime


def child_whole(src: str, out: str, fmt: str, max_shard_size: str | None, reps: int, with_hash: bool) -> dict:
    """What the field's converters do: the whole state dict in memory, renamed,
    each tensor made a MindSpore tensor, then one `mindspore.save_checkpoint`."""
    import mindspore as ms
    from safetensors.torch import load_file

    from migrate.checkpoints.dtypes import torch_to_numpy
    from migrate.keymap import Keymap
    from migrate.models.config import LlamaConfig

    started, cpu_started = time.perf_counter(), _cpu_seconds()  # the imports above are a fixed cost
    src = Path(src)
    index = src / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.is_file() \
        else ["model.safetensors"]
    state = {}
    for file in files:
        state.update(load_file(str(src / file)))
    hf = json.loads((src / "config.json").read_text())
    km = Keymap.load("hf_llama")
    fields = km.hf_to_ms_config(hf)
    pairs, _ = km.pairs(LlamaConfig.from_dict(fields).to_dict())
    params = []  # the list form MindFormers' convert_weight scripts build
    for pair in pairs:
        params.append({"name": pair.dst, "data": ms.Tensor(torch_to_numpy(state.pop(pair.src)))})
    Path(out).mkdir(parents=True, exist_ok=True)
    ms.save_checkpoint(params, str(Path(out) / "model.ckpt"))
    return {"seconds": time.perf_counter() - started, "cpu_seconds": _cpu_seconds() - cpu_started}


def child_idle(src: str, out: str, fmt: str, max_shard_size: str | None, reps: int, with_hash: bool) -> dict:
    import migrate.convert  # noqa: F401  (what "ours" imports before converting)
    from migrate.hf_config import load_hf_config

    load_hf_config(Path(src))
    return {"seconds": 0.0}


CHILDREN = {"ours": child_ours, "whole": child_whole, "idle": child_idle}


@dataclass
class Run:
    mode: str
    wall: float          # the child process, imports included
    seconds: float       # the conversion itself, as the child timed it (best of its reps)
    peak_rss: int        # bytes
    detail: dict


def measure(mode: str, src: Path, out: Path, fmt: str = "ckpt", max_shard_size: str | None = None,
            reps: int = 1, with_hash: bool = False) -> Run:
    env = dict(os.environ, GLOG_v="3", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE.parent), env.get("PYTHONPATH")]))
    argv = [sys.executable, str(HERE / "harness.py"), "child", mode, str(src), str(out), "--fmt", fmt,
            "--reps", str(reps)] + (["--shard", max_shard_size] if max_shard_size else []) + \
        (["--with-hash"] if with_hash else [])
    with tempfile.TemporaryFile() as stdout, tempfile.TemporaryFile() as stderr:
        started = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=stdout, stderr=stderr, env=env)
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own rusage
        wall = time.perf_counter() - started
        proc.returncode = code = os.waitstatus_to_exitcode(status)
        stdout.seek(0), stderr.seek(0)
        out_text, err_text = stdout.read().decode(), stderr.read().decode(errors="replace")
    lines = [ln for ln in out_text.splitlines() if ln.startswith("{")]
    if code != 0 or not lines:
        raise RuntimeError(f"{mode} child failed ({code}):\n{err_text[-3000:]}")
    detail = json.loads(lines[-1])
    peak = detail.get("peak_rss") or usage.ru_maxrss * 1024  # ru_maxrss where /proc is absent
    return Run(mode, wall, detail["seconds"], peak, detail)


def time_cp(files: list[Path], dest: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one `cp` of `files` into `dest`."""
    dest.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    proc = subprocess.Popen(["cp", *map(str, files), str(dest)])
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError("cp failed")
    return time.perf_counter() - started, usage.ru_utime + usage.ru_stime


def clean(path: Path) -> None:
    """Remove an output and flush dirty pages, so no run pays for the previous one's writeback."""
    shutil.rmtree(path, ignore_errors=True)
    os.sync()


def _child_main(argv: list[str]) -> None:
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=sorted(CHILDREN))
    parser.add_argument("src")
    parser.add_argument("out")
    parser.add_argument("--fmt", default="ckpt")
    parser.add_argument("--shard")
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--with-hash", action="store_true")
    args = parser.parse_args(argv)
    result = CHILDREN[args.mode](args.src, args.out, args.fmt, args.shard, args.reps, args.with_hash)
    print(json.dumps(result | {"peak_rss": _own_peak_rss()}))


def _own_peak_rss() -> int | None:
    """This process's peak resident memory (VmHWM), in bytes. Not ru_maxrss: the
    kernel carries the parent's high-water mark into a child spawned with vfork
    across exec, so a child of a big process (a pytest run) reports at least its
    parent's peak."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "child":
        _child_main(sys.argv[2:])
    else:
        sys.exit("usage: harness.py child MODE SRC OUT [--fmt F] [--shard S] [--reps N] [--with-hash] "
                 "(run bench/convert.py instead)")
