"""`migrate diff A B` on two training checkpoints (`migrate.state_diff`): through the CLI, on real runs.

- an HF Trainer checkpoint against the MindFormers checkpoint converted from it (weights by `migrate
  convert`, moments through the same keymap, legacy and mcore names): PASS; one moment perturbed: FAIL,
  naming it (the issue's Done-when);
- the golden script's checkpoint against `migrate train`'s of the same tiny run: PASS (with and without a
  noise run); a second moment x 1.01 or a step counter off: FAIL, naming it;
- bad input: no checkpoint, a truncated optimizer.pt, a pickle naming a class, missing moments: one line, exit 2.
"""
import json
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file as load_numpy
from safetensors.numpy import save_file as save_numpy

from hf_fixtures import build_hf_model, save_hf_model
from migrate.checkpoints.ms_reader import open_ms_checkpoint
from migrate.cli import main
from migrate.convert import convert
from migrate.keymap import recorded_keymap, resolve
from migrate.models.conversion_plan import ConversionPlan
from migrate.models.registry import load_model_config
from migrate.train.decay import hf_decay_names

STEPS = 4


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(map(str, argv)))
    out = capsys.readouterr()
    return code, out.out, out.err.strip()


def refused(capsys, *argv, pattern: str) -> str:
    code, _, err = run_cli(capsys, "diff", *argv)
    assert code == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("migrate: error: "), err
    assert pattern in err, err
    return err


def verdict(tmp_path, capsys, a, b, *extra) -> dict:
    """report.json of `migrate diff A B`, its exit code checked against the verdict it holds."""
    out = tmp_path / f"report{len(list(tmp_path.glob('report*')))}"
    code, stdout, err = run_cli(capsys, "diff", a, b, "--report", out, *extra)
    report = json.loads((out / "report.json").read_text())
    assert code == (0 if report["summary"]["passed"] else 1), (code, err, stdout[-2000:])
    return report


def first_state_divergence(report: dict) -> str | None:
    point = report["summary"]["first_grad_divergence"]
    return point and point["name"]


def mindformers_file(hf_ckpt: Path, moments: dict, out: Path, work: Path, target=None, scalars=None) -> Path:
    """A MindSpore Transformers training checkpoint of the same state: the weights converted by `migrate
    convert`, each HF-named moment carried through the same keymap (fused layouts included) as
    adam_m.<name> / adam_v.<name> beside them, and the scalars its trainer appends."""
    ms = work / f"converted_{target}"
    if not ms.exists():
        convert(hf_ckpt, ms, target=target)
    config = load_model_config(ms)
    plan = ConversionPlan(resolve(recorded_keymap(ms)).for_model(config.to_dict()), config)
    written = plan.written_name()
    tensors = dict(open_ms_checkpoint(ms).tensors())
    for prefix, which in (("adam_m.", "exp_avg"), ("adam_v.", "exp_avg_sq")):
        tensors.update({prefix + written(n): a for n, a in plan.in_model_names(moments[which]).items()})
    tensors.update({k: np.asarray([v], np.float32 if isinstance(v, float) else np.int32)
                    for k, v in (scalars or {}).items()})
    if out.suffix == ".ckpt":
        from migrate.train.checkpoint.files import save_tensors_atomically

        save_tensors_atomically(tensors, out)   # MindSpore's own writer
    else:
        save_numpy(tensors, str(out))
    return out


def live_moments(model, optimizer) -> dict:
    """The optimizer's moments by parameter name, from the live objects (not from any file)."""
    names = {id(p): n for n, p in model.named_parameters()}
    return {which: {names[id(p)]: s[which].detach().numpy().copy() for p, s in optimizer.state.items()}
            for which in ("exp_avg", "exp_avg_sq")}


# --------------------------------------------------------------------------- HF Trainer vs MindFormers

