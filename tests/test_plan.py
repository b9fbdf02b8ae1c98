"""The memory / layout planner: the 7B table, the 16 B/param rule, rejection reasons, CPU calibration."""
from concurrent.futures import ThreadPoolExecutor

import pytest
from rich.console import Console

from migrate.errors import MigrateError
from migrate.memory_plan import (
    GiB,
    MiB,
    cpu_estimate,
    estimate_memory,
    layer_activation_bytes,
    loss_block_bytes,
    measure_peak_details,
    plan,
    print_plan,
    stage_params,
    total_params,
)
from migrate.models.config import LlamaConfig
from migrate.parallel.layout import Layout

LLAMA2_7B = LlamaConfig(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_layers=32, num_heads=32)


def _plan_7b(**kw):
    args = dict(devices=8, device_memory_bytes=64 * GiB, seq_length=4096, global_batch=512)
    args.update(kw)
    return plan(LLAMA2_7B, **args)


def test_7b_on_8_devices_prints_a_table_of_valid_layouts():
    result = _plan_7b()
    assert total_params(LLAMA2_7B) == 6_738_415_616
    assert len(result.valid) + len(result.rejected) == 10 * 4 * 3  # (dp, mp, pp) × micro batch × recompute
    assert result.valid and result.rejected
    console = Console(record=True, width=220)
    print_plan(result, console, max_rows=10)
    text = console.export_text()
    assert "6.74B params · 8 devices × 64 GiB · seq 4096 · global batch 512 · bf16" in text
    assert "weights+grads+opt GiB" in text and "rejected:" in text and "assumptions:" in text
    assert "16 B/param" in text and "Korthikanti" in text and "ranked by" in text
    best = result.best
    assert text.count("best: global batch 512 = ") == 1
    assert best.layout.global_batch == 512 and best.memory.total <= 64 * GiB
    for cand in result.valid:
        assert cand.memory.total <= 64 * GiB
        assert cand.layout.dp * cand.layout.mp * cand.layout.pp == 8
    print(text)


def test_ranking_rule():
    result = _plan_7b()
    order = {"none": 0, "selective": 1, "full": 2}
    keys = [(order[c.recompute], c.layout.mp, c.layout.pp, -c.layout.micro_batch_size) for c in result.valid]
    assert keys == sorted(keys)


