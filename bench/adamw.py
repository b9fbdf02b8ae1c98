"""One AdamW step on CPU at ~126 M parameters: torch.optim.AdamW against the trainer's AdamW
(migrate/train/optim.py) as the op-by-op graph and as the fused in-place kernel, side by side in
one process, alternating; then the whole optimizer phase: the trainer's split-step `OptimizerStep`
(norm graph + clip-and-step graph over accumulator Parameters, zeroing them) against the golden's
clip_grad_norm_(params, 1.0) + AdamW.step() + zero_grad(set_to_none=True) (its extra
get_total_norm for the logged clipped norm left out: the stricter baseline).

    python bench/adamw.py [--repeats 3] [--steps 6]

The tensors are a Llama's at hidden 768, 16 layers, intermediate 2048, vocab 8192 (147 tensors,
two decay groups as the trainer forms them). Each timing is the median step of `--steps` (the first,
compile and warm-up, left out); the figures are medians over the repeats with the min-max spread.
Target lines: `target adamw_step: fused ÷ torch (<= TARGET) PASS|FAIL`, the optimizer's share of
issue "speed where users wait", and `target optimizer_phase: ...` (issue 28 item 3), the same
phase bench/train_speed.py profiles inside whole runs. The gradients are refilled before each
step, outside the timing (they are large enough, norm ~112, for max_norm 1 to clip every step).
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


def torch_phase_s(values, grads, steps: int) -> float:
    import torch

    params = [torch.nn.Parameter(torch.from_numpy(v.copy())) for v in values]
    opt = torch.optim.AdamW([{"params": params[::2], "weight_decay": 0.1},
                             {"params": params[1::2], "weight_decay": 0.0}], lr=1e-3)
    times = []
    for _ in range(steps):
        for p, g in zip(params, grads, strict=True):
            p.grad = torch.from_numpy(g.copy())  # clip_grad_norm_ scales in place
        start = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)  # as golden/train_torch.py
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def mindspore_phase_s(values, grads, steps: int) -> float:
    import mindspore as ms
    from mindspore import Parameter, ParameterTuple, Tensor

    from migrate.train.optim import AdamW, GradClipper
    from migrate.train.step.optimizer import OptimizerStep

    ms.set_context(mode=ms.GRAPH_MODE)
    params = [Parameter(Tensor(v.copy()), name=f"w{i}") for i, v in enumerate(values)]
    opt = AdamW([{"params": params[::2], "weight_decay": 0.1}, {"params": params[1::2], "weight_decay": 0.0}],
                lr=1e-3)
    index = {id(p): i for i, p in enumerate(params)}
    order = [index[id(p)] for p in opt.parameters]
    acc = ParameterTuple([Parameter(Tensor(grads[i].copy()), name=f"acc{i}", requires_grad=False) for i in order])
    step = OptimizerStep(GradClipper(1.0), opt, acc)
    times = []
    for _ in range(steps):
        for a, i in zip(acc, order, strict=True):
            a.set_data(Tensor(grads[i].copy()))  # zeroed by the last step, as the micro-steps refill them
        start = time.perf_counter()
        step.measure(1.0)
        step.finish(apply=True)  # returns the clipped norm as a float: the graph is done
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
    if fused_ok:
        print(f"  MindSpore fused kernel, in place  {fmt(runs['fused'])}")
    phase = {"torch": [], "ms": []}
    for _ in range(args.repeats):
        phase["torch"].append(torch_phase_s(values, grads, args.steps))
        phase["ms"].append(mindspore_phase_s(values, grads, args.steps))
    print(f"\nOptimizer phase (clip max_norm 1.0 + AdamW + gradients zeroed), same tensors, seconds\n"
          f"  torch clip_grad_norm_ + AdamW.step + zero_grad   {fmt(phase['torch'])}\n"
          f"  MindSpore OptimizerStep measure + finish          {fmt(phase['ms'])}"
          f"{'' if fused_ok else ' (op-by-op graph: no fused kernel)'}\n")
    if fused_ok:
        target_line("adamw_step", "torch's step time", runs["fused"], runs["torch"])
    else:
        print("target adamw_step: no fused kernel here (no C++ compiler, or MIGRATE_FUSED_ADAMW=off) FAIL")
    target_line("optimizer_phase", "torch's clip + AdamW time", phase["ms"], phase["torch"])
    return 0


def target_line(name: str, what: str, ours: list[float], torch: list[float]) -> None:
    ratios = [a / b for a, b in zip(ours, torch, strict=True)]
    ratio = statistics.median(ratios)
    print(f"target {name}: {ratio:.2f}× {what} ({min(ratios):.2f}–{max(ratios):.2f}; "
          f"≤ {TARGET:g}) {'PASS' if ratio <= TARGET else 'FAIL'}")


if __name__ == "__main__":
    sys.exit(main())
