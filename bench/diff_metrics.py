"""The report's figures of `migrate diff --grads`: pair_sums.cc against the numpy passes, side by side.

    python bench/diff_metrics.py [--layers 2] [--repeats 3]

A live diff's entry compares HF with MindSpore and each with HF's float64 twin: three pairs among
three arrays (`tensor_metrics_among`). This bench builds such triples for every weight of a Llama of
the bench harness's widest preset (hidden 2048; --layers of them) -- float32 HF and MindSpore
tensors a rounding apart, the twin in float64 -- and measures every entry's figures with the compiled
kernel and with the numpy path (MIGRATE_NATIVE_METRICS=off), alternating, --repeats times each, in this
one process. Every figure of the two must agree (counts and positions exactly, sums to 1e-12: they
are summed in another order). No asserts on timings.

The last line: `target diff_metrics: kernel / numpy seconds (<= BOUND) PASS|FAIL`.
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import WIDTHS, llama_tensors  # noqa: E402
from migrate.judge import metrics, pair_kernel  # noqa: E402

BOUND = 0.25   # the report's figures must cost at most a quarter of the numpy passes' time


def triples(layers: int, seed: int = 0):
    """(name, hf float32, ms float32, twin float64) for each weight, from one pool of random values."""
    cfg = dict(WIDTHS[0], num_hidden_layers=layers)
    rng = np.random.default_rng(seed)
    pool = rng.standard_normal(1 << 22).astype(np.float32)
    noise = (rng.standard_normal(1 << 22) * 1e-6).astype(np.float32)
    for name, shape in llama_tensors(cfg):
        n = math.prod(shape)
        start = int(rng.integers(0, pool.size))
        hf = np.resize(np.roll(pool, -start), n).reshape(shape)
        ms = hf + np.resize(noise, n).reshape(shape) * hf
        yield name, hf, ms, hf.astype(np.float64) + np.resize(noise, n).reshape(shape) * 0.5


def figures(entries, native: bool) -> tuple[float, list]:
    os.environ[pair_kernel.ENV_SWITCH] = "on" if native else "off"
    start = time.perf_counter()
    out = [metrics.tensor_metrics_among([hf, ms, twin], [(0, 1, True), (2, 0, True), (2, 1, True)])
           for _, hf, ms, twin in entries]
    return time.perf_counter() - start, out


def disagreements(a, b) -> list[str]:
    bad = []
    for entry_a, entry_b in zip(a, b, strict=True):
        for pa, pb in zip(entry_a, entry_b, strict=True):
            for key, va in pa.items():
                vb = pb[key]
                if isinstance(va, float) and isinstance(vb, float):
                    if not (va == vb or (math.isnan(va) and math.isnan(vb))
                            or abs(va - vb) <= 1e-12 * max(abs(va), abs(vb))):
                        bad.append(f"{key}: {va!r} vs {vb!r}")
                elif va != vb:
                    bad.append(f"{key}: {va!r} vs {vb!r}")
    return bad


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    if pair_kernel.library() is None:
        print("target diff_metrics: kernel not available (no C++ compiler or a failed build) (<= "
              f"{BOUND}) FAIL")
        return 1
    entries = list(triples(args.layers))
    elements = sum(hf.size for _, hf, _, _ in entries)
    print(f"{len(entries)} entries, {elements / 1e6:.0f} M elements each side, 3 pairs an entry")
    times = {True: [], False: []}
    results = {}
    for _ in range(args.repeats):
        for native in (False, True):
            seconds, results[native] = figures(entries, native)
            times[native].append(seconds)
    bad = disagreements(results[False], results[True])
    if bad:
        print(f"figures disagree ({len(bad)}): " + "; ".join(bad[:5]))
        return 1
    numpy_s, kernel_s = statistics.median(times[False]), statistics.median(times[True])
    for label, native in (("numpy passes", False), ("pair_sums.cc", True)):
        runs = " ".join(f"{t:.2f}" for t in times[native])
        print(f"{label:14s} median {statistics.median(times[native]):7.2f} s  (runs {runs})")
    ratio = kernel_s / numpy_s
    verdict = "PASS" if ratio <= BOUND else "FAIL"
    print(f"target diff_metrics: {ratio:.3f} kernel / numpy seconds (<= {BOUND}) {verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
