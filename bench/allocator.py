"""glibc's malloc against mimalloc under MindSpore: the same training run, whole processes, side by side.

    python bench/allocator.py [--repeats 3] [--steps 5] [--runs 4] [--workdir DIR]

`make test` runs its processes with mimalloc preloaded (the cmeel-mimalloc wheel; Makefile's
ON_MIMALLOC) because most of the suite is MindSpore's graph compiles and perf put about a fifth of a
test worker's CPU in glibc malloc's bin handling (_int_malloc, unlink_chunk, malloc_consolidate).
This bench shows what that buys a process that lives like a test worker: a child process trains the
demo's run.yaml (4-layer Llama, seq 64, micro batch 4 x accumulation 2) --runs times in a row for
--steps steps each (`migrate.train.trainer.train`, one graph compile per run), once on glibc's malloc
and once with LD_PRELOAD=libmimalloc, alternating, --repeats times each. Each child's CPU seconds
(user + system, from os.wait4; imports included) and wall seconds are printed with their medians; the
losses of both are checked equal (an allocator must not change a number). No asserts on timings.
One fresh `migrate train` process gains little (measured 0.98x for a 3-step run): glibc's heap is
quick until a long-lived process has fragmented it.

The last line: `target allocator_cpu: mimalloc / glibc CPU (<= BOUND) PASS|FAIL`.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("GLOG_v", "3")

CPU_BOUND = 0.9  # mimalloc must save at least a tenth of the CPU to be worth preloading
CHILD = """\
import json, sys
from pathlib import Path
from migrate.train.config import RunConfig
from migrate.train.trainer import train
config, out, runs = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
for run in range(runs):
    folder = train(RunConfig.load(config), out / f"run{run}", progress=False)
print(json.dumps([json.loads(line)["loss"] for line in (folder / "metrics.jsonl").read_text().splitlines()]))
"""


def mimalloc_path() -> Path | None:
    """libmimalloc from the cmeel-mimalloc wheel in this interpreter's site-packages, if installed."""
    import site

    for folder in site.getsitepackages():
        candidate = Path(folder) / "cmeel.prefix" / "lib" / "libmimalloc.so.3"
        if candidate.is_file():
            return candidate
    return None


def train_in_one_process(config: Path, out: Path, runs: int, preload: Path | None) -> tuple[float, float, list]:
    """(CPU s, wall s, last run's losses) of one child process that trains `runs` times."""
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    if preload is not None:
        env["LD_PRELOAD"] = str(preload)
    start = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(config), str(out), str(runs)], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    stdout, stderr = child.communicate()
    wall = time.perf_counter() - start
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # cumulative: the caller takes differences
    if child.returncode != 0:
        side = "mimalloc" if preload else "glibc"
        raise SystemExit(f"training failed ({side}): {stderr.decode(errors='replace').strip()[-500:]}")
    return usage.ru_utime + usage.ru_stime, wall, json.loads(stdout.decode().strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--runs", type=int, default=4, help="trainings in a row in each child process")
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
    print(f"demo model, {args.runs} trainings of {args.steps} steps in each child process; {preload}")
    print(f"{'run':>4}  {'allocator':9}  {'CPU s':>7}  {'wall s':>7}")
    for repeat in range(args.repeats):
        order = list(sides) if repeat % 2 == 0 else list(sides)[::-1]  # alternate who goes first
        for side in order:
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            total, w, curve = train_in_one_process(config, work / f"out_{side}_{repeat}", args.runs, sides[side])
            c = total - (before.ru_utime + before.ru_stime)
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
