"""Issue 11: `migrate compare` cross-checks the two runs' effective hyperparameters.

Both sides write effective_hparams.json beside metrics.jsonl. Here both are
real (a 3-step golden run and a 3-step MindSpore run of a tiny Llama from one
run.yaml); the cases edit a copy of one file the way a one-sided setting
would leave it, or move the logs away from their files (foreign logs).
"""
import copy
import json
import shutil

import matplotlib.figure
import pytest

from migrate.cli import main
from migrate.compare import compare_runs, render_plot
from migrate.compare.effective_hparams import KNOBS
from migrate.train.config import RunConfig
from migrate.train.trainer import train
from train_setup import load_golden, make_run_dir

golden = load_golden()
RUN = """\
hf_model: hf
ms_model: ms
data: data
seq_length: 16
micro_batch_size: 4
grad_accum_steps: 2
total_steps: 3
max_grad_norm: 1.0
data_seed: 5
optimizer: {lr: 1e-3, weight_decay: 0.1}
schedule: {name: cosine, warmup_steps: 1, min_lr_rate: 0.1}
out_dir: {golden: golden, ms: ms_out}
"""

# slow as a whole: its module fixtures build a trained golden/MindSpore pair
pytestmark = [pytest.mark.usefixtures("one_torch_thread"), pytest.mark.slow]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = make_run_dir(tmp_path_factory.mktemp("compare_hparams"), run_yaml=RUN)
    cfg = RunConfig.load(root / "run.yaml")
    golden.train(cfg, root / "golden", log=lambda line: None)
    train(cfg, root / "ms", progress=False, peak_flops=1e12)
    return root


def edited(root, tmp_path, side, edit):
    """A copy of one run folder whose effective_hparams.json went through `edit`."""
    out = tmp_path / side
    shutil.copytree(root / side, out)
    data = json.loads((out / "effective_hparams.json").read_text())
    edit(data)
    (out / "effective_hparams.json").write_text(json.dumps(data))
    return out


def compare_cli(capsys, golden_dir, ms_dir, *extra, json_out=None):
    args = ["compare", str(golden_dir), str(ms_dir), *extra]
    if json_out is not None:
        args += ["--json", str(json_out)]
    code = main(args)
    captured = capsys.readouterr()
    return code, " ".join(captured.out.split()), captured.err.strip()


def test_the_files_of_a_correct_pair_agree_on_every_shared_knob(root, tmp_path, capsys):
    code, out, _ = compare_cli(capsys, root / "golden", root / "ms", json_out=tmp_path / "c.json")
    report = json.loads((tmp_path / "c.json").read_text())
    hp = report["hparams"]
    print(f"\n[hparams] compared {len(hp['knobs'])} knobs; not compared: {hp['not_compared']}")
    assert code == 0 and hp["passed"] is True and hp["skipped"] is None
    # Everything in the shared vocabulary is recorded by both sides (live_shared too); fp16 alone has a loss scale.
    assert {k["knob"] for k in hp["knobs"]} == set(KNOBS) - {"loss_scale"} and hp["not_compared"] == ["loss_scale"]
    assert next(c for c in report["checks"] if c["key"] == "hparams")["passed"] is True
    assert f"{len(KNOBS) - 1} hyperparameters agree" in out  # loss_scale: fp16 only


@pytest.mark.parametrize("knob, edit, shown", [
    ("weight_decay", lambda d: [g.update(weight_decay=0.0) for g in d["optimizer"]["groups"]],
     "weight_decay · golden 0.1 · MindSpore 0"),
    ("eps", lambda d: [g.update(eps=1e-6) for g in d["optimizer"]["groups"]], "eps · golden 1e-08 · MindSpore 1e-06"),
    ("lr", lambda d: d["scheduler"]["lr"].__setitem__(1, 7e-4), "lr · golden 0.001 · MindSpore 0.0007"),
    ("autocast", lambda d: d["model"].update(autocast="bfloat16"), "autocast · golden null · MindSpore bf16"),
    ("live.recompute_layers", lambda d: d["live_shared"].update(recompute_layers=[1]),
     "live.recompute_layers · golden [] · MindSpore [1]"),
])
def test_a_knob_set_on_one_side_fails_and_is_named(root, tmp_path, capsys, monkeypatch, knob, edit, shown):
    ms_dir = edited(root, tmp_path, "ms", edit)
    code, out, _ = compare_cli(capsys, root / "golden", ms_dir, json_out=tmp_path / "c.json")
    report = json.loads((tmp_path / "c.json").read_text())
    assert code == 1
    assert report["hparams"]["differing"] == [knob]
    assert report["summary"]["verdict"].startswith(f"FAIL · effective hyperparameters differ: {knob} (golden ")
    assert f"hyperparameter differs: {shown}" in out
    row = next(k for k in report["hparams"]["knobs"] if k["knob"] == knob)
    assert row["same"] is False and row["golden"] != row["mindspore"]
    if knob == "lr":
        assert row["detail"] == "first differs at optimizer step 2"
    # ... and in the plot's title
    titles = []
    real = matplotlib.figure.Figure.suptitle
    monkeypatch.setattr(matplotlib.figure.Figure, "suptitle", lambda self, t, **kw: titles.append(t) or real(self, t))
    render_plot(compare_runs(root / "golden", ms_dir))
    assert f"hyperparameters differ: {knob} golden " in titles[0] and "≠ MindSpore" in titles[0]


