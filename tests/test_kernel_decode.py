"""The decode kernels (migrate/infer/kernel_decode.py, decode_layer.cc): a plain float32 Llama's
KV-cache decode step as one CPU kernel per layer.

They must compute the op-by-op step's numbers within float32 rounding (logits, the cache they write),
whatever the batch, left padding, GQA grouping, tied or untied head; the same bits whatever the
thread count; refuse shapes they do not take; and run only for models they compute: every other
model decodes op by op, with the reason said. The HF token-for-token tests (tests/test_generate.py)
run through them too.
"""
import ctypes
import hashlib
import os
import subprocess
import sys
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest

from hf_fixtures import build_hf_model, save_hf_model
from migrate import native
from migrate.cli import main
from migrate.convert import convert
from migrate.infer.batch import make_batch
from migrate.infer.generate import generate
from migrate.infer.kernel_decode import ENV_SWITCH, SOURCE, library, why_not_config, why_not_kernels
from migrate.infer.request import Options, _kv_runner_name
from migrate.infer.runners import CachedRunner
from migrate.infer.sampling import Sampling
from migrate.models.config import LlamaConfig
from migrate.models.kernels import LinearKernel
from migrate.models.llama import LlamaForCausalLM

# 8 query heads over 2 KV heads (4 per group), head_dim 8
SIZES = dict(vocab_size=300, hidden_size=64, intermediate_size=160, num_layers=2, num_heads=8, n_kv_heads=2,
             initializer_range=0.2)
PROMPTS = [[5, 9, 17, 33, 3, 8, 100, 7], [11, 12, 13, 40, 41]]  # row 1 left-padded by 3
STEPS = 12


@pytest.fixture(autouse=True)
def graph_mode():
    ms.set_context(mode=ms.GRAPH_MODE)
    yield
    ms.set_context(mode=ms.PYNATIVE_MODE)


def model_of(**fields):
    return LlamaForCausalLM(LlamaConfig(**{**SIZES, **fields}), seed=1)


def runner(model, batch, kernels: bool, monkeypatch):
    monkeypatch.setenv(ENV_SWITCH, "on" if kernels else "off")
    made = CachedRunner(model, batch.size, batch.prompt_len, batch.prompt_len + STEPS)
    assert (made.kernels is not None) == kernels, made.no_kernels
    return made


def decode_both(model, monkeypatch):
    batch = make_batch(PROMPTS, 0, SIZES["vocab_size"])
    runs = [generate(runner(model, batch, kernels, monkeypatch), batch, STEPS, Sampling(), pad_id=0,
                     record_logits=True) for kernels in (False, True)]
    return runs, batch


@pytest.mark.slow
@pytest.mark.parametrize("tied", [False, True])
def test_kernel_decode_computes_the_op_by_op_steps_numbers(tied, monkeypatch):
    (ops_run, kernel_run), _ = decode_both(model_of(tie_word_embeddings=tied), monkeypatch)
    assert (kernel_run.tokens == ops_run.tokens).all()
    pairs = zip(ops_run.logits, kernel_run.logits, strict=True)
    worst = max(float(np.abs(a - b).max() / np.abs(a).max()) for a, b in pairs)
    print(f"\n[kernel decode, tied={tied}] logits within {worst:.1e} of the op-by-op step's, relative")
    assert worst <= 2e-6


@pytest.mark.slow
def test_the_cache_the_kernels_write_is_the_op_by_op_cache(monkeypatch):
    model = model_of()
    batch = make_batch(PROMPTS, 0, SIZES["vocab_size"])
    caches = []
    for kernels in (False, True):
        made = runner(model, batch, kernels, monkeypatch)
        generate(made, batch, STEPS, Sampling(), pad_id=0)
        caches.append([t.asnumpy().copy() for t in made.step.cache.tensors()])
    # the slots a token may attend: a left pad's own k and v (after layer 0) are not the same numbers,
    # as its query attends no key at all (the op-by-op step spreads it over every slot, the kernel
    # over the slots up to its own) and no real token ever reads them
    written = batch.prompt_len + STEPS - 1  # the last decode step's slot is the cache's last written one
    attended = np.zeros(caches[0][0].shape[::2][:2], bool)  # (b, slots)
    attended[:, :written] = np.concatenate([batch.mask, np.ones((batch.size, STEPS - 1), batch.mask.dtype)], 1) != 0
    assert not attended.all()  # the left pads are there
    for ops_cache, kernel_cache in zip(*caches, strict=True):
        ops_rows, kernel_rows = ops_cache.swapaxes(1, 2)[attended], kernel_cache.swapaxes(1, 2)[attended]
        assert np.abs(ops_rows).min(-1).max() > 0  # every attended slot written
        assert np.allclose(kernel_rows, ops_rows, rtol=0, atol=2e-5 * np.abs(ops_rows).max())


