"""The MFU basis both trainers log by: flops per token, the peak and where the peak came from.

MFU = flops_per_token * tokens_per_s / peak_flops. The peak is the one given, else run.yaml's
`peak_flops`, else measured here as the best fp32 matmul throughput of the trainer's framework
(`measure_peak`: the framework passes its own matmul), an achievable-peak estimate.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable

MFU_FORMULA = "flops_per_token * tokens_per_s / peak_flops"
PROBE_SIZE = 1024


def measure_peak(matmul: Callable[[], object], size: int = PROBE_SIZE, repeats: int = 5) -> float:
    """flop/s of the best of `repeats` calls of `matmul` (one size x size x size product, done when it
    returns), after one warm-up call."""
    matmul()  # warm up (kernel selection, threads)
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        matmul()
        best = min(best, time.perf_counter() - start)
    return 2.0 * size ** 3 / max(best, 1e-9)


def peak_basis(flops_per_token: float, *, given: float | None, config_peak: float | None,
               measure: Callable[[], float] | None, measured_source: str, unmeasured: str | None = None) -> dict:
    """{peak_flops, source, flops_per_token, mfu}: the given peak, else the config's, else `measure()`
    (measure None: peak 1.0 with the source `unmeasured`, a rank that logs no MFU)."""
    if given is not None:
        peak = {"peak_flops": float(given), "source": "given"}
    elif config_peak is not None:
        peak = {"peak_flops": float(config_peak), "source": "run config (peak_flops)"}
    elif measure is None:
        peak = {"peak_flops": 1.0, "source": unmeasured}
    else:
        peak = {"peak_flops": measure(), "source": measured_source}
    return {**peak, "flops_per_token": flops_per_token, "mfu": MFU_FORMULA}