@pytest.fixture(scope="module")
def hf_trainer(tmp_path_factory, one_torch_thread):
    """A tiny Llama trained STEPS steps by transformers.Trainer on CPU (checkpoint-STEPS saved), and the
    MindFormers checkpoints of the same state in legacy and mcore names."""
    from transformers import Trainer, TrainingArguments

    root = tmp_path_factory.mktemp("hf_trainer")
    model = build_hf_model("gqa").train()
    ids = np.random.default_rng(0).integers(0, model.config.vocab_size, size=(32, 16))
    data = [{"input_ids": torch.tensor(r), "labels": torch.tensor(r)} for r in ids]
    args = TrainingArguments(output_dir=str(root / "run"), max_steps=STEPS, save_steps=STEPS,
                             per_device_train_batch_size=4, learning_rate=3e-3, weight_decay=0.1, warmup_steps=1,
                             report_to=[], use_cpu=True, seed=0, disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=data)
    trainer.train()
    ckpt = root / "run" / f"checkpoint-{STEPS}"
    moments = live_moments(model, trainer.optimizer)
    scalars = {"global_step": STEPS, "step_num": STEPS, "learning_rate": float(trainer.optimizer.param_groups[0]["lr"])}
    files = {target: mindformers_file(ckpt, moments, root / f"mf_{target}.safetensors", root, target, scalars)
             for target in (None, "mcore")}
    return ckpt, files


@pytest.mark.slow
@pytest.mark.parametrize("target", [None, "mcore"])
def test_hf_trainer_against_its_mindformers_checkpoint_passes(hf_trainer, target, tmp_path, capsys):
    ckpt, files = hf_trainer
    report = verdict(tmp_path, capsys, ckpt, files[target])
    assert report["summary"]["passed"], report["summary"]
    names = [e["name"] for e in report["entries"]]
    # counters and the lr first, then per parameter its moments and itself, the LM head before the embedding
    assert names[:3] == ["step", "optimizer step", "learning rate"]
    assert names[3:6] == ["exp_avg lm_head.weight", "exp_avg_sq lm_head.weight", "param lm_head.weight"]
    assert names[-1] == "param model.embed_tokens.weight"
    layers = [int(n.split(".")[2]) for n in names if ".layers." in n]
    assert layers == sorted(layers, reverse=True)   # the last layer first
    params = {n.split(" ", 1)[1] for n in names if n.startswith("param ")}
    assert "model.layers.1.self_attn.k_proj.weight" in params   # mcore's fused linear_qkv split back
    assert len(names) == 3 + 3 * len(params)
    assert report["run"]["extra"]["names"].startswith("HF names through keymap hf_llama")


@pytest.mark.slow
def test_hf_trainer_against_a_perturbed_moment_fails_naming_it(hf_trainer, tmp_path, capsys):
    ckpt, files = hf_trainer
    tensors = load_numpy(str(files[None]))
    tensors["adam_v.model.layers.0.feed_forward.w2.weight"] *= np.float32(1.01)
    bad = tmp_path / "mf_bad.safetensors"
    save_numpy(tensors, str(bad))
    report = verdict(tmp_path, capsys, ckpt, bad)
    assert not report["summary"]["passed"]
    assert first_state_divergence(report) == "exp_avg_sq model.layers.0.mlp.down_proj.weight"
    assert [e["name"] for e in report["entries"] if not e["passed"]] == [first_state_divergence(report)]


@pytest.mark.slow
def test_one_element_of_a_fused_mcore_moment_is_traced_to_its_hf_tensor(hf_trainer, tmp_path, capsys):
    ckpt, files = hf_trainer
    tensors = load_numpy(str(files["mcore"]))
    moment = tensors["adam_m.decoder.layers.1.self_attention.linear_qkv.weight"]
    moment[0, 0] += np.float32(1e-3) * np.abs(moment).max()   # row 0 of the groups layout: q, head 0
    bad = tmp_path / "mf_mcore_bad.safetensors"
    save_numpy(tensors, str(bad))
    code, out, _ = run_cli(capsys, "diff", ckpt, bad)
    assert code == 1
    line = next(li for li in out.splitlines() if li.endswith("— first state divergence"))
    assert line.startswith("exp_avg model.layers.1.self_attn.q_proj.weight · "), line


# --------------------------------------------------------------------------- golden vs migrate train

