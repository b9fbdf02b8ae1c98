"""pair_sums.cc (migrate/judge/pair_kernel.py): every figure of `tensor_metrics` from one compiled
pass, the same as numpy's passes give (sums to 1e-12, as they are added in another order; counts,
positions and verdicts exactly), whatever the thread count; and numpy's path where the kernel is off,
cannot be built, or cannot read the arrays as they are."""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import migrate.judge.metrics as M
from migrate import native
from migrate.judge import pair_kernel
from migrate.judge.checks import judge

pytestmark = pytest.mark.skipif(pair_kernel.library() is None, reason="no C++ compiler here: numpy's path runs")


def _numpy_and_kernel(monkeypatch, *args, **kwargs):
    monkeypatch.setenv(pair_kernel.ENV_SWITCH, "off")
    slow = M.tensor_metrics(*args, **kwargs)
    monkeypatch.setenv(pair_kernel.ENV_SWITCH, "on")
    return slow, M.tensor_metrics(*args, **kwargs)


def _assert_same(slow, fast):
    assert slow.keys() == fast.keys()
    for key, value in slow.items():
        if isinstance(value, float):
            assert fast[key] == pytest.approx(value, rel=1e-12, abs=0, nan_ok=True), key
        else:
            assert fast[key] == value, key


def _cases():
    rng = np.random.default_rng(3)
    a = rng.standard_normal((40, 300)).astype(np.float32)
    b = a + rng.standard_normal(a.shape).astype(np.float32) * np.float32(1e-3)
    nan_a, nan_b = a.copy(), b.copy()
    nan_a[2, 5] = nan_b[2, 5] = np.nan          # the same NaN on both sides
    nan_b[9, 1], nan_a[30, 2], nan_b[39, 299] = np.inf, -np.inf, np.nan
    spread = b.copy()
    spread.reshape(-1)[::997] = np.nan          # more than five positions, over several chunks
    tie = np.zeros(50, np.float32)
    tie_b = tie.copy()
    tie_b[[3, 30]] = 1.0                        # the first of two equal largest differences
    return {
        "float32": (a, b), "float64 ref": (a.astype(np.float64), b), "float64 got": (a, b.astype(np.float64)),
        "nonfinite": (nan_a, nan_b), "many NaN": (a, spread), "tie": (tie, tie_b),
        "overflowing squares": (np.full(100, 1e200), np.full(100, 1e200) * 1.0000001),
        "zeros": (np.zeros(10, np.float32), np.zeros(10, np.float32)),
        "all NaN": (np.full(10, np.nan, np.float32), np.ones(10, np.float32)),
        "empty": (np.zeros((0, 3), np.float32), np.zeros((0, 3), np.float32)),
        "scalar": (np.float32(2.0), np.float32(2.5)),
    }


@pytest.mark.parametrize("chunk", [M.CHUNK_ELEMENTS, 7])
@pytest.mark.parametrize("relative", [True, False])
def test_the_kernel_gives_numpys_figures(monkeypatch, chunk, relative):
    monkeypatch.setattr(M, "CHUNK_ELEMENTS", chunk)
    for name, (a, b) in _cases().items():
        slow, fast = _numpy_and_kernel(monkeypatch, a, b, relative=relative)
        try:
            _assert_same(slow, fast)
        except AssertionError as exc:
            raise AssertionError(f"{name}: {exc}") from None


def test_damage_is_measured_and_failed_the_same():
    rng = np.random.default_rng(4)
    ref = rng.standard_normal((64, 64)).astype(np.float32)
    damaged = ref.copy()
    damaged[17, 40] += 0.5
    fast = M.tensor_metrics(ref, damaged)
    assert fast["max_abs"] == pytest.approx(0.5, rel=1e-6) and fast["max_abs_index"] == [17, 40]
    assert judge(fast, "hidden", "fp32")[0] is False
    nan = ref.copy()
    nan[3, 3] = np.nan
    m = M.tensor_metrics(ref, nan)
    assert m["nan_got"] == 1 and m["nonfinite_got_at"] == [[3, 3]] and judge(m, "hidden", "fp32")[0] is False
    assert judge(M.tensor_metrics(ref, ref.copy()), "hidden", "fp32")[0] is True


