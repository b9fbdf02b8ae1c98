"""`migrate diff` and `migrate dump` on a model of ≥ 200 M parameters, side by side in one run.

    python bench/diff.py [--layers 16] [--hidden 1024] [--workdir DIR] [--keep]

Builds an HF Llama from a config and a seed (fp32, safetensors), converts it, then runs each
measurement in a child process of its own (peak RSS is the child's own VmHWM, imports
included; times exclude the imports):

  bare HF / bare MS   load the model, one forward without hooks
  diff live           `migrate.align.run_diff` (HF vs converted, live), with HF's float64 twin (the
                      noise reference, the default) and with --reference none
  dump HF / MS        `migrate dump` in tensors mode and in statistics mode (HF: with its twin,
                      and once in tensors mode without)
  diff dumps          `diff_pair` on the two tensor dumps, and on the two statistics dumps

and prints: diff wall time ÷ the two bare runs (load + forward), dump size, and peak RSS ÷
one model's weights (fp32 bytes) per mode. Target: statistics mode peak RSS ≤ 1.3 × the
weights. Timings are never asserted in tests.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("GLOG_v", "3")
RSS_TARGET = 1.3


def _child(task: str, args: dict) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", json.dumps({"task": task, **args})],
                         capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"child {task} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _rss() -> int:
    """The child's own peak (VmHWM): ru_maxrss would carry over the spawning process's."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _import_frameworks(*names: str) -> None:
    """Times exclude the imports: the framework a task would import on its first call is imported
    before the clock starts (the peak RSS still includes it)."""
    for name in names:
        importlib.import_module(name)


