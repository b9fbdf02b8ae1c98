"""`migrate compare` fails a short fp32 run with each injected training fault (issue #4).

One golden PyTorch run, then the MindSpore trainer once clean and once per
fault of `migrate.train.knob_faults.TRAIN_FAULTS`, all from one run.yaml chosen so
that every fault shows in what the two sides measure:

  * the Llama has attention and MLP biases and weight decay is 0.3, so
    decaying biases and norm weights moves the loss within 20 steps;
  * max_grad_norm 0.01 clips every step (pre-clip norms ~0.9); the clipped
    gradients' RMS over the 39,584 parameters is 5e-5, so Adam's sqrt(v) is of
    that order and eps 1e-6 instead of 1e-8 changes the update by percents;
  * accumulation 2 (the missing loss division doubles the gradient norm);
  * warmup 3 steps (no bias correction shows from the first update, the
    shifted warmup in the lr of step 2).

clip_no_eps scales the clipped gradients by 1 + 1e-6 / norm: AdamW is blind to
that scale, so no loss curve shows it. Both sides log grad_norm_clipped, the
total norm measured on the clipped gradients, and compare's `clip` rule
catches it there.
"""
import json
import math

import pytest

from migrate.cli import main
from migrate.errors import MigrateError
from migrate.train.config import RunConfig
from migrate.train.knob_faults import TRAIN_FAULTS
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
total_steps: 20
max_grad_norm: 0.01
data_seed: 5
peak_flops: 2.5e12
optimizer: {lr: 3e-3, weight_decay: 0.3}
schedule: {name: cosine, warmup_steps: 3, min_lr_rate: 0.1}
out_dir: {golden: golden, ms: ms_out}
"""

# The check that must fail for each fault, and the step it must name first (None: any step).
CAUGHT_BY = {
    "adam_eps": ("mean", None),
    "no_bias_correction": ("max", 3),        # step 2 is the first update (lr 0 at step 1)
    "decay_biases": ("mean", None),
    "warmup_off_by_one": ("lr", 2),
    "no_accum_scaling": ("grad_max", 1),
    "clip_no_eps": ("clip", None),
    "beta2": ("mean", None),                 # AdamW's second moment: the updates, hence the loss
    "lr_late": ("lr", 2),                    # step 2 steps with step 1's lr (0 in warmup)
    "head_grad_scale": ("grad_mean", None),  # AdamW is blind to a tensor's scale; the norm is not
    "bf16_accum": ("hparams", None),         # 2^-9 roundings move no curve: the recorded accumulation dtype does
}


# slow as a whole: its module fixtures build golden and MindSpore runs of every fault
pytestmark = [pytest.mark.usefixtures("one_torch_thread"), pytest.mark.slow]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = make_run_dir(tmp_path_factory.mktemp("compare_faults"), variant="bias", run_yaml=RUN)
    golden.train(RunConfig.load(root / "run.yaml"), root / "golden", log=lambda line: None)
    return root


def trained(root, faults=(), again=True):
    """The MindSpore run with `faults` (trained again unless ``again=False`` finds it)."""
    name = "ms_" + ("_".join(faults) or "clean")
    if again or not (root / name / "metrics.jsonl").is_file():
        train(RunConfig.load(root / "run.yaml"), root / name, progress=False, faults=list(faults))
    return root / name


def run_and_compare(root, faults=()):
    name = trained(root, faults).name
    out = root / f"{name}.json"
    code = main(["compare", str(root / "golden"), str(root / name), "--json", str(out)])
    return code, json.loads(out.read_text()), root / name


def checks(report):
    return {c["key"]: c for c in report["checks"]}


def test_the_clean_run_passes_every_rule(root):
    code, report, out = run_and_compare(root)
    c = checks(report)
    print("\n[clean] " + ", ".join(f"{k} {v['value']:.2e}/{v['limit']:.0e}" for k, v in c.items() if k != "tokens"))
    assert code == 0, report["summary"]["verdict"]
    assert all(v["passed"] for v in c.values())
    clipped = [x for x in report["per_step"]["grad_norm_clipped_signed_rel"] if x != "nan"]
    assert len(clipped) == 20  # every step clipped on both sides: the clip rule judged all of them
    # MFU's peak came from run.yaml.
    throughput = json.loads((out / "effective_hparams.json").read_text())["throughput"]
    assert throughput["peak_flops"] == 2.5e12 and throughput["source"] == "run config (peak_flops)"


@pytest.mark.parametrize("fault", sorted(TRAIN_FAULTS))
def test_compare_fails_the_faulty_run(root, fault):
    assert set(CAUGHT_BY) == set(TRAIN_FAULTS)
    code, report, _ = run_and_compare(root, [fault])
    c = checks(report)
    key, step = CAUGHT_BY[fault]
    failed = [k for k, v in c.items() if v["passed"] is False]
    times = f"x{c[key]['value'] / c[key]['limit']:.3g}" if c[key]["limit"] else "a count"  # hparams: knobs that differ
    print(f"\n[{fault}] exit {code}; failed {failed}; {key} {c[key]['value']:.2e} > {c[key]['limit']:.0e} "
          f"({times}) from step {c[key]['step']}")
    assert code == 1
    assert c[key]["passed"] is False and c[key]["value"] > 2 * c[key]["limit"]  # a clear miss, not the edge
    if step is not None:
        assert c[key]["step"] == step
    assert c["first"]["passed"] is True  # step 1: same weights, same batch, no optimizer step yet
    if fault == "clip_no_eps":  # the curves: only the post-clip norm sees it; the recorded clip epsilon too
        assert sorted(failed) == ["clip", "hparams"]
        assert report["hparams"]["differing"] == ["clip_eps"]
        signed = [x for x in report["per_step"]["grad_norm_clipped_signed_rel"] if x != "nan"]
        assert min(signed) > 0  # MindSpore's clipped gradients are larger at every step


def test_peak_flops_in_run_yaml_is_validated(root):
    data = {"data": "data", "seq_length": 16, "total_steps": 2}
    assert RunConfig.from_dict({**data, "peak_flops": "3.12e14"}, base=root).peak_flops == 3.12e14
    assert RunConfig.from_dict(data, base=root).peak_flops is None
    with pytest.raises(MigrateError, match="peak_flops: must be a number > 0"):
        RunConfig.from_dict({**data, "peak_flops": 0}, base=root)


# --------------------------------------------------------------------------- the golden as the field's logs
# The same golden run written as each foreign log (tests/foreign_logs.py, in each producer's own format),
# against the MindSpore runs above: the clean run passes, every fault fails on the same rule and step. The
# effective_hparams.json cross-check is skipped (no such file beside a foreign log), so these verdicts come
# from the curves alone. clip_no_eps shows only in the post-clip norm, which no foreign format logs: for
# torch-clipping producers compare applies torch's formula to the golden's pre-clip norm; MindSpore
# Transformers does not clip as torch does, so there the rule is reported not judged.

FOREIGN = ("megatron", "hf_trainer", "hf_tensorboard", "megatron_tensorboard", "mindformers")


@pytest.fixture(scope="module")
def foreign(root):
    import torch

    from foreign_logs import (
        records,
        write_hf_tensorboard,
        write_hf_trainer_state,
        write_megatron,
        write_mindformers,
        write_tensorboard,
    )

    cfg = RunConfig.load(root / "run.yaml")
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=3e-3)
    sched, lrs = golden.build_scheduler(opt, cfg), [math.nan]
    for _ in range(cfg.total_steps + 1):  # Megatron prints the next step's lr: the schedule one step further
        lrs.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    recs = records(root / "golden")
    assert [r["lr"] for r in recs] == lrs[1:-1]
    next_lr, out = [math.nan] + lrs[2:], root / "foreign"
    out.mkdir()
    return {"megatron": write_megatron(recs, out / "megatron.log", next_lr),
            "hf_trainer": write_hf_trainer_state(recs, out / "hf"),
            "hf_tensorboard": write_hf_tensorboard(recs, out / "hf_tb"),
            "megatron_tensorboard": write_tensorboard(
                recs, out / "mg_tb", {"loss": "lm loss", "lr": "learning-rate", "grad_norm": "grad-norm"}, next_lr),
            "mindformers": write_mindformers(recs, out / "mindformers.log", steps_per_epoch=8)}


@pytest.mark.parametrize("fmt", FOREIGN)
def test_a_foreign_golden_log_passes_the_clean_run_and_fails_every_fault(root, foreign, fmt):
    def compare(faults=()):
        out = root / "foreign" / f"{fmt}_{'_'.join(faults) or 'clean'}.json"
        code = main(["compare", str(foreign[fmt]), str(trained(root, faults, again=False)), "--json", str(out)])
        return code, json.loads(out.read_text())

    code, report = compare()
    c = checks(report)
    assert code == 0, report["summary"]["verdict"]
    assert report["hparams"]["skipped"] and c["hparams"]["passed"] is None
    assert any(n.startswith("golden read as ") for n in report["notes"])
    assert ("clip" in c) == (fmt != "mindformers")
    print(f"\n[{fmt} clean] " + ", ".join(f"{k} {v['value']:.2e}/{v['limit']:.1e}" for k, v in c.items()
                                         if isinstance(v["value"], float) and v["limit"]))
    for fault in sorted(TRAIN_FAULTS):
        code, report = compare([fault])
        c = checks(report)
        failed = [k for k, v in c.items() if v["passed"] is False]
        key, step = CAUGHT_BY[fault]
        if key == "hparams":  # only the recorded knob shows it (bf16_accum), and a foreign log records none
            continue
        if fault == "clip_no_eps" and fmt == "mindformers":
            assert code == 0 and "clip" not in c
            assert any("clip rule not judged" in n and "does not clip as torch" in n for n in report["notes"])
            continue
        print(f"[{fmt} {fault}] failed {failed}; {key} {c[key]['value']:.2e} > {c[key]['limit']:.1e} "
              f"(x{c[key]['value'] / c[key]['limit']:.3g}) from step {c[key]['step']}")
        assert code == 1 and c[key]["passed"] is False and c[key]["value"] > 2 * c[key]["limit"], fault
        assert step is None or c[key]["step"] == step, (fault, c[key]["step"])
        assert c["first"]["passed"] is True
        if fault == "clip_no_eps":
            assert failed == ["clip"]
