"""pair_sums.cc through ctypes: one compiled pass per tensor pair instead of a dozen numpy passes
per chunk (metrics.py's `_Sums`, which stays the path for other dtypes and where the kernel cannot
be had: no C++ compiler, a failed build, or MIGRATE_NATIVE_METRICS=off).

Profiled on a 254 M-parameter model's `diff --grads` (942 tensor pairs, three pairs an entry), the
numpy passes took 10.7 s of the run; bench/diff_metrics.py measures the two side by side.
"""
from __future__ import annotations

import ctypes
from functools import cache
from pathlib import Path

import numpy as np

from migrate import native

SOURCE = Path(__file__).with_name("pair_sums.cc")
ENV_SWITCH = "MIGRATE_NATIVE_METRICS"
POSITIONS = 5        # pair_sums.cc's kPositions (metrics.NONFINITE_POSITIONS)
_KINDS = {np.dtype(np.float32): 0, np.dtype(np.float64): 1}

_I64 = ctypes.c_int64
_F64P = np.ctypeslib.ndpointer(np.float64, flags="C_CONTIGUOUS")
_I64P = np.ctypeslib.ndpointer(np.int64, flags="C_CONTIGUOUS")


@cache
def _library(path: str):
    lib = ctypes.CDLL(path)
    lib.migrate_pair_sums.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int, _I64, _I64,
                                      ctypes.c_double, ctypes.c_double, ctypes.c_double, _F64P, _I64P]
    lib.migrate_abs_total.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int, _I64, _I64,
                                      _F64P, _I64P]
    return lib


def library():
    """The loaded kernel, or None (module docstring: when)."""
    if native.switched_off(ENV_SWITCH):
        return None
    built = native.build(SOURCE)
    return None if built is None else _library(str(built))


def handles(*arrays: np.ndarray) -> bool:
    """Whether the kernel reads these arrays as they are: float32 / float64, contiguous."""
    return all(a.dtype in _KINDS and a.flags.c_contiguous for a in arrays)


def abs_total(lib, a: np.ndarray, b: np.ndarray, chunk: int) -> tuple[float, int]:
    """sum |a| and the count over the positions finite on both sides."""
    total, count = np.zeros(1), np.zeros(1, np.int64)
    lib.migrate_abs_total(a.ctypes.data, _KINDS[a.dtype], b.ctypes.data, _KINDS[b.dtype], a.size, chunk, total, count)
    return float(total[0]), int(count[0])


def pair_sums(lib, a: np.ndarray, b: np.ndarray, chunk: int, floor: float | None,
              tolerances: tuple[float, float]) -> dict:
    """`_Sums`' fields for the pair (`floor` None: no relative figures)."""
    f, i = np.zeros(9), np.zeros(12 + 2 * POSITIONS, np.int64)
    lib.migrate_pair_sums(a.ctypes.data, _KINDS[a.dtype], b.ctypes.data, _KINDS[b.dtype], a.size, chunk,
                          -1.0 if floor is None else floor, *tolerances, f, i)
    n_ref, n_got = int(i[10]), int(i[11])
    return {
        "na2": float(f[0]), "nb2": float(f[1]), "dot": float(f[2]), "sum_abs_diff": float(f[3]),
        "sum_sq_diff": float(f[4]), "max_abs": float(f[5]), "ref_max": float(f[6]), "got_max": float(f[7]),
        "max_rel": float(f[8]), "n_finite": int(i[0]), "max_abs_at": int(i[1]), "within": [int(i[2]), int(i[3])],
        "nan_ref": int(i[4]), "nan_got": int(i[5]), "inf_ref": int(i[6]), "inf_got": int(i[7]),
        "mismatches": int(i[8]), "same_nonfinite": int(i[9]),
        "at_ref": [int(x) for x in i[12:12 + n_ref]],
        "at_got": [int(x) for x in i[12 + POSITIONS:12 + POSITIONS + n_got]],
    }
