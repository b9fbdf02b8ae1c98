"""Check `migrate mindformers-config`'s output against the real MindSpore Transformers 2.0.0.

Two halves, two interpreters (MindFormers is never a dependency of migrate):

    .venv/bin/python tests/mf_live_check.py prepare OUT     # HF models, migrate convert --mindformers-yaml,
                                                            # HF logits, golden lrs and decay sets
    $MF_PYTHON tests/mf_live_check.py check OUT             # in a MindFormers 2.0.0 env (../shared/mindformers)

`check` builds MindFormers' LlamaConfig from each YAML's model_config as written, loads the
converted checkpoint strictly (nothing missing, nothing unused), compares logits with HF's,
builds each emitted lr_schedule and compares every step with transformers' scheduler, runs
MindFormers' AdamW and ClipGradNorm against torch's, reads the decay groups MindFormers
forms on the real network, and re-reads the pinned field table from the package
signatures. It prints one JSON report and exits 1 when any check fails.
tests/test_mindformers_live.py runs both halves when MIGRATE_MF_PYTHON names that interpreter.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SEQ = 32
LOGITS_TOL = 1e-5


# ---------------------------------------------------------------- prepare (.venv)
def _cases():
    import transformers as t

    demo = dict(vocab_size=1024, hidden_size=128, intermediate_size=344, num_hidden_layers=4, num_attention_heads=8,
                num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5, tie_word_embeddings=True)
    small = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-6)
    llama3 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
              "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
    return {  # name: (config class, model class, fields, --src, convert flags)
        "demo-llama-gqa-tied": (t.LlamaConfig, t.LlamaForCausalLM, demo, "hf_llama", []),
        "demo-llama-gqa-tied-fused": (t.LlamaConfig, t.LlamaForCausalLM, demo, "hf_llama", ["--qkv-concat"]),
        "llama3-rope-bias": (t.LlamaConfig, t.LlamaForCausalLM,
                             {**small, "attention_bias": True, "rope_parameters": llama3}, "hf_llama", []),
        "llama-linear-rope": (t.LlamaConfig, t.LlamaForCausalLM,
                              {**small, "rope_parameters": {"rope_type": "linear", "rope_theta": 10000.0,
                                                            "factor": 2.0}}, "hf_llama", []),
        "qwen2": (t.Qwen2Config, t.Qwen2ForCausalLM, small, "hf_qwen2", []),
        "qwen2-fused": (t.Qwen2Config, t.Qwen2ForCausalLM, small, "hf_qwen2", ["--qkv-concat"]),
        "mistral": (t.MistralConfig, t.MistralForCausalLM, {**small, "sliding_window": 4096}, "hf_mistral", []),
    }


def _schedules():
    """run.yaml schedule sections -> the transformers lrs of every step."""
    return {
        "cosine-warmup-minlr-rate": ({"name": "cosine", "warmup_steps": 5, "min_lr_rate": 0.1}, 50),
        "cosine-warmup-minlr": ({"name": "cosine", "warmup_steps": 7, "min_lr": 3e-5}, 40),
        "cosine-plain": ({"name": "cosine", "warmup_steps": 0}, 30),
        "linear-warmup": ({"name": "linear", "warmup_steps": 3}, 20),
        "linear-minlr": ({"name": "linear", "warmup_steps": 4, "min_lr": 1e-5}, 25),
        "constant-warmup": ({"name": "constant", "warmup_steps": 6}, 15),
        "warmup-ratio": ({"name": "cosine", "warmup_ratio": 0.07}, 45),
    }


def prepare(out: Path) -> None:
    import numpy as np
    import torch
    from transformers import get_scheduler

    from migrate.keymap import resolve
    from migrate.mindformers.training import lr_section
    from migrate.models.config import LlamaConfig
    from migrate.models.conversion_plan import ConversionPlan
    from migrate.train.config import RunConfig
    from migrate.train.decay import ms_decay_names

    out.mkdir(parents=True, exist_ok=True)
    migrate = str(Path(sys.executable).with_name("migrate"))
    meta = {"cases": {}, "schedules": {}}
    for i, (name, (cfg_cls, model_cls, fields, src, flags)) in enumerate(_cases().items()):
        root = out / name
        torch.manual_seed(i)
        model = model_cls(cfg_cls(**fields)).eval()
        with torch.no_grad():  # non-trivial norms and biases, so a dropped or swapped one shows
            for pname, p in model.named_parameters():
                if pname.endswith("norm.weight"):
                    p.add_(0.1 * torch.randn_like(p))
                elif pname.endswith("bias"):
                    p.copy_(0.05 * torch.randn_like(p))
        model.save_pretrained(root / "hf")
        subprocess.run([migrate, "convert", "--src", src, str(root / "hf"), str(root / "ms"), "--overwrite",
                        *flags, "--mindformers-yaml", str(root / "mf.yaml"), "--yaml-overwrite", "--device", "cpu",
                        "--seq-length", str(SEQ)], check=True)
        ids = np.random.default_rng(i).integers(0, fields["vocab_size"], size=(2, SEQ))
        ids[:, 3::7] = 0  # token 0 is MindFormers' default pad_token_id, which it masks: a YAML leaving it shows
        with torch.no_grad():
            logits = model(input_ids=torch.from_numpy(ids)).logits.numpy()
        np.save(root / "ids.npy", ids.astype(np.int32))
        np.save(root / "hf_logits.npy", logits)
        config = LlamaConfig.load(root / "ms")
        km = resolve(src).with_target("qkv_concat" if flags else None)
        names = sorted(ConversionPlan(km, config).expected)
        decayed = ms_decay_names(names, km, config)
        meta["cases"][name] = {"yaml": str(root / "mf.yaml"), "no_decay": sorted(set(names) - decayed)}
    for name, (schedule, total) in _schedules().items():
        cfg = RunConfig.from_dict({"data": "data", "seq_length": SEQ, "total_steps": total,
                                   "optimizer": {"lr": 3e-4}, "schedule": schedule})
        hf = cfg.hf_schedule()
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=cfg.optimizer.lr)
        sched = get_scheduler(hf.name, opt, num_warmup_steps=hf.num_warmup_steps,
                              num_training_steps=hf.num_training_steps, scheduler_specific_kwargs=hf.kwargs)
        lrs = []
        for _ in range(total):
            lrs.append(opt.param_groups[0]["lr"])
            opt.step()
            sched.step()
        meta["schedules"][name] = {"section": lr_section(cfg), "golden": lrs}
    meta["training"] = _prepare_training(out, migrate)
    (out / "prepared.json").write_text(json.dumps(meta, indent=1))


TRAIN_STEPS = 20  # 96 rows / global batch 8 = 12 steps per epoch: the CPU YAML plans 2 epochs and stops at 20


def _prepare_training(out: Path, migrate: str) -> dict:
    """A run.yaml on the biased Llama (micro 4 × accum 2, warmup + cosine to a floor, decay 0.1,
    clipping at 1.0, no shuffle), the golden's run of it, and the CPU training YAML."""
    import numpy as np

    from migrate.data.samples import META_FILE, MINDRECORD_FILE, SAMPLES_FILE
    from migrate.data.tokenize import write_mindrecord

    data = out / "train" / "data"
    data.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    step = rng.integers(1, 5, size=(96, SEQ + 1)).cumsum(axis=1)  # learnable: small strides mod the vocabulary
    rows = ((step + rng.integers(0, 128, size=(96, 1))) % 128).astype(np.int32)
    np.save(data / SAMPLES_FILE, rows)
    write_mindrecord(data / MINDRECORD_FILE, rows)
    (data / META_FILE).write_text(json.dumps({"format": "migrate-tokens", "version": 1, "seq_length": SEQ,
                                              "samples": len(rows), "dtype": "int32",
                                              "tokenizer": {"vocab_size": 128}}))
    case = out / "llama3-rope-bias"
    run = out / "train" / "run.yaml"
    run.write_text(f"""hf_model: {case / 'hf'}
ms_model: {case / 'ms'}
data: {data}
seq_length: {SEQ}
micro_batch_size: 4
grad_accum_steps: 2
total_steps: {TRAIN_STEPS}
max_grad_norm: 1.0
seed: 0
shuffle: false
optimizer: {{lr: 2.0e-3, betas: [0.9, 0.95], weight_decay: 0.1}}
schedule: {{name: cosine, warmup_steps: 3, min_lr_rate: 0.1}}
out_dir: {{golden: {out / 'train' / 'golden'}, ms: {out / 'train' / 'ms'}}}
""")
    golden = Path(__file__).resolve().parent.parent / "golden" / "train_torch.py"
    subprocess.run([sys.executable, str(golden), "--config", str(run)], check=True, stdout=subprocess.DEVNULL)
    subprocess.run([migrate, "mindformers-config", "--config", str(run), "--device", "cpu", "--out",
                    str(out / "train" / "mf_train.yaml"), "--overwrite", "--output-dir",
                    str(out / "train" / "mf_output")], check=True, stdout=subprocess.DEVNULL)
    hparams = subprocess.run([migrate, "hparams", str(run), "--mindformers", str(out / "train" / "mf_train.yaml")],
                             capture_output=True, text=True, env={**os.environ, "COLUMNS": "240"})
    return {"yaml": str(out / "train" / "mf_train.yaml"), "golden": str(out / "train" / "golden" / "metrics.jsonl"),
            "output_dir": str(out / "train" / "mf_output"),
            "hparams": {"exit": hparams.returncode, "all_agree": "all knobs agree" in hparams.stdout,
                        "steps_trained": [ln.strip() for ln in hparams.stdout.splitlines() if "steps_trained" in ln],
                        "tail": (hparams.stdout + hparams.stderr)[-1500:]}}


