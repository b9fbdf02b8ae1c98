"""Issue 11: `compare`'s clip rule must not fail correct bf16 / fp16 runs.

A missing clip epsilon moves the post-clip grad norm by 1e-6 / norm. In bf16
and fp16 runs of make demo's model shape, torch's own post-clip norm departs
from its clip formula by 0.5-3.5e-6 (it runs low), so the rule failed correct
runs (the README's "Limit"). The rule is now judged only where the epsilon
is measurable above the golden's own norm rounding, read from the golden's
log; elsewhere it says it was not judged. Correct bf16 / fp16 runs of several
seeds pass -- make demo's shape with max_grad_norm 1.0 over 12 steps among
them, which failed before -- and `clip_no_eps` still fails in fp32
(tests/test_compare_faults.py; synthetic cases below).
"""
import json
import shutil

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from migrate.cli import main
from migrate.compare import compare_runs
from migrate.convert import convert
from migrate.data.tokenize import tokenize_corpus
from migrate.demo_train import MODEL as DEMO_MODEL
from migrate.train.config import RunConfig
from migrate.train.trainer import train
from test_compare import golden_curve, write_log
from train_setup import load_golden, make_run_dir

golden = load_golden()
RUN = """\
hf_model: hf
ms_model: ms
data: data
seq_length: {seq}
micro_batch_size: 4
grad_accum_steps: 2
total_steps: 12
max_grad_norm: 1.0
seed: {seed}
dtype: {dtype}
optimizer: {{lr: 2.0e-3, weight_decay: 0.1}}
schedule: {{name: cosine, warmup_steps: 5, min_lr_rate: 0.1}}
out_dir: {{golden: golden, ms: ms_out}}
"""

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def roots(tmp_path_factory):
    tiny = make_run_dir(tmp_path_factory.mktemp("clip_tiny"))
    demo = make_run_dir(tmp_path_factory.mktemp("clip_demo"))
    shutil.rmtree(demo / "ms")
    shutil.rmtree(demo / "data")
    torch.manual_seed(0)   # make demo's model shape: hidden 128, 4 layers, GQA 8/4, vocab 320 here
    LlamaForCausalLM(LlamaConfig(vocab_size=320, **DEMO_MODEL)).save_pretrained(demo / "hf")
    convert(demo / "hf", demo / "ms")
    tokenize_corpus(sorted((demo / "corpus").glob("*.txt")), demo / "tok", 64, demo / "data")
    return {"tiny": (tiny, 16), "demo": (demo, 64)}


# Seeds vary on the tiny model (6 s a run); the demo shape's runs, 16-18 s each, one per dtype.
CASES = [("demo", "bf16", 0), ("demo", "fp16", 0),
         ("tiny", "bf16", 2), ("tiny", "bf16", 3), ("tiny", "fp16", 2)]


@pytest.mark.slow
@pytest.mark.parametrize("model, dtype, seed", CASES)
def test_correct_low_precision_runs_pass_compare(roots, model, dtype, seed, tmp_path, capsys):
    root, seq = roots[model]
    name = f"{dtype}_s{seed}"
    (root / f"{name}.yaml").write_text(RUN.format(seq=seq, seed=seed, dtype=dtype))
    cfg = RunConfig.load(root / f"{name}.yaml")
    golden.train(cfg, root / f"{name}_golden", log=lambda line: None)
    train(cfg, root / f"{name}_ms", progress=False, peak_flops=1e12)
    out = tmp_path / "c.json"
    code = main(["compare", str(root / f"{name}_golden"), str(root / f"{name}_ms"), "--dtype", dtype,
                 "--json", str(out)])
    console = " ".join(capsys.readouterr().out.split())
    report = json.loads(out.read_text())
    clip = next(c for c in report["checks"] if c["key"] == "clip")
    print(f"\n[{model} {dtype} seed {seed}] clip {clip['passed']} mean signed {clip['value']:.2e} "
          f"(bound {clip['limit']:.2e}) {clip['detail'][:160]}")
    assert code == 0, report["summary"]["verdict"]
    assert clip["passed"] in (True, None)
    if clip["passed"] is None:   # not judged: said in the notes and on the console, with the reason
        assert clip["detail"].startswith("clip rule not judged: the clip epsilon cannot be measured in this run")
        assert any(n.startswith("clip rule not judged") for n in report["notes"])
        assert "note: clip rule not judged" in console


# --------------------------------------------------------------------------- synthetic: what is measurable

def _logs(tmp_path, golden_rounding, ms_rule, name, max_norm=0.5):
    """Golden post-clip norms as torch's formula gives them times (1 + golden_rounding); MindSpore's by ms_rule."""
    steps, loss, lr, pre = golden_curve()
    exact = np.minimum(max_norm * pre / (pre + 1e-6), pre)
    g = write_log(tmp_path / name / "golden.jsonl", steps, loss, lr, pre,
                  extra={"grad_norm_clipped": exact * (1 + golden_rounding)})
    m = write_log(tmp_path / name / "ms.jsonl", steps, loss, lr, pre,
                  extra={"grad_norm_clipped": ms_rule(pre, max_norm)})
    return compare_runs(g, m, dtype="bf16").check("clip"), compare_runs(g, m, dtype="bf16")


def test_a_golden_whose_norm_runs_low_does_not_fail_a_correct_run(tmp_path):
    # bf16 demo runs: torch's post-clip norm 1-5e-6 below its formula, MindSpore's on it.
    low = -np.random.default_rng(0).uniform(1e-6, 5e-6, 100)
    torch_rule = lambda pre, max_norm: np.minimum(max_norm * pre / (pre + 1e-6), pre)  # noqa: E731
    check, result = _logs(tmp_path, low, torch_rule, "low")
    assert check.value > check.limit            # the old rule failed this correct run here
    assert check.passed is None and result.passed
    assert "departs from torch's max_norm · n / (n + 1e-6)" in check.detail and "estimated from the log" in check.detail


def test_an_exact_golden_still_judges_and_fails_a_missing_epsilon(tmp_path):
    tiny = np.random.default_rng(1).normal(0.0, 2e-8, 100)    # fp32-like rounding: 1e-6 / norm is 30x above it
    no_eps = lambda pre, max_norm: np.minimum(max_norm * pre / pre, pre)  # noqa: E731
    check, result = _logs(tmp_path, tiny, no_eps, "no_eps")
    assert check.passed is False and not result.passed
    assert [c.key for c in result.failed] == ["clip"]
