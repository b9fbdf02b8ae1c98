"""The MindSpore trainer against the golden PyTorch script, on a tiny Llama.

The headline test trains both sides 200 steps in fp32 (warmup + cosine,
accumulation 2, clipping on) and prints the achieved figures.
"""
import json
import time
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest
import torch

from hf_fixtures import build_hf_model, save_hf_model
from migrate.convert import convert
from migrate.data.samples import load_samples, run_order
from migrate.train.config import LossScaleConfig, ScheduleConfig
from migrate.train.ms_data import micro_batches
from migrate.train.precision import DynamicLossScaler, autocast_model
from migrate.train.trainer import train
from train_setup import VOCAB, load_cfg, load_golden, make_run_dir, metrics, rel

golden = load_golden()
GOLDEN_KEYS = {"step", "loss", "lr", "grad_norm", "grad_norm_clipped", "tokens", "time"}
SHORT = ScheduleConfig(name="cosine", warmup_steps=2, min_lr_rate=0.1)


# slow as a whole: its module fixtures build a 200-step golden/MindSpore pair
pytestmark = [pytest.mark.usefixtures("one_torch_thread"), pytest.mark.slow]


def live_shared(run: Path) -> dict:
    return json.loads((run / "effective_hparams.json").read_text())["live_shared"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return make_run_dir(tmp_path_factory.mktemp("trainer"))


@pytest.fixture(scope="module")
def cfg(run_dir):
    return load_cfg(run_dir)


@pytest.fixture(scope="module")
def fp32_runs(cfg, run_dir):
    cfg = cfg.replace(checkpoint_interval=200)  # the last step's state, for the state diff below
    started = time.perf_counter()
    golden.train(cfg, run_dir / "golden", log=lambda line: None)
    golden_s = time.perf_counter() - started
    started = time.perf_counter()
    train(cfg, run_dir / "ms", progress=False)
    ms_s = time.perf_counter() - started
    return metrics(run_dir / "golden"), metrics(run_dir / "ms"), golden_s, ms_s


def test_fp32_matches_the_golden_over_200_steps(fp32_runs, cfg):
    g, m, golden_s, ms_s = fp32_runs
    assert [r["step"] for r in m] == [r["step"] for r in g] == list(range(1, 201))
    assert [r["tokens"] for r in m] == [r["tokens"] for r in g]
    loss_rel = np.array([rel(a["loss"], b["loss"]) for a, b in zip(g, m, strict=True)])
    lr_rel = max(abs(a["lr"] - b["lr"]) / max(abs(a["lr"]), 1e-300) for a, b in zip(g, m, strict=True))
    grad_rel = np.array([rel(a["grad_norm"], b["grad_norm"]) for a, b in zip(g, m, strict=True)])
    print(f"\n[fp32 200 steps] golden {golden_s:.1f}s, MindSpore {ms_s:.1f}s; "
          f"first-step loss rel {loss_rel[0]:.2e}, mean loss rel {loss_rel.mean():.2e}, "
          f"max loss rel {loss_rel.max():.2e}, max lr rel {lr_rel:.1e}, mean grad_norm rel {grad_rel.mean():.2e}, "
          f"loss {g[0]['loss']:.4f} -> {g[-1]['loss']:.4f} (golden) / {m[-1]['loss']:.4f} (MindSpore)")
    assert loss_rel[0] <= 1e-6
    assert loss_rel.mean() <= 1e-4
    assert lr_rel <= 1e-12
    assert grad_rel.mean() <= 1e-3
    assert m[-1]["loss"] < m[0]["loss"] - 1.0  # it trains


def test_compare_passes_the_200_step_pair_with_a_flat_drift(fp32_runs, run_dir, tmp_path, capsys):
    """tests/test_compare_tight.py's judgement of correct runs, on this file's pair (it trains it anyway)."""
    from migrate.cli import main
    from test_compare_tight import assert_flat_drift

    out = tmp_path / "c.json"
    code = main(["compare", str(run_dir / "golden"), str(run_dir / "ms"), "--json", str(out)])
    capsys.readouterr()
    report = json.loads(out.read_text())
    assert_flat_drift("trainer 200 steps", code, report, {c["key"]: c for c in report["checks"]})


def test_the_training_states_after_200_steps_pass_the_state_diff(fp32_runs, run_dir, capsys):
    """A correct pair's states part more with every step (AdamW amplifies rounding where a gradient is
    near zero); the state diff's fixed fp32 bounds must still pass them at 200 steps."""
    from migrate.cli import main

    code = main(["diff", str(run_dir / "golden" / "checkpoint-200"),
                 str(run_dir / "ms" / "checkpoints" / "checkpoint-200")])
    out = " ".join(capsys.readouterr().out.split())
    assert code == 0, out[-800:]
    assert "PASS" in out


def test_fp32_clips_with_torchs_epsilon(fp32_runs, cfg):
    # Where both sides clip, torch's max_norm / (norm + 1e-6) leaves the clipped norm 1e-6 / norm below
    # max_norm (~9e-7 here); without the epsilon it would be max_norm. The loss curve cannot see this.
    g, m, _, _ = fp32_runs
    both = [(a, b) for a, b in zip(g, m, strict=True) if min(a["grad_norm"], b["grad_norm"]) > cfg.max_grad_norm]
    signed = np.array([(b["grad_norm_clipped"] - a["grad_norm_clipped"]) / a["grad_norm_clipped"] for a, b in both])
    eps_effect = np.mean([1e-6 / a["grad_norm"] for a, _ in both])
    print(f"\n[fp32 clip] {len(both)} steps clipped on both sides: grad_norm_clipped mean signed rel "
          f"{signed.mean():.1e} (max |rel| {np.abs(signed).max():.1e}); the epsilon moves it by {eps_effect:.1e}")
    assert len(both) >= 50
    assert abs(signed.mean()) <= 0.25 * eps_effect  # measured 1.6e-8 against 8.8e-7
    assert all(b["grad_norm_clipped"] < cfg.max_grad_norm for _, b in both)
    # Below max_norm nothing is scaled: the norm after clipping is the norm.
    assert all(r["grad_norm_clipped"] == r["grad_norm"] for r in m if r["grad_norm"] <= cfg.max_grad_norm)


def test_metrics_keys_and_effective_hparams(fp32_runs, run_dir):
    _, m, _, _ = fp32_runs
    assert set(m[0]) == GOLDEN_KEYS | {"tokens_per_s", "mfu"}
    assert all(b["time"] >= a["time"] for a, b in zip(m, m[1:], strict=False))
    eff = json.loads((run_dir / "ms" / "effective_hparams.json").read_text())
    throughput = eff["throughput"]
    assert throughput["peak_flops"] > 0 and throughput["source"].startswith("measured")
    # Filled from the run's own figures by the recorded formula; how fast is bench/train_speed.py's to say.
    assert all(r["tokens_per_s"] > 0 for r in m)
    # the record keeps tokens_per_s to 3 decimals and MFU from the unrounded rate: half a unit of the last place
    per_token = throughput["flops_per_token"] / throughput["peak_flops"]
    assert all(r["mfu"] == pytest.approx(per_token * r["tokens_per_s"], rel=1e-6, abs=per_token * 5e-4) for r in m)
    decayed, kept = eff["optimizer"]["groups"]
    assert decayed["weight_decay"] == 0.1 and kept["weight_decay"] == 0.0
    assert all(n.endswith("norm.weight") or n.endswith("norm_out.weight") for n in kept["names"])
    assert eff["scheduler"]["lr"] == [r["lr"] for r in m]
    assert eff["clipping"]["eps"] == 1e-6 and eff["accumulation"]["loss_divisor"] == 2
    # Read from the live cells; the golden reads the same facts from its torch model.
    assert eff["live_shared"] == {"parameter_dtypes": ["float32"], "recompute_layers": [],
                                  "linear_compute_dtypes": {"decoder_layers": [["float32"]] * 2,
                                                            "lm_head": ["float32"]}}
    assert eff["live_shared"] == json.loads((run_dir / "golden" / "effective_hparams.json").read_text())["live_shared"]
    assert eff["model"]["autocast"] is None and eff["model"]["recompute"] is False


def test_data_order_is_the_golden_order(cfg):
    samples = load_samples(cfg.data, cfg.seq_length)
    order = run_order(cfg, len(samples))
    seen = 0
    for step, micro, rows in micro_batches(cfg):
        assert step == seen // cfg.grad_accum_steps and micro == seen % cfg.grad_accum_steps
        np.testing.assert_array_equal(rows, samples[order[step, micro]])
        seen += 1
    assert seen == cfg.total_steps * cfg.grad_accum_steps  # 1600 draws: 2.4 epochs of 679 rows
    # A resumed run starts reading at its step.
    step, micro, rows = next(micro_batches(cfg, start_step=137))
    assert (step, micro) == (137, 0)
    np.testing.assert_array_equal(rows, samples[order[137, 0]])


def test_fp16_overflow_skips_the_step_and_the_schedule(cfg, run_dir):
    # A huge first scale overflows in fp16: skip the optimizer and scheduler step, back off.
    short = cfg.replace(dtype="fp16", total_steps=3, schedule=SHORT,
                        loss_scale=LossScaleConfig(init_scale=1e38, backoff_factor=1e-34))
    golden.train(short, run_dir / "g16", log=lambda line: None)
    train(short, run_dir / "m16", progress=False, peak_flops=1e12)
    g, m = metrics(run_dir / "g16"), metrics(run_dir / "m16")
    assert [r["skipped"] for r in m] == [r["skipped"] for r in g] == [True, False, False]
    assert [r["loss_scale"] for r in m] == [r["loss_scale"] for r in g]
    assert m[0]["grad_norm"] is None and all(r["grad_norm"] is not None for r in m[1:])
    assert [r["lr"] for r in m] == [r["lr"] for r in g] and m[0]["lr"] == m[1]["lr"] == 0.0
    figures = [rel(a["loss"], b["loss"]) for a, b in zip(g, m, strict=True)]
    print(f"\n[fp16] loss rel per step vs golden: {', '.join(f'{x:.1e}' for x in figures)}")
    assert max(figures) <= 1e-5
    live = live_shared(run_dir / "m16")
    assert live == live_shared(run_dir / "g16") and live["linear_compute_dtypes"]["lm_head"] == ["float16"]


def test_loss_scaler_follows_torch_update_rule():
    scale, tracker = torch.full((1,), 1024.0), torch.zeros(1, dtype=torch.int32)
    ours = DynamicLossScaler(1024.0, growth_factor=2.0, backoff_factor=0.5, growth_interval=3)
    for found_inf in [False, False, False, True, False, False, False, False, True, True, False]:
        torch._amp_update_scale_(scale, tracker, torch.full((1,), float(found_inf)), 2.0, 0.5, 3)
        ours.update(found_inf)
        assert ours.scale == float(scale[0]) and ours.growth_tracker == int(tracker[0])


def test_bf16_trains_finite_and_close(cfg, run_dir):
    short = cfg.replace(total_steps=6, schedule=SHORT)
    golden.train(short, run_dir / "g32s", log=lambda line: None)
    golden.train(short.replace(dtype="bf16"), run_dir / "gbf16", log=lambda line: None)
    train(short.replace(dtype="bf16"), run_dir / "mbf16", progress=False, peak_flops=1e12)
    g32, gbf, mbf = metrics(run_dir / "g32s"), metrics(run_dir / "gbf16"), metrics(run_dir / "mbf16")
    assert all(np.isfinite(r["loss"]) and np.isfinite(r["grad_norm"]) for r in mbf)
    vs_golden = np.array([rel(a["loss"], b["loss"]) for a, b in zip(gbf, mbf, strict=True)])
    vs_fp32 = np.array([rel(a["loss"], b["loss"]) for a, b in zip(g32, mbf, strict=True)])
    print(f"\n[bf16 6 steps] vs golden bf16: first {vs_golden[0]:.1e} mean {vs_golden.mean():.1e}; "
          f"vs golden fp32: max {vs_fp32.max():.1e}")
    assert vs_golden[0] <= 1e-4 and vs_golden.mean() <= 5e-3
    assert vs_fp32.max() <= 2e-2
    assert mbf[-1]["loss"] < mbf[0]["loss"]


@pytest.fixture(scope="module")
def wide_init(cfg, run_dir):
    """The run's data and a Llama initialised with std 0.1, two steps whose losses are forward passes
    on the initial weights (warmup: lr 0 at step 1). At the default std 0.02 the logits are so small
    that bf16 moves the step-1 loss by ~2e-6, less than two frameworks' bf16 differ; here by ~5e-5."""
    folder = run_dir / "wide_init"
    save_hf_model(build_hf_model("gqa", vocab_size=VOCAB, initializer_range=0.1), folder / "hf")
    convert(folder / "hf", folder / "ms")
    return cfg.replace(hf_model=folder / "hf", ms_model=folder / "ms", total_steps=2, schedule=SHORT)


def test_bf16_is_the_golden_bf16_and_not_fp32(wide_init, run_dir):
    golden.train(wide_init, run_dir / "w32", log=lambda line: None)
    golden.train(wide_init.replace(dtype="bf16"), run_dir / "wbf16", log=lambda line: None)
    train(wide_init.replace(dtype="bf16"), run_dir / "mwbf16", progress=False, peak_flops=1e12)
    g32, gbf, mbf = metrics(run_dir / "w32"), metrics(run_dir / "wbf16"), metrics(run_dir / "mwbf16")
    vs_golden = [rel(a["loss"], b["loss"]) for a, b in zip(gbf, mbf, strict=True)]
    vs_fp32 = [rel(a["loss"], b["loss"]) for a, b in zip(g32, mbf, strict=True)]
    print(f"\n[bf16, init std 0.1, steps 1-2] MindSpore vs golden bf16: {', '.join(f'{x:.1e}' for x in vs_golden)}; "
          f"vs golden fp32: {', '.join(f'{x:.1e}' for x in vs_fp32)}")
    # Measured 2.4e-7, 2.9e-7 against the golden bf16 and 5.4e-5, 3.0e-5 against fp32: a run that
    # computes in fp32 (autocast off, rounding skipped) fails both.
    assert max(vs_golden) <= 5e-6
    assert min(vs_fp32) >= 1e-5
    eff = json.loads((run_dir / "mwbf16" / "effective_hparams.json").read_text())
    assert eff["live_shared"] == live_shared(run_dir / "wbf16")
    assert eff["live_shared"]["linear_compute_dtypes"] == {"decoder_layers": [["bfloat16"]] * 2,
                                                           "lm_head": ["bfloat16"]}
    assert eff["live_shared"]["parameter_dtypes"] == ["float32"] and eff["model"]["autocast"] == "bfloat16"
    cells = {c["class"]: c for c in eff["live_mindspore_only"]["cells"]}
    for kind in ("Linear", "LlamaAttention", "LlamaFeedForward"):
        assert cells[kind]["computes_in"] == "bfloat16"
    assert cells["Linear"]["parameter_dtypes"] == ["float32"] and cells["Linear"]["cells"] == 15
    assert cells["RMSNorm"]["computes_in"] == "float32"  # autocast leaves norms in fp32, as torch's does


@pytest.mark.parametrize("fused", [False, True])
def test_autocast_cells_without_rounding_are_the_plain_model(fused):
    # Autocast is a precision policy over the model's one forward; with rounding off it must be the plain model.
    from migrate.models.config import LlamaConfig
    from migrate.models.llama import LlamaForCausalLM

    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4, n_kv_heads=2,
                         seq_length=16, qkv_concat=fused, qkv_has_bias=True, tie_word_embeddings=fused)
    ids = ms.Tensor(np.random.default_rng(0).integers(0, 64, (2, 12)).astype(np.int32))
    plain, cast = LlamaForCausalLM(config), LlamaForCausalLM(config)
    autocast_model(cast, "bf16", rounding=False)
    np.testing.assert_array_equal(plain(ids)[0].asnumpy(), cast(ids)[0].asnumpy())
    rounded = autocast_model(LlamaForCausalLM(config), "bf16")(ids)[0].asnumpy()
    assert 0 < np.abs(rounded - plain(ids)[0].asnumpy()).max() < 1e-2