def run_child(spec: dict) -> dict:
    task = spec["task"]
    if task == "build":
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM

        from migrate.convert import convert

        torch.manual_seed(0)
        config = LlamaConfig(vocab_size=32000, hidden_size=spec["hidden"], intermediate_size=spec["hidden"] * 11 // 4,
                             num_hidden_layers=spec["layers"], num_attention_heads=16, num_key_value_heads=8,
                             max_position_embeddings=512, tie_word_embeddings=False)
        model = LlamaForCausalLM(config)
        params = sum(p.numel() for p in model.parameters())
        model.save_pretrained(spec["hf"])
        del model
        convert(spec["hf"], spec["ms"], fmt="safetensors")
        return {"parameters": params}
    if task in ("bare_hf", "bare_ms"):
        from migrate.probe.inputs import seeded_inputs
        from migrate.probe.sides import call_model, open_side

        _import_frameworks("transformers" if task == "bare_hf" else "mindspore")
        started = time.perf_counter()
        side = open_side(spec["hf" if task == "bare_hf" else "ms"], "fp32", 0)
        call_model(side, seeded_inputs(side.vocab_size, 2, 16, 0, False))
        return {"seconds": time.perf_counter() - started, "rss": _rss()}
    if task == "diff_live":
        from migrate.align import run_diff

        _import_frameworks("mindspore", "transformers")
        started = time.perf_counter()
        report = run_diff(spec["hf"], spec["ms"], reference=spec.get("reference", "fp64"))
        return {"seconds": time.perf_counter() - started, "rss": _rss(), "passed": report.passed}
    if task == "dump":
        from migrate.probe import dump
        from migrate.probe.sides import side_kind

        _import_frameworks("transformers" if side_kind(spec["side"]) == "hf" else "mindspore")
        started = time.perf_counter()
        result = dump(spec["side"], spec["out"], inputs_file=spec["inputs"], statistics=spec["stats"],
                      reference=spec.get("reference", "fp64"))
        return {"seconds": time.perf_counter() - started, "rss": _rss(), "bytes": result.bytes,
                "records": result.records}
    if task == "diff_dumps":
        from migrate.probe import diff_pair

        started = time.perf_counter()
        report = diff_pair(spec["ref"], spec["got"])
        return {"seconds": time.perf_counter() - started, "rss": _rss(), "passed": report.passed,
                "verdict": report.verdict_text()}
    raise SystemExit(f"unknown task {task}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--workdir")
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--child")
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(run_child(json.loads(args.child))))
        return 0
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench_diff_"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        hf, ms_dir, inputs = str(work / "hf"), str(work / "ms"), str(work / "in.npz")
        params = _child("build", {"hf": hf, "ms": ms_dir, "layers": args.layers, "hidden": args.hidden})["parameters"]
        weights = params * 4
        print(f"model: HF Llama, {params / 1e6:.0f} M parameters, fp32 weights {weights / 2**30:.2f} GiB; "
              f"inputs 2×16 seeded ids")
        bare_hf, bare_ms = _child("bare_hf", {"hf": hf}), _child("bare_ms", {"ms": ms_dir})
        live = _child("diff_live", {"hf": hf, "ms": ms_dir})
        live_bare = _child("diff_live", {"hf": hf, "ms": ms_dir, "reference": "none"})
        dump_bare = _child("dump", {"side": hf, "out": str(work / "d_HF_noref"), "inputs": inputs, "stats": False,
                                    "reference": "none"})
        stats_bare = _child("dump", {"side": hf, "out": str(work / "d_HF_stats_noref"), "inputs": inputs,
                                     "stats": True, "reference": "none"})
        dumps = {}
        for side, path in (("HF", hf), ("MS", ms_dir)):
            for stats in (False, True):
                out = str(work / f"d_{side}_{'stats' if stats else 'tensors'}")
                dumps[side, stats] = _child("dump", {"side": path, "out": out, "inputs": inputs, "stats": stats})
                dumps[side, stats]["out"] = out
        diff_t = _child("diff_dumps", {"ref": dumps["HF", False]["out"], "got": dumps["MS", False]["out"]})
        diff_s = _child("diff_dumps", {"ref": dumps["HF", True]["out"], "got": dumps["MS", True]["out"]})
        bare = bare_hf["seconds"] + bare_ms["seconds"]
        print(f"\n{'run':<30}{'wall s':>9}{'÷ bare':>9}{'peak RSS GiB':>14}{'÷ weights':>11}{'dump MiB':>10}")
        rows = [("bare HF (load + forward)", bare_hf, None), ("bare MS (load + forward)", bare_ms, None),
                ("migrate diff, live", live, None), ("  … --reference none", live_bare, None),
                ("dump HF, tensors", dumps["HF", False], "b"), ("  … --reference none", dump_bare, "b"),
                ("dump HF, statistics", dumps["HF", True], "b"), ("  … --reference none", stats_bare, "b"),
                ("dump MS, tensors", dumps["MS", False], "b"),
                ("dump MS, statistics", dumps["MS", True], "b"), ("migrate diff, tensor dumps", diff_t, None),
                ("migrate diff, statistics dumps", diff_s, None)]
        for label, r, size in rows:
            ratio = f"{r['seconds'] / bare:>9.2f}" if "diff" in label or r is live_bare else f"{'':>9}"
            mib = f"{r['bytes'] / 2**20:>10.2f}" if size else f"{'':>10}"
            print(f"{label:<30}{r['seconds']:>9.2f}{ratio}{r['rss'] / 2**30:>14.2f}{r['rss'] / weights:>11.2f}{mib}")
        # The target is the recording's own cost: without the float64 twin, which widens the weights (2x) by design
        worst = max(stats_bare["rss"], dumps["MS", True]["rss"]) / weights
        print(f"\nverdicts: live {'PASS' if live['passed'] else 'FAIL'} · tensor dumps {diff_t['verdict'][:60]} · "
              f"statistics dumps {diff_s['verdict'][:60]}")
        print(f"statistics mode peak RSS ÷ weights, without the twin: {worst:.2f} (target ≤ {RSS_TARGET}) "
              f"{'ok' if worst <= RSS_TARGET else 'MISSED'}")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
