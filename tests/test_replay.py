"""`migrate replay` names the stage and tensor where a one-sided fault parts the runs (issue 27).

One tiny golden run of 2 x 3 steps with a checkpoint after every step, and one MindSpore run per
fault, the fault starting at step k = 3 (`migrate train --fault NAME@3`), so both curves agree
first. For each: `migrate compare` fails and its last line is the replay command; `migrate replay`
(the step compare flags, walked back to the first whose saved states agree) names the right stage
and tensor, and the hyperparameter that reproduces it where one does (checked by re-running the
golden's step with MindSpore's value). A step of a run before its fault starts replays clean, and
both sides reproduce their logged loss.

The run.yaml makes each fault show in 6 steps: weight decay 1.0 at lr 1e-2 (decaying the norm
weights moves the loss within three steps), max_grad_norm 0.01 so every step clips (the clip
epsilon), accumulation 2 (the divisor), warmup 2 (the late schedule shows at step 3). clip_no_eps
and bf16_accum move no curve in 4 faulty steps of 6 (compare's clip rule was 7.30e-7 against its
bound 7.48e-7): compare fails them on the knob both runs record (clip epsilon, accumulation dtype),
which the trainer records again when a fault rebuilds its objects, with the step it starts at.
The replays run the MindSpore step in PyNative (`--mode pynative`, no graph compile); one runs in
the run's own graph mode.
"""
import json
import shutil
import sys

import pytest

from migrate.cli import main
from migrate.train.config import RunConfig
from train_setup import load_golden, make_run_dir

golden = load_golden()

RUN = """\
hf_model: hf
ms_model: ms
data: data
seq_length: 16
micro_batch_size: 4
grad_accum_steps: 2
total_steps: 6
max_grad_norm: 0.01
data_seed: 5
peak_flops: 2.5e12
checkpoint_interval: 1
keep_checkpoints: 10
reference: off
tensorboard: false
optimizer: {lr: 1e-2, weight_decay: 1.0}
schedule: {name: cosine, warmup_steps: 2, min_lr_rate: 0.1}
out_dir: {golden: golden, ms: ms_out}
"""

# fault spec -> (the step replayed, the stage that parts first, what the line names, how it ends: the
# hyperparameter whose MindSpore value, tried in the golden's own step, reproduces MindSpore's numbers)
FAULTS = {
    "beta2@3": (3, "moments", "exp_avg_sq of lm_head.weight parts first", "; beta2 0.999 vs 0.95 reproduces it"),
    "decay_biases@3": (3, "parameters", "update of model.norm.weight parts first",
                       "; weight decay applied to model.layers.0.input_layernorm.weight, "
                       "model.layers.0.mlp.down_proj.bias and 17 more on MindSpore's side only reproduces it"),
    "clip_no_eps@3": (3, "clip", "clip factor parts first", "; clip epsilon 1e-06 vs 0 reproduces it"),
    "lr_late@3": (3, "lr", "lr of the step parts first", "; lr of step 3 1.00e-02 vs 5.00e-03 reproduces it"),
    "no_accum_scaling@3": (3, "gradients", "gradient of lm_head.weight after micro-batch 1 parts first",
                           "; accumulation divisor 2 vs 1 reproduces it"),
    # no hyperparameter: the gradient seam of the backward
    "head_grad_scale@3": (3, "gradients", "gradient of lm_head.weight after micro-batch 1 parts first",
                          "; the two sides' hyperparameters (betas, eps, weight decay and its tensors, lr, clip "
                          "epsilon, accumulation divisor) all agree"),
}
# bf16 runs, 2 x 4 steps (step 3, the first from states that differ by bf16's own rounding, replays clean):
# bf16 gradients accumulated in bf16. Every add rounded to 8 bits moves no curve (compare fails on the
# accumulation dtype both runs record, from the step the fault rebuilt the MindSpore objects) and stays
# within the gradient bounds; the head's gradient is bf16 already (autocast's matmul), the final norm's is
# not, and its rounding parts first.
BF16_FAULTS = {
    "bf16_accum@4": (4, "accumulation", "accumulation of micro-batch 1's gradient into model.norm.weight parts "
                                        "first", "more part after it"),
}

pytestmark = [pytest.mark.usefixtures("one_torch_thread", "this_golden"), pytest.mark.slow]


@pytest.fixture(scope="module", autouse=True)
def this_golden():
    """`migrate replay` loads golden/train_torch.py as `migrate.golden.train_torch`, which an editable
    install may map to another checkout: this checkout's file, for the module's tests."""
    name = "migrate.golden.train_torch"
    before = sys.modules.get(name)
    sys.modules[name] = golden  # this one key only: the modules the tests import stay loaded after them
    yield
    if before is None:
        del sys.modules[name]
    else:
        sys.modules[name] = before


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = make_run_dir(tmp_path_factory.mktemp("replay"), variant="bias", run_yaml=RUN)
    golden.train(RunConfig.load(root / "run.yaml"), root / "golden", log=lambda line: None)
    return root