def test_side_only_fields_and_spellings_do_not_fail(root, tmp_path, capsys):
    def edit(d):
        d["accumulation"]["loss_divisor"] = 1          # MindSpore alone records the loss divisor
        d["throughput"] = {"peak_flops": 1.0}          # measured peak FLOPs
        d["parallel"] = {"dp": 2}                      # the parallel section
        d["faults"] = ["clip_no_eps"]
        d["config"]["out_dir"] = {"golden": "/elsewhere", "ms": "/elsewhere"}
        d["model"]["weights_dtype"] = "mindspore.float32"   # another spelling of the same dtype
    code, out, _ = compare_cli(capsys, root / "golden", edited(root, tmp_path, "ms", edit))
    assert code == 0 and "hyperparameters agree" in out


def test_the_batch_split_is_not_a_knob_the_global_batch_is(root, tmp_path, capsys):
    def dp2(d):   # the same 8 sequences a step as 2 ranks x 2 rows x 2 micro-batches
        d["accumulation"].update(micro_batch_size=2, grad_accum_steps=2)
        d["parallel"] = {"dp": 2, "global_batch": 8}
    code, out, _ = compare_cli(capsys, root / "golden", edited(root, tmp_path / "a", "ms", dp2))
    assert code == 0 and "hyperparameters agree" in out
    code, out, _ = compare_cli(capsys, root / "golden", edited(
        root, tmp_path / "b", "ms", lambda d: d["accumulation"].update(grad_accum_steps=4)))
    assert code == 1 and "hyperparameter differs: global_batch · golden 8 · MindSpore 16" in out


def test_foreign_logs_skip_the_check_saying_so_or_take_hparams(root, tmp_path, capsys):
    logs = tmp_path / "logs"
    for side in ("golden", "ms"):
        (logs / side).mkdir(parents=True)
        shutil.copy(root / side / "metrics.jsonl", logs / side / "metrics.jsonl")
    code, out, _ = compare_cli(capsys, logs / "golden", logs / "ms", json_out=tmp_path / "skip.json")
    report = json.loads((tmp_path / "skip.json").read_text())
    assert code == 0
    assert report["hparams"]["skipped"].startswith("hyperparameters not cross-checked: ")
    assert "effective_hparams.json not found" in report["hparams"]["skipped"]
    assert any(n.startswith("hyperparameters not cross-checked") for n in report["notes"])
    assert "note: hyperparameters not cross-checked" in out and "hyperparameters not cross-checked" in out.split(
        "PASS")[-1]
    hp_check = next(c for c in report["checks"] if c["key"] == "hparams")
    assert hp_check["passed"] is None

    # --hparams names the files of logs kept elsewhere
    wd0 = edited(root, tmp_path, "ms", lambda d: [g.update(weight_decay=0.0) for g in d["optimizer"]["groups"]])
    code, out, _ = compare_cli(capsys, logs / "golden", logs / "ms", "--hparams",
                               str(root / "golden" / "effective_hparams.json"), str(wd0 / "effective_hparams.json"))
    assert code == 1 and "hyperparameter differs: weight_decay · golden 0.1 · MindSpore 0" in out


def test_bad_hparams_files_are_one_line_errors(root, tmp_path, capsys):
    gfile, mfile = root / "golden" / "effective_hparams.json", root / "ms" / "effective_hparams.json"
    out = tmp_path / "c.json"
    cases = [
        ((tmp_path / "none.json", mfile), f"{tmp_path / 'none.json'}: no such file (golden effective hyperparameters)"),
        ((mfile, gfile), f"{mfile} is the mindspore side's effective hyperparameters, given as the golden side's"),
    ]
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    cases.append(((gfile, bad), f"{bad}: not JSON"))
    for (a, b), message in cases:
        code, _, err = compare_cli(capsys, root / "golden", root / "ms", "--hparams", str(a), str(b), json_out=out)
        assert code == 2 and err.startswith(f"migrate: error: {message}") and "\n" not in err
        assert not out.exists()


def test_no_shared_knob_is_a_skip_not_a_pass(root, tmp_path):
    foreign = tmp_path / "foreign.json"
    foreign.write_text(json.dumps({"learning_rate": 1e-3}))
    r = compare_runs(root / "golden", root / "ms", hparams=(foreign, root / "ms" / "effective_hparams.json"))
    assert r.check("hparams").passed is None and "share no knob" in r.check("hparams").detail


def test_knob_readers_take_the_recorded_values(root):
    data = json.loads((root / "golden" / "effective_hparams.json").read_text())
    values = {knob: read(copy.deepcopy(data)) for knob, (read, _) in KNOBS.items()}
    assert values["weight_decay"] == 0.1 and values["eps"] == 1e-8 and values["betas"] == [0.9, 0.999]
    assert values["decayed_parameters"] + sum(
        g["numel"] for g in data["optimizer"]["groups"] if not g["weight_decay"]) == sum(
        g["numel"] for g in data["optimizer"]["groups"])
    assert values["dtype"] == "fp32" and values["autocast"] is None and values["recompute"] is False
    assert len(values["lr"]) == 3 and values["clip_max_norm"] == 1.0