def test_three_pairs_among_three_arrays(monkeypatch):
    rng = np.random.default_rng(5)
    hf = rng.standard_normal(100_000).astype(np.float32)
    ms = hf + np.float32(1e-6) * rng.standard_normal(hf.size).astype(np.float32)
    twin = hf.astype(np.float64) + 1e-7 * rng.standard_normal(hf.size)
    pairs = [(0, 1, True), (2, 0, True), (2, 1, False)]
    monkeypatch.setenv(pair_kernel.ENV_SWITCH, "off")
    slow = M.tensor_metrics_among([hf, ms, twin], pairs)
    monkeypatch.setenv(pair_kernel.ENV_SWITCH, "on")
    for s, f in zip(slow, M.tensor_metrics_among([hf, ms, twin], pairs), strict=True):
        _assert_same(s, f)


THREADS = """
import json, sys
import numpy as np
from migrate.judge.metrics import tensor_metrics
rng = np.random.default_rng(6)
a = rng.standard_normal(3_000_000).astype(np.float32)
b = a + np.float32(1e-3) * rng.standard_normal(a.size).astype(np.float32)
print(json.dumps(tensor_metrics(a, b)))
"""


def test_the_figures_do_not_depend_on_the_thread_count():
    """Chunks are merged in order: a dump's figures computed on a 1-core box equal a 16-core one's."""
    out = []
    for threads in ("1", "3"):
        env = {**os.environ, "OMP_NUM_THREADS": threads}
        done = subprocess.run([sys.executable, "-c", THREADS], env=env, capture_output=True, text=True, check=True)
        out.append(json.loads(done.stdout.strip().splitlines()[-1]))
    assert out[0] == out[1] and math.isfinite(out[0]["cosine"])


def test_numpys_path_where_the_kernel_cannot_read_or_be_had(monkeypatch, tmp_path):
    a = np.arange(20, dtype=np.float32)
    assert not pair_kernel.handles(a[::2]) and not pair_kernel.handles(a.astype(np.float16))
    strided = M.tensor_metrics(a[::2], a[::2] + 1)
    assert strided["max_abs"] == 1.0 and strided["numel"] == 10
    monkeypatch.setenv("MIGRATE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    assert pair_kernel.library() is None
    assert M.tensor_metrics(a, a + 1)["max_abs"] == 1.0


def test_the_figures_do_not_depend_on_where_the_arrays_start():
    """A dump's tensors are read from files at any offset: vector loads that start at another
    alignment must not regroup the sums."""
    rng = np.random.default_rng(7)
    ref = rng.standard_normal(100_003)
    got = (ref + 1e-3 * rng.standard_normal(ref.size)).astype(np.float32)

    def placed(x, offset):
        buffer = np.empty(x.size + 16, x.dtype)
        view = buffer[offset:offset + x.size]
        view[:] = x
        return view

    first = M.tensor_metrics(ref, got)
    for offset in range(1, 8):
        assert M.tensor_metrics(placed(ref, offset), placed(got, offset % 3)) == first, offset


def test_the_vector_clones_compute_the_same_bits(tmp_path):
    """The AVX2 clone (where this CPU has AVX2) and the x86-64 baseline sum each lane alike: a dump's
    figures made on one box equal another's."""
    if "avx2" not in Path("/proc/cpuinfo").read_text():
        pytest.skip("this CPU has no AVX2: only the baseline runs here")
    baseline = tmp_path / "baseline.so"
    done = subprocess.run([native.compiler(), *native.FLAGS, "-DMIGRATE_BASELINE_ONLY", "-o", str(baseline),
                           str(pair_kernel.SOURCE)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    rng = np.random.default_rng(8)
    ref = rng.standard_normal(100_003)                 # several chunks and a ragged tail of 3
    got = (ref + 1e-3 * rng.standard_normal(ref.size)).astype(np.float32)
    for floor in (None, 1e-3):
        clones, plain = (pair_kernel.pair_sums(lib, ref, got, M.CHUNK_ELEMENTS, floor, M.WITHIN_TOLERANCES)
                         for lib in (pair_kernel.library(), pair_kernel._library(str(baseline))))
        assert clones == plain
        assert clones["max_abs"] == float(np.abs(ref - got).max()) and clones["max_abs_at"] == int(
            np.abs(ref - got).argmax())