@pytest.fixture(scope="module")
def bf16_root(root):
    """The run in bf16 for 8 steps (its own golden), beside the fp32 one."""
    run = root / "bf16"
    shutil.copytree(root, run, ignore=shutil.ignore_patterns("golden", "ms_*", "bf16"))
    (run / "run.yaml").write_text(RUN.replace("total_steps: 6", "total_steps: 8") + "dtype: bf16\n")
    golden.train(RunConfig.load(run / "run.yaml"), run / "golden", log=lambda line: None)
    return run


def ms_run(root, fault: str):
    """The MindSpore run with `fault`, trained through the CLI once per module."""
    out = root / ("ms_" + fault.replace("@", "_at_"))
    if not (out / "metrics.jsonl").is_file():
        assert main(["train", "--config", str(root / "run.yaml"), "--out", str(out), "--fault", fault]) == 0
    return out


def replay(root, run, *args, capsys):
    capsys.readouterr()
    code = main(["replay", str(root / "golden"), str(run), *args])
    return code, capsys.readouterr().out


def last_line(text: str) -> str:
    """The last printed line, rich's soft-wrapped lines joined."""
    return " ".join(text.strip().splitlines()[-1:])


@pytest.mark.parametrize("dtype, fault", [("fp32", f) for f in FAULTS] + [("bf16", f) for f in BF16_FAULTS])
def test_compare_fails_and_replay_names_the_stage_and_tensor(dtype, fault, capsys, tmp_path, request):
    root = request.getfixturevalue("root" if dtype == "fp32" else "bf16_root")
    run = ms_run(root, fault)
    capsys.readouterr()
    assert main(["compare", str(root / "golden"), str(run)]) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1] == f"to see which tensor parts first: migrate replay {root / 'golden'} {run}"
    step, stage, named, ending = (FAULTS if dtype == "fp32" else BF16_FAULTS)[fault]
    report = ("--report", str(tmp_path / "rep")) if stage in ("clip", "lr", "accumulation") else ()
    code, out = replay(root, run, "--mode", "pynative", *report, capsys=capsys)
    text = " ".join(out.split())
    print(f"\n[{fault}] {text[text.rfind('step ' + str(step) + ':'):]}")
    assert code == 1
    assert f"step {step}: " in text and named in text and text.endswith(ending)
    agreed = text[text.rfind(f"step {step}: "):].split(" agree;")[0]
    assert stage not in agreed  # the stage that parts is not among those said to agree
    for side in ("golden", "MindSpore"):  # the replayed step is the run's own step, bit for bit here
        assert f"{side} replay reproduces its logged step-{step} loss" in text
    if report:  # the report files fail too where a figure that is no tensor parts first (clip: only it parts)
        written = json.loads((tmp_path / "rep" / "report.json").read_text())
        assert written["summary"]["passed"] is False
        assert (tmp_path / "rep" / "report.md").read_text().startswith("# Alignment report: FAIL")
        assert stage in {c["key"] for c in written["checks"] if c["passed"] is False}


def test_a_step_before_the_fault_replays_clean_in_graph_mode(root, capsys, tmp_path):
    run = ms_run(root, "beta2@3")
    code, out = replay(root, run, "--step", "2", "--report", str(tmp_path / "rep"), capsys=capsys)
    text = " ".join(out.split())
    assert code == 0, text[-400:]
    assert text.endswith("step 2: every quantity agrees (forward, loss, accumulation, gradients, grad norm, clip, lr, "
                         "moments, parameters)")
    report = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert report["run"]["extra"]["step"] == 2 and report["summary"]["passed"] is True
    assert report["run"]["extra"]["verdict"] == {"passed": True, "first": None, "line": text[text.rfind("step 2:"):]}
    grads = [e for e in report["entries"] if e["kind"] == "grad" and "after micro-batch 2" in e["name"]]
    assert grads and all(e["passed"] for e in grads)
    # the norm, clip factor and lr of the step: judged checks in report.json, a table of their own in the MD and HTML
    checks = {c["key"]: c for c in report["checks"]}
    assert {"grad_norm", "clip", "lr", "accumulation"} <= set(checks) and all(c["passed"] for c in report["checks"])
    md, html = ((tmp_path / "rep" / f"report.{ext}").read_text() for ext in ("md", "html"))
    assert "## Checks (figures that are no tensor: norms, factors, lr, accumulation)" in md
    assert "<h2>Checks (figures that are no tensor: norms, factors, lr, accumulation)</h2>" in html
    for key, label in (("grad_norm", "global gradient norm (before clipping) rel diff"),
                       ("clip", "clip factor: the epsilon it implies"), ("lr", "lr of the step rel diff")):
        row = next(line for line in md.splitlines() if line.startswith(f"| {key} |"))
        assert label in row and "| ok |" in row, row
        assert label in html