def test_recompute_gives_the_same_losses(fp32_runs, cfg, run_dir):
    # Evaluation rides along: it must not perturb the training either.
    train(cfg.replace(recompute=True, eval_interval=10, eval_data=cfg.data, eval_samples=12), run_dir / "rc",
          progress=False, peak_flops=1e12, stop_after=20)
    _, m, _, _ = fp32_runs
    rc = metrics(run_dir / "rc")
    assert len(rc) == 20
    worst = max(rel(a["loss"], b["loss"]) for a, b in zip(m, rc, strict=False))
    same = sum(a["loss"] == b["loss"] for a, b in zip(m, rc, strict=False))
    print(f"\n[recompute] 20 steps: {same} losses bit-identical, max rel {worst:.1e}")
    assert worst <= 1e-6
    eff = json.loads((run_dir / "rc" / "effective_hparams.json").read_text())
    # Which layers recompute, read from the live cells; the golden's gradient checkpointing flags say the same.
    assert eff["model"]["recompute"] and eff["live_shared"]["recompute_layers"] == [0, 1]
    hf_model = golden.build_model(cfg.replace(recompute=True))
    assert golden.live_facts(hf_model, None) == eff["live_shared"]
    evals = [json.loads(line) for line in (run_dir / "rc" / "eval.jsonl").read_text().splitlines()]
    assert [e["step"] for e in evals] == [10, 20] and evals[1]["eval_loss"] < evals[0]["eval_loss"]
    assert all(e["samples"] == 12 for e in evals)


