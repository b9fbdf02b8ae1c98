"""glibc's malloc against mimalloc under MindSpore: the same training run, whole processes, side by side.

    python bench/allocator.py [--repeats 5] [--steps 5] [--workdir DIR]

`make test` runs its processes with mimalloc preloaded (the cmeel-mimalloc wheel; Makefile's
ON_MIMALLOC) because most of the suite is MindSpore's graph compiles and perf put about a fifth of a
test worker's CPU in glibc malloc's bin handling (_int_malloc, unlink_chunk, malloc_consolidate).
This bench shows what that buys on one process: the demo's run.yaml (4-layer Llama, seq 64, micro
batch 4 x accumulation 2) trained for --steps steps by `migrate train` in a child process, once on
glibc's malloc and once with LD_PRELOAD=libmimalloc, alternating, --repeats times each. Each child's
CPU seconds (user + system, from os.wait4) and wall seconds are printed with their medians; the
losses of both are checked equal (an allocator must not change a number). No asserts on timings.

The last line: `target allocator_cpu: mimalloc / glibc CPU (<= BOUND) PASS|FAIL`.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("GLOG_v", "3")

CPU_BOUND = 0.9  # mimalloc must save at least a tenth of the CPU to be worth preloading


def mimalloc_path() -> Path | None:
    """libmimalloc from the cmeel-mimalloc wheel in this interpreter's site-packages, if installed."""
    import site

    for folder in site.getsitepackages():
        candidate = Path(folder) / "cmeel.prefix" / "lib" / "libmimalloc.so.3"
        if candidate.is_file():
            return candidate
    return None


def train_once(config: Path, out: Path, preload: Path | None) -> tuple[float, float, list[float]]:
    """(CPU s, wall s, losses) of one `migrate train` child process."""
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    if preload is not None:
        env["LD_PRELOAD"] = str(preload)
    start = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-m", "migrate", "train", "--config", str(config), "--out", str(out)],
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - start
    err = child.stderr.read().decode(errors="replace")
    child.stderr.close()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"migrate train failed ({'mimalloc' if preload else 'glibc'}): {err.strip()[-500:]}")
    losses = [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return usage.ru_utime + usage.ru_stime, wall, losses


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args(argv)
    preload = mimalloc_path()
    if preload is None:
        print("target allocator_cpu: no libmimalloc (pip install cmeel-mimalloc) FAIL")
        return 1
    from migrate.demo_train import prepare

    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench_allocator_"))
    run_yaml = prepare(work / "demo")
    text = run_yaml.read_text().replace("total_steps: 50", f"total_steps: {args.steps}")
    text = text.replace("warmup_steps: 5", f"warmup_steps: {min(5, args.steps)}")
    config = run_yaml.with_name("bench_run.yaml")
    config.write_text(text)

    sides = {"glibc": None, "mimalloc": preload}
    cpu, wall, losses = {s: [] for s in sides}, {s: [] for s in sides}, {}
    print(f"migrate train, demo model, {args.steps} steps, whole processes; {preload}")
    print(f"{'run':>4}  {'allocator':9}  {'CPU s':>7}  {'wall s':>7}")
    for repeat in range(args.repeats):
        order = list(sides) if repeat % 2 == 0 else list(sides)[::-1]  # alternate who goes first
        for side in order:
            c, w, curve = train_once(config, work / f"out_{side}_{repeat}", sides[side])
            cpu[side].append(c)
            wall[side].append(w)
            losses.setdefault(side, curve)
            print(f"{repeat + 1:>4}  {side:9}  {c:7.2f}  {w:7.2f}")
    same = losses["glibc"] == losses["mimalloc"]
    for side in sides:
        spread = f"{min(cpu[side]):.2f}-{max(cpu[side]):.2f}"
        print(f"median {side:9} CPU {statistics.median(cpu[side]):.2f} s ({spread}), "
              f"wall {statistics.median(wall[side]):.2f} s")
    ratio = statistics.median(cpu["mimalloc"]) / statistics.median(cpu["glibc"])
    wall_ratio = statistics.median(wall["mimalloc"]) / statistics.median(wall["glibc"])
    print(f"losses equal on both allocators: {same}")
    print(f"mimalloc / glibc: CPU {ratio:.2f}x, wall {wall_ratio:.2f}x")
    passed = same and ratio <= CPU_BOUND
    verdict = "PASS" if passed else "FAIL"
    print(f"target allocator_cpu: {ratio:.2f}x glibc's CPU (<= {CPU_BOUND}, losses equal) {verdict}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