@pytest.fixture(scope="module")
def paired_root(tmp_path_factory):
    """A tiny run.yaml both sides read (STEPS steps, checkpoints every 2), its data and models."""
    from train_setup import RUN, make_run_dir

    run_yaml = (RUN.replace("total_steps: 200", f"total_steps: {STEPS}").replace("warmup_steps: 20", "warmup_steps: 2")
                + "checkpoint_interval: 2\n")
    return make_run_dir(tmp_path_factory.mktemp("paired"), run_yaml=run_yaml)


def train_both(root: Path, cfg, name: str) -> tuple[Path, Path]:
    """The golden script and `migrate train` on one config: their checkpoints at step STEPS."""
    from migrate.train.trainer import train
    from train_setup import load_golden

    load_golden().train(cfg, root / f"golden_{name}", log=lambda *a: None)
    train(cfg, root / f"ms_{name}", progress=False)
    return root / f"golden_{name}" / f"checkpoint-{STEPS}", root / f"ms_{name}" / "checkpoints" / f"checkpoint-{STEPS}"


@pytest.fixture(scope="module")
def paired_runs(paired_root, one_torch_thread):
    from train_setup import load_cfg

    return train_both(paired_root, load_cfg(paired_root), "full")


@pytest.fixture(scope="module")
def lora_runs(paired_root, one_torch_thread):
    """The same run with LoRA adapters (rank 4 on q_proj and v_proj): PEFT's adapter against adapter.ckpt."""

    (paired_root / "lora.yaml").write_text((paired_root / "run.yaml").read_text() + "lora: {rank: 4, alpha: 8}\n")
    from migrate.train.config import RunConfig

    return train_both(paired_root, RunConfig.load(paired_root / "lora.yaml"), "lora")


def golden_copy(src: Path, dst: Path, change) -> Path:
    """The golden checkpoint with its trainer_state.pt changed by `change(state)`."""
    shutil.copytree(src, dst)
    state = torch.load(dst / "trainer_state.pt", weights_only=True)
    change(state)
    torch.save(state, dst / "trainer_state.pt")
    return dst


def golden_index(state: dict, name: str) -> int:
    for group in state["optimizer"]["param_groups"]:
        if name in group["param_names"]:
            return group["params"][group["param_names"].index(name)]
    raise KeyError(name)


@pytest.mark.slow
def test_golden_against_migrate_train_passes(paired_runs, tmp_path, capsys):
    golden, ms = paired_runs
    report = verdict(tmp_path, capsys, golden, ms)
    assert report["summary"]["passed"], report["summary"]
    names = [e["name"] for e in report["entries"]]
    assert names[:4] == ["step", "optimizer step", "scheduler position", "learning rate"]
    # two frameworks after 4 steps are not bit-equal, and within the fixed bound
    diffs = [e["metrics"]["max_abs"] for e in report["entries"] if e["kind"] == "state"]
    assert max(diffs) > 0
    assert report["run"]["reference"]["source"] == "fixed"
    # a torch before 2.6 saves no param_names: the golden's groups are rebuilt as Trainer's, same figures
    unnamed = golden_copy(golden, tmp_path / "unnamed",
                          lambda s: [g.pop("param_names") for g in s["optimizer"]["param_groups"]])
    again = verdict(tmp_path, capsys, unnamed, ms)
    assert [(e["name"], e["metrics"].get("max_abs")) for e in again["entries"]] == \
        [(e["name"], e["metrics"].get("max_abs")) for e in report["entries"]]


@pytest.mark.slow
def test_an_optimizer_sharded_checkpoint_reads_as_the_whole_one(paired_runs, tmp_path, capsys):
    """migrate train's checkpoint with its moments split over 2 data-parallel ranks (optimizer sharding's
    files, as the trainer writes them on Ascend/GPU) gives the very figures of the whole one."""
    from migrate.checkpoints.manifest import write_manifest
    from migrate.train.checkpoint.shards import LAYOUT_FORMAT, slice_table, write_optimizer_shard

    golden, ms = paired_runs
    sharded = shutil.copytree(ms, tmp_path / "sharded")
    moments = dict(open_ms_checkpoint(sharded / "optimizer.ckpt").tensors())
    shapes = {name: a.shape for name, a in moments.items()}
    for rank in range(2):
        write_optimizer_shard(sharded, rank, 2, moments, shapes)
    (sharded / "optimizer.ckpt").unlink()
    (sharded / "parallel_layout.json").write_text(json.dumps(
        {"format": LAYOUT_FORMAT, "version": 1, "dp": 2, "mp": 1, "pp": 1, "optimizer_shard": True,
         "world_size": 2, "optimizer_slices": slice_table(shapes, 2)}))
    write_manifest(sharded)
    whole, split = verdict(tmp_path, capsys, golden, ms), verdict(tmp_path, capsys, golden, sharded)
    assert split["summary"]["passed"]
    assert [(e["name"], e["metrics"].get("max_abs")) for e in split["entries"]] == \
        [(e["name"], e["metrics"].get("max_abs")) for e in whole["entries"]]


