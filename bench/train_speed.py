"""Training throughput: the MindSpore trainer against the golden PyTorch script.

    python bench/train_speed.py [--steps 50] [--workdir DIR]

Builds the demo's setup (small Llama, BPE tokenizer on stdlib docstrings, one
run.yaml), trains it with the golden script and with `migrate train` one after
the other in this process, and prints tokens/s of each and their ratio. The
first MindSpore step pays the GRAPH_MODE compile, and the first golden step
torch's warm-up, so both are measured over steps 2..N from their own
metrics.jsonl `time` column. Same model, config, data and machine; no asserts.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("GLOG_v", "3")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def tokens_per_second(run_dir: Path) -> float:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    first, last = rows[0], rows[-1]
    return (last["tokens"] - first["tokens"]) / (last["time"] - first["time"])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--workdir", help="keep the setup and runs here (default: a temp folder)")
    args = parser.parse_args(argv)

    from migrate.demo_train import prepare
    from migrate.train.config import RunConfig
    from migrate.train.hparams import load_golden
    from migrate.train.trainer import train

    root = Path(args.workdir or tempfile.mkdtemp(prefix="bench_train_"))
    cfg = RunConfig.load(prepare(root)).replace(total_steps=args.steps)
    golden = load_golden().train(cfg, log=lambda *_: None)
    ms_run = train(cfg, progress=False)
    g, m = tokens_per_second(golden), tokens_per_second(ms_run)
    print(f"model: {cfg.ms_model} · {args.steps} steps · micro batch {cfg.micro_batch_size} × accum "
          f"{cfg.grad_accum_steps} × seq {cfg.seq_length} · fp32 · {os.cpu_count()} CPU cores")
    print(f"golden PyTorch      {g:10.0f} tokens/s")
    print(f"MindSpore trainer   {m:10.0f} tokens/s  (GRAPH_MODE)")
    print(f"ratio MindSpore / golden: {m / g:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