def test_16_bytes_per_param_rule_exactly():
    # dp 1, mp 8: per layer (4h² + 3hi)/8 + 2h norms; embedding and lm_head V·h/8 each; final norm h.
    h, i, v = 4096, 11008, 32000
    per_device = 32 * ((4 * h * h + 3 * h * i) // 8 + 2 * h) + 2 * (v * h // 8) + h
    assert per_device == 842_534_912
    mem = estimate_memory(LLAMA2_7B, Layout(dp=1, mp=8, pp=1), 4096, "bf16", "full")
    assert mem.params == per_device
    assert (mem.weights, mem.grads, mem.optimizer) == (2 * per_device, 2 * per_device, 12 * per_device)
    assert mem.states == 16 * per_device == 13_480_558_592
    fp32 = estimate_memory(LLAMA2_7B, Layout(dp=1, mp=8, pp=1), 4096, "fp32", "full")
    assert (fp32.weights, fp32.grads, fp32.optimizer) == (4 * per_device, 4 * per_device, 8 * per_device)
    # Optimizer sharding divides master + moments by dp; weights and grads stay whole.
    p = total_params(LLAMA2_7B)
    sharded = estimate_memory(LLAMA2_7B, Layout(dp=8, optimizer_shard=True), 4096, "bf16", "full")
    assert (sharded.weights, sharded.grads, sharded.optimizer) == (2 * p, 2 * p, 12 * p // 8)


def test_activation_terms():
    cfg, s, b, e = LLAMA2_7B, 4096, 1, 2
    sbh, sbi = s * b * 4096, s * b * 11008
    replicated = 2 * (4 + e) * sbh + 2 * e * sbh
    split = 4 * e * sbh + 4 * e * sbi
    scores = (4 + e) * 32 * s * s * b
    assert layer_activation_bytes(cfg, s, b, 1, "bf16", "none") == replicated + split + scores
    assert layer_activation_bytes(cfg, s, b, 4, "bf16", "none") == replicated + (split + scores) // 4
    assert layer_activation_bytes(cfg, s, b, 4, "bf16", "selective") == replicated + split // 4
    assert layer_activation_bytes(cfg, s, b, 4, "bf16", "full") == e * sbh
    # fp32: the softmax output is the probs tensor (c = 4).
    assert layer_activation_bytes(cfg, s, b, 1, "fp32", "none") - layer_activation_bytes(
        cfg, s, b, 1, "fp32", "selective") == 4 * 32 * s * s * b
    assert loss_block_bytes(cfg, s, b, 2, "bf16") == (4 + e) * sbh + e * sbh + (e + 12) * s * b * 32000 // 2


def test_pipeline_stage_zero_holds_pp_micro_batches():
    lay = Layout(dp=1, mp=1, pp=4, micro_batches=8)
    mem = estimate_memory(LLAMA2_7B, lay, 4096, "bf16", "selective")
    per_layer = layer_activation_bytes(LLAMA2_7B, 4096, 1, 1, "bf16", "selective")
    assert mem.stage == 0
    assert mem.activations == per_layer * 8 * 4  # 8 layers per stage × 4 micro-batches in flight
    assert stage_params(LLAMA2_7B, lay)[0] == mem.params


def test_rejection_reasons():
    result = _plan_7b(devices=6)
    reasons = {c.reason for c in result.rejected}
    assert "num_layers (32) is not divisible by pp (3): every pipeline stage needs the same number of layers" \
        in reasons
    assert "num_heads (32) is not divisible by mp (3): attention heads are split across mp" in reasons
    assert "global batch 512 is not divisible by micro batch × dp = 1 × 3 = 3" in reasons
    memory = [c for c in _plan_7b().rejected if c.memory is not None]
    assert memory
    worst = next(c for c in memory if c.label() == "dp8 mp1 pp1 mb1 none")
    assert worst.reason.startswith(f"needs {worst.memory.total / GiB:.1f} GiB > 64.0 GiB (stage 0: states ")
    # Rule violations are listed before memory misses.
    kinds = [c.memory is not None for c in result.rejected]
    assert kinds == sorted(kinds)


def test_no_layout_fits_is_said_plainly():
    result = _plan_7b(device_memory_bytes=8 * GiB)
    assert result.valid == [] and result.best is None
    console = Console(record=True, width=200)
    print_plan(result, console, show_rejected=0)
    assert "no layout fits" in console.export_text()


def test_bad_arguments():
    with pytest.raises(MigrateError, match="unknown dtype"):
        _plan_7b(dtype="int8")
    with pytest.raises(MigrateError, match="unknown recompute"):
        estimate_memory(LLAMA2_7B, Layout(), 128, "bf16", "some")


# Calibration against real CPU training steps (the bundled model, experimental AdamW,
# value_and_grad, fp32, PyNative) measured in subprocesses, run side by side.
CALIBRATION = [
    ("llama 20.8M", LlamaConfig(vocab_size=8000, hidden_size=512, intermediate_size=1376, num_layers=4,
                                num_heads=8), 2, 128),
    ("gqa 21.9M", LlamaConfig(vocab_size=16000, hidden_size=512, intermediate_size=1376, num_layers=2,
                              num_heads=8, n_kv_heads=2), 1, 128),
]


@pytest.mark.slow
def test_cpu_estimate_within_25_percent_of_measured_peak():
    with ThreadPoolExecutor(len(CALIBRATION)) as pool:
        measured = list(pool.map(lambda case: measure_peak_details(case[1], case[2], case[3]), CALIBRATION))
    for (name, cfg, b, s), m in zip(CALIBRATION, measured, strict=True):
        est = cpu_estimate(cfg, b, s)
        ratio = est.total / m["growth"]
        print(f"{name}: batch {b}×{s}, {m['params']:,} params: measured peak RSS growth {m['growth'] / MiB:.0f} MiB, "
              f"estimate {est.total / MiB:.0f} MiB (states {est.states / MiB:.0f}, activations "
              f"{(est.activations + est.working) / MiB:.0f}, loss {est.loss / MiB:.0f}, overhead "
              f"{est.overhead / MiB:.0f}), ratio {ratio:.2f}")
        assert m["params"] == total_params(cfg)
        assert 0.75 <= ratio <= 1.25, (name, ratio)