@pytest.mark.slow
def test_a_noise_run_sets_the_bounds(paired_runs, tmp_path, capsys):
    """A correct run of the other framework as the noise run: every bound is K x the golden-MindSpore
    difference; the same pair passes at x noise 1, and a moment x 1.01 is far outside it."""
    golden, ms = paired_runs
    report = verdict(tmp_path, capsys, golden, ms, "--noise", ms)
    assert report["summary"]["passed"]
    assert report["run"]["reference"]["source"] == "noise run"
    assert report["summary"]["headline"]["noise_ratio_max"] == pytest.approx(1.0)
    name = "model.layers.1.mlp.up_proj.weight"
    bad = golden_copy(golden, tmp_path / "bad", lambda s: s["optimizer"]["state"][golden_index(s, name)]
                      ["exp_avg"].mul_(1.01))
    report = verdict(tmp_path, capsys, ms, bad, "--noise", golden)   # MindSpore first: the noise is golden's
    assert first_state_divergence(report) == f"exp_avg {name}"
    entry = next(e for e in report["entries"] if e["name"] == f"exp_avg {name}")
    assert "32 × the reference's own error vs the noise run" in entry["reason"], entry["reason"]


@pytest.fixture(scope="module")
def fp16_runs(paired_root, one_torch_thread):
    """The same run in fp16: autocast with a dynamic loss scale on both sides."""
    from migrate.train.config import RunConfig

    (paired_root / "fp16.yaml").write_text((paired_root / "run.yaml").read_text() + "dtype: fp16\n")
    return train_both(paired_root, RunConfig.load(paired_root / "fp16.yaml"), "fp16")


@pytest.mark.slow
def test_fp16_states_pass_and_their_loss_scales_are_compared(fp16_runs, tmp_path, capsys):
    golden, ms = fp16_runs
    report = verdict(tmp_path, capsys, golden, ms)
    assert report["summary"]["passed"], report["summary"]
    assert report["run"]["dtype"] == "fp16"
    scale = next(e for e in report["entries"] if e["name"] == "loss scale")
    assert scale["kind"] == "counter" and scale["metrics"]["ref_text"] == "65536"
    bad = golden_copy(golden, tmp_path / "bad", lambda s: s["scaler"].update(scale=s["scaler"]["scale"] / 2))
    report = verdict(tmp_path, capsys, bad, ms)
    assert first_state_divergence(report) == "loss scale"


@pytest.mark.slow
def test_lora_runs_compare_their_adapters(lora_runs, tmp_path, capsys):
    golden, ms = lora_runs
    report = verdict(tmp_path, capsys, golden, ms)
    assert report["summary"]["passed"], report["summary"]
    params = [e["name"] for e in report["entries"] if e["name"].startswith("param ")]
    assert params[:2] == ["param model.layers.1.self_attn.v_proj.lora_B.weight",   # backward meets v's B first
                          "param model.layers.1.self_attn.v_proj.lora_A.weight"]
    assert len(params) == 2 * 2 * 2   # 2 layers x q, v x A, B
    name = "model.layers.0.self_attn.q_proj.lora_B.weight"
    bad = golden_copy(golden, tmp_path / "bad", lambda s: s["optimizer"]["state"][
        golden_index(s, f"base_model.model.{name.replace('lora_B.', 'lora_B.default.')}")]["exp_avg_sq"].mul_(1.01))
    report = verdict(tmp_path, capsys, bad, ms)
    assert first_state_divergence(report) == f"exp_avg_sq {name}"