# ---------------------------------------------------------------- check (MindFormers env)
def _import_mindformers():
    # ../shared/mindformers/setup.sh puts the stub beside the venv: PROBE/stubs, PROBE/venv/bin/python
    stubs = os.environ.get("MF_STUBS", str(Path(sys.executable).parents[2] / "stubs"))
    sys.path.insert(0, stubs)
    import hp_stub  # noqa: F401  -- registers the unpublished `hyper_parallel` as an empty package
    import mindformers
    return mindformers


def _check_case(name: str, case: dict, report: dict) -> bool:
    import mindspore as ms
    import numpy as np
    import yaml
    from mindformers.models.llama import LlamaConfig, LlamaForCausalLM
    from mindformers.trainer.optimizer_grouped_parameters import get_optimizer_grouped_parameters

    doc = yaml.safe_load(Path(case["yaml"]).read_text())
    fields = {k: v for k, v in doc["model"]["model_config"].items() if k != "type"}
    net = LlamaForCausalLM(LlamaConfig(**fields))
    net.set_train(False)
    params = ms.load_checkpoint(doc["load_checkpoint"])
    not_loaded, unused = ms.load_param_into_net(net, params)
    root = Path(case["yaml"]).parent
    ids = np.load(root / "ids.npy")
    out = net(ms.Tensor(ids, ms.int32))
    logits = (out[0] if isinstance(out, tuple) else out).asnumpy().reshape(ids.shape[0], ids.shape[1], -1)
    max_abs = float(np.abs(logits - np.load(root / "hf_logits.npy")).max())
    groups = get_optimizer_grouped_parameters(net, weight_decay=0.1)
    no_decay = sorted(p.name for g in groups if g["weight_decay"] == 0 for p in g["params"])
    ok = not not_loaded and not unused and max_abs <= LOGITS_TOL and no_decay == case["no_decay"]
    report[name] = {"not_loaded": list(not_loaded), "unused": list(unused), "logits_max_abs": max_abs,
                    "no_decay_same": no_decay == case["no_decay"], "no_decay": len(no_decay), "ok": ok}
    return ok