def test_an_injected_fault_makes_the_run_drift(fp32_runs, cfg, run_dir):
    train(cfg, run_dir / "fault", progress=False, peak_flops=1e12, faults=["no_bias_correction"], stop_after=6)
    _, m, _, _ = fp32_runs
    faulty = metrics(run_dir / "fault")
    assert faulty[0]["loss"] == m[0]["loss"]  # same weights, same batch: the optimizer has not acted yet
    drift = np.mean([rel(a["loss"], b["loss"]) for a, b in zip(m, faulty, strict=False)])
    print(f"\n[fault no_bias_correction] mean loss rel over 6 steps {drift:.1e}")
    assert drift > 1e-3
    assert json.loads((run_dir / "fault" / "effective_hparams.json").read_text())["faults"] == ["no_bias_correction"]


def test_pynative_mode_gives_the_graph_numbers_on_the_golden_rows(fp32_runs, cfg, run_dir, monkeypatch):
    import migrate.train.trainer as trainer

    fed = []

    def recording(*args, **kwargs):  # what the training loop is handed, batch by batch
        for step, micro, rows in micro_batches(*args, **kwargs):
            fed.append((step, micro, rows.copy()))
            yield step, micro, rows

    monkeypatch.setattr(trainer, "micro_batches", recording)
    train(cfg, run_dir / "pynative", progress=False, peak_flops=1e12, mode="pynative", stop_after=2)
    samples = load_samples(cfg.data, cfg.seq_length)
    order = run_order(cfg, len(samples))
    assert [(s, m) for s, m, _ in fed] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for step, micro, rows in fed:
        np.testing.assert_array_equal(rows, samples[order[step, micro]])
    _, m, _, _ = fp32_runs
    py = metrics(run_dir / "pynative")
    assert [r["step"] for r in py] == [1, 2]
    assert max(rel(a["loss"], b["loss"]) for a, b in zip(m, py, strict=False)) <= 1e-6
    assert ms.get_context("mode") == ms.PYNATIVE_MODE  # train() restores the caller's mode
