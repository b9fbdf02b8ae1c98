"""Data-parallel throughput: `migrate train --dp 2` against one process, same global batch.

    python bench/train_dp.py [--steps 30] [--workdir DIR]

Builds the demo's setup (small Llama, BPE tokenizer on stdlib docstrings),
then trains it twice in this run, one after the other: `migrate train` in
one process (micro batch 4 × accumulation 2) and `migrate train --dp 2`
through msrun (micro batch 2 per rank × 2 ranks × accumulation 2), so both
take the same global batch of 8 × 64 tokens per step. tokens/s comes from
each run's own metrics.jsonl `time` column over steps 2..N (the first step
pays the GRAPH_MODE compile; msrun's start-up is outside both). Prints both
and their ratio; no asserts. On a machine with fewer cores than ranks × the
threads each MindSpore process uses, the ranks compete for the same cores.
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
sys.path.insert(0, str(Path(__file__).resolve().parent))

from migrate.run_protocol.record import TIME, TOKENS  # noqa: E402


def tokens_per_second(run_dir: Path) -> float:
    """Tokens/s from the end of the first step (its compile left out) to the last, from the run's own
    metrics.jsonl (`tokens`: every rank's tokens so far, `time`: seconds since the run started)."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    first, last = rows[0], rows[-1]
    return (last[TOKENS] - first[TOKENS]) / (last[TIME] - first[TIME])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--workdir", help="keep the setup and runs here (default: a temp folder)")
    args = parser.parse_args(argv)

    from migrate.cli import main as migrate
    from migrate.demo_train import RUN_YAML, prepare

    root = Path(args.workdir or tempfile.mkdtemp(prefix="bench_dp_"))
    run_yaml = prepare(root)
    one = RUN_YAML.replace("total_steps: 50", f"total_steps: {args.steps}")
    run_yaml.write_text(one)
    (root / "run_dp2.yaml").write_text(one.replace("micro_batch_size: 4", "micro_batch_size: 2"))
    if migrate(["train", "--config", str(run_yaml), "--out", str(root / "runs" / "dp1")]):
        return 1
    if migrate(["train", "--config", str(root / "run_dp2.yaml"), "--dp", "2", "--out", str(root / "runs" / "dp2")]):
        return 1
    dp1, dp2 = tokens_per_second(root / "runs" / "dp1"), tokens_per_second(root / "runs" / "dp2")
    print(f"model: {root / 'ms'} · {args.steps} steps · global batch 8 × seq 64 · fp32 · {os.cpu_count()} CPU cores")
    print(f"dp=1  one process                      {dp1:10.0f} tokens/s")
    print(f"dp=2  msrun, 2 workers (DATA_PARALLEL) {dp2:10.0f} tokens/s")
    print(f"ratio dp=2 / dp=1: {dp2 / dp1:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