def _check_schedules(schedules: dict, report: dict) -> bool:
    import mindspore as ms
    from mindformers.core.lr import build_lr

    ok = True
    for name, entry in schedules.items():
        cell = build_lr(dict(entry["section"]))
        peak = entry["section"]["learning_rate"]
        # MindFormers evaluates the formula in float32: judged against the peak lr, since near a
        # cosine's end 1 + cos(pi x) cancels and the relative error of a tiny lr grows.
        worst = max(abs(float(cell(ms.Tensor(step, ms.int32)).asnumpy()) - want) / peak
                    for step, want in enumerate(entry["golden"]))
        report[name] = {"type": entry["section"]["type"], "steps": len(entry["golden"]),
                        "lr_max_abs_over_peak": worst, "ok": worst <= 1e-6}
        ok &= worst <= 1e-6
    return ok


def _check_adamw_and_clip(report: dict) -> bool:
    import mindspore as ms
    import numpy as np
    import torch
    from mindformers.core.clip_grad import ClipGradNorm
    from mindformers.core.optim import AdamW

    rng = np.random.default_rng(0)
    w0 = rng.standard_normal((6, 5)).astype(np.float32)
    grads = [rng.standard_normal((6, 5)).astype(np.float32) for _ in range(6)]
    kw = dict(betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    p = ms.Parameter(ms.Tensor(w0.copy()), name="w")
    opt = AdamW([p], learning_rate=1e-2, **kw)
    tp = torch.nn.Parameter(torch.from_numpy(w0.copy()))
    topt = torch.optim.AdamW([tp], lr=1e-2, **kw)
    for g in grads:
        opt((ms.Tensor(g),))
        tp.grad = torch.from_numpy(g)
        topt.step()
    adam = float(np.abs(p.asnumpy() - tp.detach().numpy()).max())
    clip = ClipGradNorm(max_norm=1.0)
    rows = {}
    for scale in (10.0, 0.1):  # above and below max_norm
        g = [x * scale / 6 for x in grads[:2]]
        clipped, _ = clip(tuple(ms.Tensor(x) for x in g))
        tg = [torch.from_numpy(x.copy()) for x in g]
        ps = [torch.nn.Parameter(torch.zeros_like(x)) for x in tg]
        for q, x in zip(ps, tg, strict=True):
            q.grad = x
        torch.nn.utils.clip_grad_norm_(ps, 1.0)
        rows[f"x{scale:g}"] = max(float(np.abs(c.asnumpy() / q.grad.numpy() - 1).max())
                                  for c, q in zip(clipped, ps, strict=True))
    report["adamw_vs_torch_max_abs_after_6_steps"] = adam
    report["clip_rel_diff_vs_torch"] = rows  # below max: the documented 1e-6 / max_norm factor
    return adam < 1e-6 and rows["x10"] < 1e-6 and abs(rows["x0.1"] - 1e-6) < 1e-7


def _check_pinned_fields(report: dict) -> bool:
    import inspect

    from mindformers.core.lr import lr_schedule as lrs
    from mindformers.models.llama import LlamaConfig
    from mindformers.modules.transformer.transformer import TransformerOpParallelConfig
    from mindformers.wrapper.wrapper import MFPipelineWithLossScaleCell, MFTrainOneStepCell

    from migrate.mindformers import fields as pinned

    def names(fn, skip=("self", "kwargs", "params", "network", "optimizer")):
        return {n for n in inspect.signature(fn).parameters if n not in skip}

    wanted = {
        "LLAMA_CONFIG": (names(LlamaConfig.__init__) - {"parallel_config", "moe_config"},
                         set(pinned.LLAMA_CONFIG) - {"type"}),
        "PARALLEL_CONFIG": (names(TransformerOpParallelConfig.__init__) - {"recompute", "swap"},
                            set(pinned.PARALLEL_CONFIG)),
        "MFTrainOneStepCell": (names(MFTrainOneStepCell.__init__),
                               set(pinned.WRAPPERS["MFTrainOneStepCell"]) - {"type"}),
        "MFPipelineWithLossScaleCell": (names(MFPipelineWithLossScaleCell.__init__),
                                        set(pinned.WRAPPERS["MFPipelineWithLossScaleCell"]) - {"type"}),
    }
    for kind, table in pinned.LR_SCHEDULES.items():
        wanted[kind] = (names(getattr(lrs, kind).__init__), set(table))
    diffs = {k: {"package_only": sorted(a - b), "pinned_only": sorted(b - a)} for k, (a, b) in wanted.items() if a != b}
    from mindformers.core.callback import callback as callbacks  # TrainCallBack is registered, not exported

    for kind, table in pinned.CALLBACKS.items():  # the arguments written: a subset of each __init__'s
        missing = set(table) - names(getattr(callbacks, kind).__init__)
        if missing:
            diffs[kind] = {"package_only": [], "pinned_only": sorted(missing)}
    report["pinned_field_table_differences"] = diffs
    return not diffs


def train(yaml_path: str, log: str) -> None:
    """MindFormers' own Trainer on the YAML, for as many steps as MindFormers runs it (nothing here stops
    it); per-step loss, lr, global norm to `log`."""
    import mindspore as ms
    from mindspore import ops
    from mindspore.nn.wrap.loss_scale import TrainOneStepWithLossScaleCell
    from mindspore.train import Callback

    _import_mindformers()
    from mindformers import MindFormerConfig, build_context
    from mindformers.trainer import Trainer

    def cpu_overflow(self, status, compute_output):  # MindSpore asks Ascend's NPUGetFloatStatusV2 on CPU
        flag = ops.zeros((), ms.float32)
        for g in compute_output:
            flag = flag + ops.cast(ops.logical_not(ops.isfinite(g).all()), ms.float32)
        return flag > 0

    TrainOneStepWithLossScaleCell.get_overflow_status = cpu_overflow

    class Record(Callback):
        rows: list = []

        def on_train_step_end(self, run_context):
            cb = run_context.original_args()
            loss, _, _, lr, norm = cb.net_outputs[:5]
            self.rows.append({"step": cb.cur_step_num, "loss": float(loss.asnumpy()), "lr": float(lr.asnumpy()),
                              "grad_norm": float(norm.asnumpy())})
            Path(log).write_text(json.dumps(self.rows))

    config = MindFormerConfig(yaml_path)
    build_context(config)
    Trainer(args=config, callbacks=[Record()]).train()


def _last_checkpoint(output_dir: str) -> dict:
    """The training state of the last checkpoint MindFormers wrote (CheckpointMonitor's append_info)."""
    import mindspore as ms

    files = sorted(Path(output_dir).glob("checkpoint/rank_0/*.ckpt"), key=lambda f: f.stat().st_mtime)
    if not files:
        return {"files": []}
    state = ms.load_checkpoint(str(files[-1]), choice_func=lambda n: n in ("global_step", "step_num", "epoch_num"))
    return {"files": [f.name for f in files],
            **{k: int(v.asnumpy().reshape(-1)[0]) for k, v in state.items()}}


def _check_training(entry: dict, out: Path, report: dict) -> bool:
    log = out / "train" / "mf_metrics.json"
    subprocess.run([sys.executable, __file__, "train", entry["yaml"], str(log)], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    mf = json.loads(log.read_text())
    ckpt = _last_checkpoint(entry["output_dir"])
    golden = [json.loads(line) for line in Path(entry["golden"]).read_text().splitlines()]
    # strict=False: `ok` checks both lengths against TRAIN_STEPS, so a short run is reported, not raised
    rel = [abs(m["loss"] - g["loss"]) / g["loss"] for g, m in zip(golden, mf, strict=False)]
    lr = [abs(m["lr"] - g["lr"]) / max(g["lr"], 1e-30) if g["lr"] else abs(m["lr"])
          for g, m in zip(golden, mf, strict=False)]
    norm = [abs(m["grad_norm"] - g["grad_norm"]) / g["grad_norm"] for g, m in zip(golden, mf, strict=False)]
    # MindFormers itself stops at total_steps: its step log, its optimizer's global_step in the last checkpoint
    exact = (len(mf) == len(golden) == TRAIN_STEPS and mf[-1]["step"] == TRAIN_STEPS
             and ckpt.get("global_step") == TRAIN_STEPS)
    ok = (exact and rel[0] <= 1e-6 and max(rel) <= 1e-5 and max(lr) <= 1e-6
          and entry["hparams"]["exit"] == 0 and entry["hparams"]["all_agree"])
    report.update(steps=len(mf), last_step=mf[-1]["step"] if mf else None, checkpoint=ckpt,
                  hparams=entry["hparams"], first_loss_rel=rel[0], max_loss_rel=max(rel), max_lr_rel=max(lr),
                  max_grad_norm_rel=max(norm), ok=ok)
    return ok


def check(out: Path) -> int:
    import mindspore as ms

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # migrate's pinned table, nothing heavy
    _import_mindformers()
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    meta = json.loads((out / "prepared.json").read_text())
    report: dict = {"models": {}, "schedules": {}}
    ok = all([_check_case(n, c, report["models"]) for n, c in meta["cases"].items()])
    ok &= _check_schedules(meta["schedules"], report["schedules"])
    ok &= _check_adamw_and_clip(report)
    ok &= _check_pinned_fields(report)
    report["training"] = {}
    ok &= _check_training(meta["training"], out, report["training"])
    report["ok"] = bool(ok)
    (out / "report.json").write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    command = sys.argv[1]
    if command == "prepare":
        prepare(Path(sys.argv[2]))
    elif command == "train":
        train(sys.argv[2], sys.argv[3])
    else:
        sys.exit(check(Path(sys.argv[2])))
