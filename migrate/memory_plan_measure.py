"""Measure the peak host memory of real training steps of the bundled model on CPU.

    python -m migrate.memory_plan_measure '{"config": {...}, "micro_batch": 2, "seq_length": 128, "steps": 2,
                                     "mode": "pynative"}'

prints one JSON line: baseline RSS after imports, peak RSS, their difference
(`growth`), and the parameter count. `migrate.memory_plan.measure_peak` runs this in a
subprocess so the measurement starts from a clean interpreter.

The step is the plain MindSpore recipe the trainer uses: the bundled
LlamaForCausalLM, `mindspore.experimental.optim.AdamW`, `ms.value_and_grad`
over the loss, fp32 on CPU.
"""
from __future__ import annotations

import gc
import json
import os
import resource
import sys
import threading
import time


def _rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _maxrss() -> int:
    """This process's own peak (VmHWM). ru_maxrss would carry over the high-water mark of the
    process that spawned it (vfork + exec): a child of a big pytest run reads as big as its parent."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux; where /proc is absent


class _Sampler(threading.Thread):
    """Peak RSS by sampling: a fallback for when the run never exceeds the import-time peak."""

    def __init__(self, interval: float = 0.01):
        super().__init__(daemon=True)
        self.interval, self.peak, self._halt = interval, 0, threading.Event()

    def run(self):
        while not self._halt.is_set():
            self.peak = max(self.peak, _rss())
            time.sleep(self.interval)

    def stop(self) -> int:
        self._halt.set()
        self.join()
        return max(self.peak, _rss())


def main(argv: list[str]) -> dict:
    args = json.loads(argv[0])
    os.environ.setdefault("GLOG_v", "3")
    import mindspore as ms
    import numpy as np
    from mindspore.experimental.optim import AdamW

    from migrate.models.config import LlamaConfig
    from migrate.models.llama import LlamaForCausalLM

    graph = args.get("mode", "pynative") == "graph"
    ms.set_device("CPU")
    ms.set_context(mode=ms.GRAPH_MODE if graph else ms.PYNATIVE_MODE)
    gc.collect()
    baseline = _rss()
    import_peak = _maxrss()
    sampler = _Sampler()
    sampler.start()

    config = LlamaConfig.from_dict(args["config"])
    model = LlamaForCausalLM(config, seed=0)
    model.set_train(True)
    params = model.trainable_params()
    optimizer = AdamW(params, lr=1e-4, weight_decay=0.0)

    def forward(ids):
        _, loss, _ = model(ids, None, ids)
        return loss

    grad_fn = ms.value_and_grad(forward, None, optimizer.parameters)

    def step(ids):
        loss, grads = grad_fn(ids)
        optimizer(grads)
        return loss

    if graph:
        step = ms.jit(step)
    rng = np.random.default_rng(0)
    shape = (args["micro_batch"], args["seq_length"])
    losses, times = [], []
    for _ in range(args.get("steps", 2)):
        ids = ms.Tensor(rng.integers(0, config.vocab_size, shape).astype(np.int32))
        t0 = time.perf_counter()
        losses.append(float(step(ids).asnumpy()))
        times.append(round(time.perf_counter() - t0, 2))
    sampled = sampler.stop()
    peak_rss = _maxrss()
    peak = peak_rss if peak_rss > import_peak else sampled
    return {
        "baseline": baseline,
        "peak": peak,
        "growth": peak - baseline,
        "params": int(sum(int(np.prod(p.shape)) for p in params)),
        "losses": losses,
        "step_s": times,
    }


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])))