@pytest.mark.slow
def test_golden_with_a_perturbed_second_moment_fails_naming_it(paired_runs, tmp_path, capsys):
    golden, ms = paired_runs
    name = "model.layers.0.self_attn.v_proj.weight"
    bad = golden_copy(golden, tmp_path / "bad", lambda s: s["optimizer"]["state"][golden_index(s, name)]
                      ["exp_avg_sq"].mul_(1.01))
    code, out, _ = run_cli(capsys, "diff", bad, ms)
    assert code == 1
    line = next(li for li in out.splitlines() if li.endswith("— first state divergence"))
    assert line.startswith(f"exp_avg_sq {name} · "), line


@pytest.mark.slow
def test_mismatched_step_counters_fail(paired_runs, tmp_path, capsys):
    golden, ms = paired_runs
    bad = golden_copy(golden, tmp_path / "bad", lambda s: s.update(step=STEPS + 1))
    report = verdict(tmp_path, capsys, bad, ms)
    assert first_state_divergence(report) == "step"
    assert report["summary"]["first_grad_divergence"]["reason"] == f"{STEPS + 1} vs {STEPS}"
    earlier = ms.parent / "checkpoint-2"   # the MindSpore state two steps before: every counter differs
    report = verdict(tmp_path, capsys, golden, earlier)
    failed = {e["name"] for e in report["entries"] if not e["passed"]}
    assert {"step", "optimizer step", "scheduler position"} <= failed


# --------------------------------------------------------------------------- bad input

