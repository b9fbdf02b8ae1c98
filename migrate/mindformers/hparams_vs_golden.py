"""`migrate hparams run.yaml --mindformers mf.yaml`: where a MindFormers 2.0.0 run would
differ from the golden, knob by knob, naming the first difference.

The golden side is `migrate.train.hparams.golden_knobs` (torch's live objects). The
MindFormers side is what MindFormers 2.0.0 does with the YAML, restated from its source:

- optimizer: AdamW (mindformers.core.optim: bias correction, decoupled decay; eps 1e-8
  when omitted) or AdamWeightDecay (mindspore.nn: no bias correction, eps 1e-6);
- decay groups (trainer/optimizer_grouped_parameters.py): every parameter decays but the
  1-D ones and names ending in .bias, paired with the golden's HF names through the keymap;
- clipping (core/clip_grad.py): the effective wrapper's use_clip_grad / max_grad_norm, eps 1e-6;
- accumulation (trainer/base_trainer.py): gradient_accumulation_steps only under
  semi_auto/auto parallel (reset to 1 otherwise), micro_batch_num instead with pp > 1;
  MFPipelineWithLossScaleCell divides by micro_batch_num, while micro_batch_interleave_num
  sums its pieces undivided (mindspore.nn.MicroBatchInterleaved);
- the lr of every step from the schedule's formula (`schedule`), total_steps -1 meaning
  the steps planned (epochs × dataset size, with the sink arithmetic of trainer/utils.py);
- the steps trained: the steps planned, run as MindSpore runs them (no dataset sink on a CPU
  device_target), up to the stop_step of a TrainCallBack listed in `callbacks`;
- the model_config fields that change what the model computes, MindFormers' defaults
  standing in for omitted ones, against what `migrate mindformers-config` writes.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from migrate.data.samples import read_meta
from migrate.errors import MigrateError
from migrate.keymap import recorded_keymap, resolve
from migrate.mindformers import schedule as mf_schedule
from migrate.mindformers.fields import LLAMA_DEFAULTS
from migrate.mindformers.model import model_section
from migrate.models.conversion_plan import ConversionPlan
from migrate.models.registry import load_model_config
from migrate.safeyaml import load_yaml
from migrate.train.config import RunConfig
from migrate.train.hparams import HparamRow, HparamsReport, _set_row, format_report, golden_knobs

SEMI = ("semi_auto_parallel", "auto_parallel")
MODES = {0: "data_parallel", 1: "semi_auto_parallel", 2: "auto_parallel", 3: "hybrid_parallel"}
OPTIMIZERS = {  # type -> (default betas, default eps, bias correction, beta field names)
    "AdamW": ((0.9, 0.999), 1e-8, True, "betas"),
    "AdamWeightDecay": ((0.9, 0.999), 1e-6, False, "beta1/beta2"),
}
MODEL_FIELDS = ("seq_length", "max_position_embedding", "vocab_size", "hidden_size", "num_layers", "num_heads",
                "n_kv_heads", "intermediate_size", "rms_norm_eps", "theta", "extend_method", "scaling_factor",
                "pad_token_id", "tie_word_embeddings", "qkv_has_bias", "attn_proj_has_bias")


def _section(doc: dict, key: str) -> dict:
    value = doc.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise MigrateError(f"MindFormers YAML: {key} must be a mapping")
    return value


def load_mf_yaml(path: str | Path) -> dict:
    doc = load_yaml(path, "MindFormers YAML")
    if not isinstance(doc, dict):
        raise MigrateError(f"{path} is not a MindFormers run YAML (not a mapping)")
    if "base_config" in doc:
        raise MigrateError(f"{path}: base_config inheritance is not followed; pass the merged YAML")
    return doc


def batching(doc: dict) -> dict:
    """MindFormers' effective accumulation and global batch (base_trainer.py's checks, in order)."""
    runner, pc = _section(doc, "runner_config"), _section(doc, "parallel_config")
    mode = _section(doc, "parallel").get("parallel_mode", 1) if doc.get("use_parallel") else "stand_alone"
    mode = MODES.get(mode, mode)
    pp, dp = int(pc.get("pipeline_stage", 1)), int(pc.get("data_parallel", 1))
    asked = int(runner.get("gradient_accumulation_steps") or 1)
    interleave = int(doc.get("micro_batch_interleave_num") or 1)
    reason = ""
    if pp > 1 and mode in SEMI:
        accum, divisor = int(pc.get("micro_batch_num", 1)), int(pc.get("micro_batch_num", 1))
        reason = "pipeline: micro_batch_num replaces gradient_accumulation_steps"
    elif mode in SEMI:
        accum = divisor = asked
    else:
        accum = divisor = 1
        if asked > 1:
            reason = f"MindFormers 2.0.0 resets gradient_accumulation_steps {asked} to 1 in {mode} mode"
    if accum > 1 and doc.get("runner_wrapper") is None:
        raise MigrateError("MindFormers YAML: accumulation needs runner_wrapper (MindFormers 2.0.0 fails without it)")
    devices = dp * int(pc.get("model_parallel", 1)) * pp if mode != "stand_alone" else 1
    data_ranks = dp if mode in SEMI else devices
    batch = int(runner.get("batch_size") or 1)
    return {"mode": mode, "accum": accum, "summed": accum * interleave, "divisor": divisor, "reason": reason,
            "interleave": interleave, "global_batch": batch * data_ranks * accum * interleave,
            "wrapper": "MFPipelineWithLossScaleCell" if accum > 1 else _section(doc, "runner_wrapper").get("type")}


def planned_steps(doc: dict, samples: int | None, global_batch: int) -> int | None:
    """The steps MindFormers plans, which lr_schedule.total_steps -1 becomes (base_trainer.py
    create_lr_scheduler): epochs × sink_size in sink mode, after check_runner_config (trainer/utils.py)
    turned epochs into int(dataset_size / sink_size × epochs) sinks; else epochs × dataset size."""
    if samples is None:
        return None
    runner = _section(doc, "runner_config")
    size = samples // global_batch
    epochs = runner.get("epochs", 1)
    if runner.get("sink_mode", True):
        sink = int(runner.get("sink_size", -1))
        if sink == -1:
            return int(size * epochs)
        return int(size / sink * epochs) * sink
    return int(epochs) * size


def stop_steps(doc: dict) -> list[int]:
    """stop_step of each TrainCallBack listed in `callbacks` (the only ones MindFormers 2.0.0 adds)."""
    found = []
    for cb in doc.get("callbacks") or []:
        if isinstance(cb, dict) and cb.get("type") == "TrainCallBack" and cb.get("stop_step") is not None:
            found.append(int(cb["stop_step"]))
    return found


def steps_trained(doc: dict, samples: int | None, global_batch: int) -> int | None:
    """Optimizer steps MindFormers runs. Model.train gets check_runner_config's epochs (trainer/utils.py)
    and runs sink_size steps each, but on a CPU device_target MindSpore runs the non-sink loop whatever
    sink_mode says: whole datasets per epoch. A TrainCallBack stops it at stop_step."""
    if samples is None:
        return None
    runner = _section(doc, "runner_config")
    size = samples // global_batch
    epochs = runner.get("epochs", 1)
    cpu = str(_section(doc, "context").get("device_target", "Ascend")).upper() == "CPU"
    if runner.get("sink_mode", True):
        sink = int(runner.get("sink_size", -1))
        if sink != -1:
            epochs = int(size / sink * epochs)
        steps = int(epochs) * (size if cpu or sink == -1 else sink)
    else:
        steps = int(epochs) * size
    return min([steps, *stop_steps(doc)])


def _samples(doc: dict, cfg: RunConfig) -> int | None:
    loader = _section(_section(doc, "train_dataset"), "data_loader")
    folder = Path(str(loader.get("dataset_dir", ""))).parent if loader.get("dataset_dir") else Path(cfg.data)
    try:
        return int(read_meta(folder)["samples"])
    except (MigrateError, KeyError, ValueError, OSError):
        return None


def mf_knobs(doc: dict, cfg: RunConfig) -> dict:
    opt = _section(doc, "optimizer")
    kind = opt.get("type")
    if kind not in OPTIMIZERS:
        raise MigrateError(f"MindFormers YAML: optimizer.type {kind!r}; migrate models {', '.join(OPTIMIZERS)}")
    betas, eps, bias_correction, names = OPTIMIZERS[kind]
    if names == "betas":
        betas = tuple(float(b) for b in opt.get("betas", betas))
    else:
        betas = (float(opt.get("beta1", betas[0])), float(opt.get("beta2", betas[1])))
    batch = batching(doc)
    wrapper = _section(doc, "runner_wrapper")
    clip = wrapper.get("use_clip_grad", batch["wrapper"] == "MFPipelineWithLossScaleCell")
    samples = _samples(doc, cfg)
    trained = steps_trained(doc, samples, batch["global_batch"])
    planned = planned_steps(doc, samples, batch["global_batch"])
    section = dict(_section(doc, "lr_schedule"))
    if doc.get("lr_scale") and "learning_rate" in section:
        section["learning_rate"] = section["learning_rate"] * batch["global_batch"] / doc.get("lr_scale_factor", 256)
    sched = mf_schedule.effective(section, planned)
    scale = wrapper.get("scale_sense", 1.0)
    return {
        "optimizer": kind, "betas": betas, "eps": float(opt.get("eps", eps)),
        "weight_decay": float(opt.get("weight_decay") or 0.0), "bias_correction": bias_correction,
        "clip_max_norm": float(wrapper.get("max_grad_norm", 1.0)) if clip else None,
        "batching": batch, "schedule": sched, "steps_trained": trained,
        "lr": mf_schedule.table(section, cfg.total_steps, planned), "stop_steps": stop_steps(doc),
        "loss_scale": (float(scale["loss_scale_value"]), float(scale["scale_factor"]),
                       1.0 / float(scale["scale_factor"]), int(scale["scale_window"]))
        if isinstance(scale, dict) else None,
        "seed": doc.get("seed", 0),
        "model": {**LLAMA_DEFAULTS, **_section(_section(doc, "model"), "model_config")},
    }


# ---------- the comparison ----------
def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return a is not None and b is not None and math.isclose(a, b, rel_tol=1e-12, abs_tol=0.0)
    return a == b


def _golden_floor(cfg: RunConfig) -> float | None:
    hf = cfg.hf_schedule()
    if hf.name.startswith("constant"):
        return None
    if "min_lr" in hf.kwargs:
        return float(hf.kwargs["min_lr"])
    if "min_lr_rate" in hf.kwargs:
        return float(cfg.optimizer.lr * hf.kwargs["min_lr_rate"])
    return float(hf.kwargs.get("lr_end", 0.0))


def _lr_row(golden: list[float], mf: list[float]) -> HparamRow:
    for i, (g, m) in enumerate(zip(golden, mf, strict=True)):
        if abs(g - m) > 1e-9 * max(abs(g), abs(m), 1e-300):
            return HparamRow("lr", g, m, False, f"first differs at optimizer step {i + 1}")
    return HparamRow("lr", f"{len(golden)} steps", f"{len(mf)} steps", True,
                     "MindFormers' formula equals transformers' at every step (it evaluates it in float32)")


def _model_rows(doc_model: dict, cfg: RunConfig, trust: bool = False) -> list[HparamRow]:
    config = load_model_config(cfg.require("ms_model"), trust)
    want = model_section(config, seq_length=cfg.seq_length, precision=cfg.dtype, params_dtype="fp32",
                         cpu=False)["model_config"]
    got = dict(doc_model)
    got["n_kv_heads"] = got.get("n_kv_heads") or got.get("num_heads")
    got["max_position_embedding"] = got.get("max_position_embedding") or got.get("seq_length")
    rows = []
    for name in MODEL_FIELDS:
        rows.append(HparamRow(f"model.{name}", want[name], got.get(name), _same(want[name], got.get(name)),
                              "MindFormers masks every token equal to pad_token_id out of attention and loss"
                              if name == "pad_token_id" else ""))
    precision = ("compute_dtype", "param_init_type", "residual_dtype", "layernorm_compute_type",
                 "softmax_compute_type")
    g = "/".join(str(want[k]) for k in precision)
    m = "/".join(str(got.get(k) or (got.get("compute_dtype") if k == "residual_dtype" else None)) for k in precision)
    rows.append(HparamRow("model.precision", g, m, g == m, "/".join(precision)))
    return rows


def mf_hparams_report(cfg: RunConfig, mf_yaml: str | Path, *, trust: bool = False) -> HparamsReport:
    """Golden (live torch objects) against what MindFormers 2.0.0 does with `mf_yaml`; `trust`: ms_model's
    class may be imported even if migrate does not bundle it (`--trust-model-class`)."""
    doc = load_mf_yaml(mf_yaml)
    g, m = golden_knobs(cfg), mf_knobs(doc, cfg)
    rows = [HparamRow("optimizer", g["optimizer"], m["optimizer"], m["optimizer"] == "AdamW",
                      "mindformers AdamW has torch.optim.AdamW's update" if m["optimizer"] == "AdamW" else
                      "no bias correction")]
    for knob in ("betas", "eps", "weight_decay", "bias_correction"):
        rows.append(HparamRow(knob, g[knob], m[knob], _same(g[knob], m[knob]) if knob != "betas" else
                              len(g[knob]) == len(m[knob])
                              and all(_same(a, b) for a, b in zip(g[knob], m[knob], strict=True))))
    config = load_model_config(cfg.require("ms_model"), trust)
    config.qkv_concat = bool(m["model"].get("qkv_concat"))
    km = resolve(recorded_keymap(cfg.ms_model)).with_target("qkv_concat" if config.qkv_concat else None)
    plan = ConversionPlan(km, config, trust)
    names = {n: shape for n, shape in plan.expected.items()}
    no_decay = {n for n, shape in names.items() if len(shape) == 1 or n.endswith(".bias")}
    decayed = set(names) - no_decay if m["weight_decay"] else set()
    rows.append(_set_row("decayed_parameters", g["decayed"], decayed, plan))
    rows.append(_set_row("not_decayed_parameters", g["not_decayed"], set(names) - decayed, plan))
    rows.append(HparamRow("clip_max_norm", g["clip_max_norm"], m["clip_max_norm"],
                          _same(g["clip_max_norm"], m["clip_max_norm"])))
    if g["clip_max_norm"] and m["clip_max_norm"]:
        rows.append(HparamRow("clip_eps", g["clip_eps"], 1e-6, math.isclose(g["clip_eps"], 1e-6, rel_tol=1e-3),
                              "coefficient max/(norm + eps); below max_norm MindFormers still multiplies by "
                              f"max/(max + 1e-6) (1 - {1e-6 / m['clip_max_norm']:.2g}), torch by 1"))
    b = m["batching"]
    reset = b["reason"].startswith("MindFormers 2.0.0 resets")
    rows.append(HparamRow("grad_accum_steps", g["grad_accum_steps"], b["accum"], not reset,
                          b["reason"] or f"{b['mode']}; micro-batches accumulated per step"))
    rows.append(HparamRow("loss_divisor", f"{g['loss_divisor']} over {g['grad_accum_steps']}",
                          f"{b['divisor']} over {b['summed']}", b["divisor"] == b["summed"],
                          "the summed micro-batch losses are divided by this: a mean iff it equals their number"
                          + (f"; micro_batch_interleave_num {b['interleave']} adds its pieces undivided"
                             if b["interleave"] > 1 else "")))
    golden_batch = cfg.micro_batch_size * cfg.grad_accum_steps
    rows.append(HparamRow("global_batch", golden_batch, b["global_batch"], golden_batch == b["global_batch"],
                          "sequences per optimizer step"))
    if "loss_scale" in g or m["loss_scale"]:
        rows.append(HparamRow("loss_scale", g.get("loss_scale"), m["loss_scale"],
                              g.get("loss_scale") == m["loss_scale"],
                              "(init_scale, growth_factor, backoff_factor, growth_interval)"))
    s = m["schedule"]
    rows.append(HparamRow("schedule", g["schedule"], s["type"], _SCHEDULES.get(g["schedule"]) == s["type"]))
    rows.append(HparamRow("learning_rate", cfg.optimizer.lr, s["learning_rate"],
                          _same(float(cfg.optimizer.lr), s["learning_rate"]), "peak lr"))
    rows.append(HparamRow("num_warmup_steps", g["num_warmup_steps"], s["warmup_steps"],
                          g["num_warmup_steps"] == s["warmup_steps"]))
    rows.append(HparamRow("num_training_steps", g["num_training_steps"], s["total_steps"],
                          g["num_training_steps"] == s["total_steps"], "lr_schedule.total_steps"))
    floor, mf_floor = _golden_floor(cfg), (None if s["type"] == "ConstantWarmUpLR" else s["lr_end"])
    rows.append(HparamRow("min_lr", floor, mf_floor, _same(floor, mf_floor) or floor == mf_floor))
    rows.append(_lr_row(g["lr"], m["lr"]))
    rows.append(HparamRow("steps_trained", cfg.total_steps, m["steps_trained"],
                          m["steps_trained"] is None or m["steps_trained"] == cfg.total_steps,
                          ("epochs × dataset size" + (f", TrainCallBack stop_step {min(m['stop_steps'])}"
                                                      if m["stop_steps"] else ""))
                          if m["steps_trained"] is not None else "dataset size unknown: not compared"))
    rows.append(HparamRow("seed", cfg.seed, m["seed"], cfg.seed == m["seed"]))
    rows += _model_rows(m["model"], cfg, trust)
    return HparamsReport(rows)


_SCHEDULES = {"constant": "ConstantWarmUpLR", "constant_with_warmup": "ConstantWarmUpLR",
              "linear": "LinearWithWarmUpLR", "polynomial": "PolynomialWithWarmUpLR",
              "cosine": "CosineWithWarmUpLR", "cosine_with_min_lr": "CosineWithWarmUpLR"}


def format_mf_report(report: HparamsReport) -> str:
    """format_report's table, its second column headed for MindFormers."""
    head, _, rest = format_report(report).partition("\n")
    return head.replace("mindspore", "mindformers", 1) + "\n" + rest