def test_a_step_at_the_wrong_slot_is_told_apart(monkeypatch):
    """The agreement above is tight enough to see a mistake: the kernels' step one slot off (its
    query at the wrong place, its k and v written over the previous token's) parts from the op-by-op
    step's logits by far more than the bound."""
    model = model_of()
    batch = make_batch(PROMPTS, 0, SIZES["vocab_size"])
    made = runner(model, batch, True, monkeypatch)
    inputs = batch.prefill(made.prefill_len, made.cache_len)
    made.prefill(inputs)
    tokens = np.array([[3], [7]], np.int32)
    positions = inputs["positions"][:, -1:] + 1
    right = made.decode(tokens, positions, made.prefill_len, None)
    made.prefill(inputs)
    wrong = made.decode(tokens, positions, made.prefill_len - 1, None)
    assert np.abs(right - wrong).max() / np.abs(right).max() > 1e-2


def logits_digest() -> str:
    """sha256 of a kernel decode's logits (its decode steps'), computed in this process."""
    model = LlamaForCausalLM(LlamaConfig(**SIZES), seed=1)
    batch = make_batch(PROMPTS, 0, SIZES["vocab_size"])
    made = CachedRunner(model, batch.size, batch.prompt_len, batch.prompt_len + STEPS)
    assert made.kernels is not None, made.no_kernels
    out = generate(made, batch, STEPS, Sampling(), pad_id=0, record_logits=True)
    return hashlib.sha256(np.stack(out.logits[1:]).tobytes()).hexdigest()


@pytest.mark.slow
def test_the_thread_count_changes_no_bit():
    """This process's OpenMP team (one thread under make test's workers) against another process's
    of another size: one thread against three (more than this machine's cores), or the other way."""
    library()  # loads libgomp: its thread count is fixed at load from OMP_NUM_THREADS
    here = ctypes.CDLL("libgomp.so.1").omp_get_max_threads()
    other = "3" if here == 1 else "1"
    script = ("import sys; import mindspore as ms; ms.set_context(mode=ms.GRAPH_MODE); sys.path.insert(0, 'tests')\n"
              "from test_kernel_decode import logits_digest\nprint(logits_digest())\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": other})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-1] == logits_digest(), f"{here} threads here, {other} there"


def test_a_shape_the_kernel_does_not_take_is_refused(monkeypatch):
    model = model_of()
    batch = make_batch(PROMPTS, 0, SIZES["vocab_size"])
    made = runner(model, batch, True, monkeypatch)
    layer = model.model.layers[0]
    x = ms.Tensor(np.ones((2, 1, 64), np.float32))
    cos = ms.Tensor(np.ones((2, 1, 1, 8), np.float32))
    mask = ms.Tensor(np.zeros((2, 1, 1, made.cache_len), np.float32))
    a, f = layer.attention, layer.feed_forward
    scalars = made.kernels.scalars
    keys, values = made.step.cache.keys[0], made.step.cache.values[0]
    ms.set_context(mode=ms.PYNATIVE_MODE)
    good = made.kernels.layer_op(x, layer.attention_norm.weight, a.wq.weight, a.wk.weight, a.wv.weight, a.wo.weight,
                                 layer.ffn_norm.weight, f.w1.weight, f.w3.weight, f.w2.weight, cos, cos, mask, keys,
                                 values, ms.Tensor(0, ms.int32), scalars).asnumpy()
    assert good.shape == (2, 1, 64) and np.isfinite(good).all()
    with pytest.raises(RuntimeError):  # wk where wq goes: (16, 64) is not (heads * head_dim, hidden)
        made.kernels.layer_op(x, layer.attention_norm.weight, a.wq.weight, a.wq.weight, a.wv.weight, a.wo.weight,
                              layer.ffn_norm.weight, f.w1.weight, f.w3.weight, f.w2.weight, cos, cos, mask, keys,
                              values, ms.Tensor(0, ms.int32), scalars).asnumpy()
    with pytest.raises(RuntimeError):  # a slot past the cache
        made.kernels.layer_op(x, layer.attention_norm.weight, a.wq.weight, a.wk.weight, a.wv.weight, a.wo.weight,
                              layer.ffn_norm.weight, f.w1.weight, f.w3.weight, f.w2.weight, cos, cos, mask, keys,
                              values, ms.Tensor(made.cache_len, ms.int32), scalars).asnumpy()


class NotTheDefaultKernel(LinearKernel):
    """Stands for a LoRA adapter, a sharded or a fault kernel: any cell the decode kernels do not compute."""


def swapped_kernel():
    model = model_of()
    model.model.layers[1].attention.wv.kernel = NotTheDefaultKernel()
    return model