def save_rng(path: Path, seed: int) -> None:
    """rng_state.pth as HF Trainer writes it (Python's, numpy's and torch's generators)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.save({"python": random.getstate(), "numpy": np.random.get_state(), "cpu": torch.random.get_rng_state()},
               path)

@pytest.fixture(scope="module")
def tiny_trainer_ckpt(tmp_path_factory):
    """An HF Trainer-shaped checkpoint without running Trainer: the model, Trainer's two AdamW groups
    after one step, trainer_state.json; and the MindFormers file of the same state."""
    root = tmp_path_factory.mktemp("tiny_ckpt")
    ckpt = root / "checkpoint-1"
    model = build_hf_model("gqa")
    decay = hf_decay_names(model)
    groups = [{"params": [p for n, p in model.named_parameters() if n in decay], "weight_decay": 0.1},
              {"params": [p for n, p in model.named_parameters() if n not in decay], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=1e-3)
    ids = torch.randint(0, model.config.vocab_size, (2, 8), generator=torch.Generator().manual_seed(0))
    model(ids, labels=ids).loss.backward()
    optimizer.step()
    save_hf_model(model, ckpt)
    torch.save(optimizer.state_dict(), ckpt / "optimizer.pt")
    (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": 1}))
    save_rng(ckpt / "rng_state.pth", seed=0)
    moments = live_moments(model, optimizer)
    mf = mindformers_file(ckpt, moments, root / "mf.safetensors", root, scalars={"global_step": 1})
    mindformers_file(ckpt, moments, root / "mf.ckpt", root, scalars={"global_step": 1})
    return ckpt, mf


@pytest.mark.parametrize("suffix", [".safetensors", ".ckpt"])
def test_tiny_trainer_checkpoint_against_its_mindformers_file(tiny_trainer_ckpt, suffix, tmp_path, capsys):
    ckpt, mf = tiny_trainer_ckpt
    code, out, err = run_cli(capsys, "diff", ckpt, mf.with_suffix(suffix))
    assert code == 0, err + out[-1500:]
    assert "PASS · training state" in out


def test_two_mindformers_files_take_their_config_from_the_converted_folder(tiny_trainer_ckpt, capsys):
    ckpt, mf = tiny_trainer_ckpt
    refused(capsys, mf, mf.with_suffix(".ckpt"), pattern="neither side records a model config: give --model DIR")
    code, out, err = run_cli(capsys, "diff", mf, mf.with_suffix(".ckpt"), "--model", mf.parent / "converted_None")
    assert code == 0, err + out[-1500:]
    assert "PASS · training state" in out


def test_the_reader_rule(tiny_trainer_ckpt, tmp_path, capsys):
    """A member linked out of the checkpoint, JSON nested past the bound: one line each."""
    ckpt, mf = tiny_trainer_ckpt
    linked = shutil.copytree(ckpt, tmp_path / "linked")
    shutil.move(linked / "optimizer.pt", tmp_path / "optimizer.pt")
    (linked / "optimizer.pt").symlink_to(tmp_path / "optimizer.pt")
    refused(capsys, linked, mf, pattern="optimizer.pt is a link to a file outside the checkpoint")
    deep = shutil.copytree(ckpt, tmp_path / "deep")
    (deep / "trainer_state.json").write_text("[" * 100_000 + "]" * 100_000)
    refused(capsys, deep, mf, pattern="trainer_state.json")


def test_generator_positions_are_compared_where_both_record_them(tiny_trainer_ckpt, tmp_path, capsys):
    ckpt, _ = tiny_trainer_ckpt
    same = shutil.copytree(ckpt, tmp_path / "same")
    report = verdict(tmp_path, capsys, ckpt, same)
    assert report["summary"]["passed"]
    assert {"python generator", "numpy generator"} <= {e["name"] for e in report["entries"]}
    moved = shutil.copytree(ckpt, tmp_path / "moved")
    random.seed(0)
    np.random.seed(0)
    np.random.random(3)   # numpy's generator three draws further
    torch.save({"python": random.getstate(), "numpy": np.random.get_state(), "cpu": torch.random.get_rng_state()},
               moved / "rng_state.pth")
    report = verdict(tmp_path, capsys, ckpt, moved)
    assert [e["name"] for e in report["entries"] if not e["passed"]] == ["numpy generator"]
    assert report["summary"]["first_grad_divergence"]["reason"] == \
        "numpy generator at position 624 vs numpy generator at position 6"


def test_a_folder_that_is_no_checkpoint(tiny_trainer_ckpt, tmp_path, capsys):
    ckpt, _ = tiny_trainer_ckpt
    (tmp_path / "empty").mkdir()
    refused(capsys, tmp_path / "empty", ckpt, "--report", tmp_path / "out", pattern="is no training checkpoint")
    assert not (tmp_path / "out").exists()


def test_a_truncated_optimizer_file(tiny_trainer_ckpt, tmp_path, capsys):
    ckpt, mf = tiny_trainer_ckpt
    bad = shutil.copytree(ckpt, tmp_path / "checkpoint-1")
    data = (bad / "optimizer.pt").read_bytes()
    (bad / "optimizer.pt").write_bytes(data[: len(data) // 2])
    refused(capsys, bad, mf, "--report", tmp_path / "out", pattern="optimizer.pt (torch.load, weights only)")
    assert not (tmp_path / "out").exists()


class Evil:
    pass


def test_an_optimizer_file_naming_a_class_is_not_unpickled(tiny_trainer_ckpt, tmp_path, capsys):
    ckpt, mf = tiny_trainer_ckpt
    bad = shutil.copytree(ckpt, tmp_path / "checkpoint-1")
    state = torch.load(bad / "optimizer.pt", weights_only=True)
    state["param_groups"][0]["evil"] = Evil()
    torch.save(state, bad / "optimizer.pt")
    refused(capsys, bad, mf, pattern="cannot read HF Trainer's optimizer state")


def test_missing_moments(tiny_trainer_ckpt, tmp_path, capsys):
    ckpt, mf = tiny_trainer_ckpt
    tensors = load_numpy(str(mf))
    del tensors["adam_v.model.layers.1.attention.wk.weight"]
    bad = tmp_path / "mf.safetensors"
    save_numpy(tensors, str(bad))
    refused(capsys, ckpt, bad, pattern="no exp_avg_sq for 1 parameters, first model.layers.1.self_attn.k_proj.weight")
    no_optimizer = shutil.copytree(ckpt, tmp_path / "checkpoint-1")
    (no_optimizer / "optimizer.pt").unlink()   # then it is an HF model folder: a model, not a training state
    refused(capsys, no_optimizer, mf, pattern="is no training checkpoint")


def test_options_of_a_model_diff_are_refused(tiny_trainer_ckpt, capsys):
    ckpt, mf = tiny_trainer_ckpt
    refused(capsys, ckpt, mf, "--grads", pattern="--grads: not for two training checkpoints")