def test_replay_at_a_step_whose_states_already_part_says_so(root, capsys):
    code, out = replay(root, ms_run(root, "beta2@3"), "--step", "4", "--mode", "pynative", capsys=capsys)
    text = " ".join(out.split())
    assert code == 1
    assert "the states saved after step 3 already part (exp_avg_sq lm_head.weight: " in text  # beta2: v parts
    assert "replay step 3 or earlier to see where" in text


def test_no_checkpoint_before_the_step_is_one_line_naming_the_interval(root, capsys, tmp_path):
    bare = tmp_path / "golden_bare"
    bare.mkdir()
    shutil.copy(root / "golden" / "metrics.jsonl", bare)
    every4 = root / "run_every4.yaml"  # the run as if it had checkpointed every 4 steps
    every4.write_text((root / "run.yaml").read_text().replace("checkpoint_interval: 1", "checkpoint_interval: 4"))
    capsys.readouterr()
    code = main(["replay", str(bare), str(ms_run(root, "beta2@3")), "--step", "3", "--config", str(every4)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "needs the golden state after step 2" in err[0] and "it has no checkpoint" in err[0]
    assert "a checkpoint_interval that divides 2 (1 does) would have written it" in err[0]


def test_a_correct_bf16_step_replays_clean(bf16_root, capsys):
    """bf16 rounds AdamW's m / sqrt(v) so that single near-zero-gradient elements of a correct step move
    0.125 of their tensor's peak apart: the updates are held by their relative L2 error. Step 3 starts
    from states that already differ by each side's rounding (step 1's lr is 0): its forward runs the
    golden's weights on both sides, and a correct bf16 step passes every stage."""
    code, out = replay(bf16_root, ms_run(bf16_root, "bf16_accum@4"), "--step", "3", "--mode", "pynative",
                       capsys=capsys)
    assert code == 0, out[-1500:]
    assert last_line(out).endswith("every quantity agrees (forward, loss, accumulation, gradients, grad norm, clip, "
                                   "lr, moments, parameters)")


def test_a_bf16_gradient_scaled_by_one_percent_is_named_by_its_scale(bf16_root, capsys):
    """bf16: the head's gradient x 1.01 from step 4 (`head_grad_scale@4`) stays inside every gradient bound a
    correct bf16 step's rounding needs, and compare with bf16's bounds passes the run (fp32's flag step 4's
    grad_mean, 5.1e-3), so the step is given. The least-squares scale of each gradient on the golden's, held
    to its standard error (`judging.SCALE_Z`), names it; step 3 of the same run (the test above) holds it."""
    run = ms_run(bf16_root, "head_grad_scale@4")
    capsys.readouterr()
    assert main(["compare", str(bf16_root / "golden"), str(run), "--dtype", "bf16"]) == 0
    code, out = replay(bf16_root, run, "--step", "4", "--mode", "pynative", capsys=capsys)
    text = " ".join(out.split())
    print(f"\n[bf16 head_grad_scale@4] {text[text.rfind('step 4:'):]}")
    assert code == 1
    assert "step 4: forward, loss and accumulation agree; scale of the gradient of lm_head.weight after " \
           "micro-batch 1 parts first: s 1.01" in text
    assert text.endswith("accumulation divisor) all agree")


@pytest.fixture(scope="module")
def fp16_root(root):
    """The run in fp16 (loss scale on), 2 x 3 steps with its own golden, beside the fp32 one."""
    run = root / "fp16"
    shutil.copytree(root, run, ignore=shutil.ignore_patterns("golden", "ms_*", "bf16", "fp16"))
    (run / "run.yaml").write_text(RUN + "dtype: fp16\n")
    golden.train(RunConfig.load(run / "run.yaml"), run / "golden", log=lambda line: None)
    return run


def test_fp16_with_its_loss_scale_names_the_fault_and_replays_a_clean_step_clean(fp16_root, capsys):
    """fp16: the loss scaler's state is loaded and its scale applied on both sides; beta2 from step 3 of
    6 is named as in fp32, and step 2, before it, replays clean."""
    run = ms_run(fp16_root, "beta2@3")
    capsys.readouterr()
    assert main(["compare", str(fp16_root / "golden"), str(run), "--dtype", "fp16"]) == 1
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("to see which tensor parts first: migrate "
                                                                         "replay")
    code, out = replay(fp16_root, run, "--mode", "pynative", capsys=capsys)
    text = " ".join(out.split())
    print(f"\n[fp16 beta2@3] {text[text.rfind('step 3:'):]}")
    assert code == 1 and "fp16" in text
    assert "step 3: " in text and "exp_avg_sq of lm_head.weight parts first" in text
    assert text.endswith("; beta2 0.999 vs 0.95 reproduces it")
    for side in ("golden", "MindSpore"):
        assert f"{side} replay reproduces its logged step-3 loss" in text
    code, out = replay(fp16_root, run, "--step", "2", "--mode", "pynative", capsys=capsys)
    assert code == 0, out[-1500:]
    assert last_line(out).endswith("every quantity agrees (forward, loss, accumulation, gradients, grad norm, clip, "
                                   "lr, moments, parameters)")
