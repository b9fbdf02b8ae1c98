"""One AdamW step on CPU at ~126 M parameters: torch.optim.AdamW against the trainer's AdamW
(migrate/train/optim.py) as the op-by-op graph and as the fused in-place kernel, side by side in
one process, alternating.

    python bench/adamw.py [--repeats 3] [--steps 6]

The tensors are a Llama's at hidden 768, 16 layers, intermediate 2048, vocab 8192 (147 tensors,
two decay groups as the trainer forms them). Each timing is the median step of `--steps` (the first,
compile and warm-up, left out); the figures are medians over the repeats with the min-max spread.
The last line: `target adamw_step: fused ÷ torch (<= TARGET) PASS|FAIL`, the optimizer's share of
issue "speed where users wait" (the trainer's whole phase, with the clip, is in bench/train_speed.py).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("GLOG_v", "3")
TARGET = 1.2
HIDDEN, INTER, LAYERS, VOCAB = 768, 2048, 16, 8192


def shapes() -> list[tuple[int, ...]]:
    layer = [(HIDDEN, HIDDEN)] * 4 + [(INTER, HIDDEN)] * 2 + [(HIDDEN, INTER), (HIDDEN,), (HIDDEN,)]
    return [(VOCAB, HIDDEN), *[s for _ in range(LAYERS) for s in layer], (HIDDEN,), (VOCAB, HIDDEN)]


def torch_step_s(values, grads, steps: int) -> float:
    import torch

    params = [torch.nn.Parameter(torch.from_numpy(v.copy())) for v in values]
    for p, g in zip(params, grads, strict=True):
        p.grad = torch.from_numpy(g)
    opt = torch.optim.AdamW([{"params": params[::2], "weight_decay": 0.1},
                             {"params": params[1::2], "weight_decay": 0.0}], lr=1e-3)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def mindspore_step_s(values, grads, steps: int, fused: bool) -> float:
    import mindspore as ms
    from mindspore import Parameter, Tensor

    from migrate.train.optim import AdamW

    ms.set_context(mode=ms.GRAPH_MODE)
    params = [Parameter(Tensor(v.copy()), name=f"w{i}") for i, v in enumerate(values)]
    opt = AdamW([{"params": params[::2], "weight_decay": 0.1}, {"params": params[1::2], "weight_decay": 0.0}],
                lr=1e-3, fused=fused)
    index = {id(p): i for i, p in enumerate(params)}
    g = ms.mutable(tuple(Tensor(grads[index[id(p)]]) for p in opt.parameters))
    times = []
    for _ in range(steps):
        args = opt.advance()
        start = time.perf_counter()
        opt.update(g, *args)
        opt.exp_avg[-1].asnumpy()  # a CPU graph call returns when done; read one result all the same
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def fmt(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.3f}–{max(values):.3f})"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args(argv)
    from migrate.train.kernels import adamw_op

    rng = np.random.default_rng(0)
    values = [rng.standard_normal(s).astype(np.float32) * 0.02 for s in shapes()]
    grads = [rng.standard_normal(s).astype(np.float32) * 0.01 for s in shapes()]
    print(f"AdamW step, {sum(v.size for v in values) / 1e6:.0f} M parameters in {len(values)} tensors, "
          f"{os.cpu_count()} CPU cores; median (min–max) of {args.repeats} alternating repeats, seconds")
    fused_ok = adamw_op() is not None
    runs = {"torch": [], "graph": [], "fused": []}
    for _ in range(args.repeats):
        runs["torch"].append(torch_step_s(values, grads, args.steps))
        runs["graph"].append(mindspore_step_s(values, grads, args.steps, fused=False))
        if fused_ok:
            runs["fused"].append(mindspore_step_s(values, grads, args.steps, fused=True))
    print(f"  torch.optim.AdamW                 {fmt(runs['torch'])}")
    print(f"  MindSpore op-by-op graph          {fmt(runs['graph'])}")
    if not fused_ok:
        print("target adamw_step: no fused kernel here (no C++ compiler, or MIGRATE_FUSED_ADAMW=off) FAIL")
        return 0
    print(f"  MindSpore fused kernel, in place  {fmt(runs['fused'])}")
    ratios = [f / t for f, t in zip(runs["fused"], runs["torch"], strict=True)]
    ratio = statistics.median(ratios)
    print(f"\ntarget adamw_step: {ratio:.2f}× torch's step time ({min(ratios):.2f}–{max(ratios):.2f}; "
          f"≤ {TARGET:g}) {'PASS' if ratio <= TARGET else 'FAIL'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