@pytest.mark.parametrize("make, reason", [
    (lambda: model_of(qkv_concat=True), "fused qkv layout"),
    (lambda: model_of(mlp_bias=True), "biases"),
    (lambda: model_of(hidden_act="gelu"), "SiLU"),
    (lambda: model_of(rms_norm_unit_offset=True), "RMSNorm"),
    (lambda: model_of(sliding_window=4), "sliding-window"),
    (lambda: model_of(compute_dtype="bfloat16"), "not float32"),
    (swapped_kernel, "model.layers.1.attention.wv.kernel is a NotTheDefaultKernel"),
])
def test_models_the_kernels_do_not_compute_decode_op_by_op_with_the_reason(make, reason, monkeypatch):
    monkeypatch.setenv(ENV_SWITCH, "on")
    model = make()
    assert reason in why_not_kernels(model)
    made = CachedRunner(model, 1, 4, 8)
    assert made.kernels is None and reason in made.no_kernels


def test_the_switch_and_the_mode_turn_the_kernels_off(monkeypatch):
    model = model_of()
    monkeypatch.setenv(ENV_SWITCH, "on")
    assert why_not_kernels(model) is None
    assert _kv_runner_name(model.config, Options(max_new_tokens=4)) == "kv_cache_kernels"
    # another compile-cache folder where the kernels do not run
    assert _kv_runner_name(model.config, Options(max_new_tokens=4, dtype="bf16")) == "kv_cache"
    monkeypatch.setenv(ENV_SWITCH, "off")
    assert "is off" in why_not_kernels(model) and "is off" in why_not_config(model.config)
    assert _kv_runner_name(model.config, Options(max_new_tokens=4)) == "kv_cache"
    monkeypatch.setenv(ENV_SWITCH, "on")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    assert "GRAPH_MODE" in why_not_kernels(model)


def head_rows(library: str, x: np.ndarray, table: np.ndarray) -> np.ndarray:
    """decode_layer.cc's MigrateHeadRows called as MindSpore's aot kernels are: x (b, 1, h) · tableᵀ."""
    lib = ctypes.CDLL(library)
    out = np.zeros((x.shape[0], table.shape[0]), np.float32)
    arrays = [x, table, out]
    params = (ctypes.c_void_p * 3)(*[a.ctypes.data for a in arrays])
    ndims = (ctypes.c_int * 3)(*[a.ndim for a in arrays])
    shapes = [(ctypes.c_int64 * a.ndim)(*a.shape) for a in arrays]
    shape_ptrs = (ctypes.POINTER(ctypes.c_int64) * 3)(*[ctypes.cast(s, ctypes.POINTER(ctypes.c_int64)) for s in shapes])
    dtypes = (ctypes.c_char_p * 3)(*[b"float32"] * 3)
    assert lib.MigrateHeadRows(3, params, ndims, shape_ptrs, dtypes, None, None) == 0
    return out


def test_the_vector_clones_compute_the_same_bits(tmp_path):
    """The products' AVX2 clone (where this CPU has AVX2) and the x86-64 baseline sum in the same groups."""
    if "avx2" not in Path("/proc/cpuinfo").read_text():
        pytest.skip("this CPU has no AVX2: only the baseline runs here")
    baseline = tmp_path / "baseline.so"
    done = subprocess.run([native.compiler(), *native.FLAGS, "-DMIGRATE_BASELINE_ONLY", "-o", str(baseline),
                           str(SOURCE)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    rng = np.random.default_rng(0)
    x = rng.standard_normal((11, 1, 203)).astype(np.float32)  # rows in blocks of 8, 2, 1; a ragged tail of 3
    table = rng.standard_normal((77, 203)).astype(np.float32)
    clones, plain = head_rows(library(), x, table), head_rows(str(baseline), x, table)
    assert clones.tobytes() == plain.tobytes()
    exact = x[:, 0].astype(np.float64) @ table.T.astype(np.float64)
    assert np.abs(clones - exact).max() <= 1e-5 * np.abs(exact).max()
    assert not np.array_equal(head_rows(library(), x, table[::-1].copy()), clones)  # the call sees its inputs


@pytest.mark.slow
def test_migrate_generate_says_when_the_kernels_ran_and_gives_the_same_tokens(tmp_path, monkeypatch, capsys):
    save_hf_model(build_hf_model("tied", seed=3, initializer_range=0.1), tmp_path / "hf")
    convert(tmp_path / "hf", tmp_path / "ms")
    lines = {}
    for switch in ("on", "off"):
        monkeypatch.setenv(ENV_SWITCH, switch)
        capsys.readouterr()
        assert main(["generate", str(tmp_path / "ms"), "--ids", "5,9,17,33,3,8", "--max-new-tokens", "16",
                     "--ignore-eos", "--no-stream", "--no-compile-cache"]) == 0
        lines[switch] = " ".join(capsys.readouterr().out.split())
    ms.set_context(mode=ms.GRAPH_MODE)  # main puts the caller's mode back; the fixture expects GRAPH_MODE
    assert "KV cache, GRAPH_MODE, one kernel per layer" in lines["on"]
    assert "one kernel per layer" not in lines["off"] and "KV cache, GRAPH_MODE" in lines["off"]
    text = {switch: line.split(" 1 × 16 tokens")[0] for switch, line in lines.items()}
    assert text["on"] == text["off"]
