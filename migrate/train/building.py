"""Every live object of a MindSpore training run, built from run.yaml: the model with the
run's precision, dropout and recompute, AdamW over the HF decay groups, the clipper, the
schedule, the loss scaler; and what they will do, read back from them
(`effective_hparams`, FLOPs per token). `migrate train` runs them (`migrate.train.trainer`);
`migrate hparams` reads their knobs without training.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import mindspore as ms
import numpy as np
from mindspore import Tensor, ops

from migrate.errors import MigrateError
from migrate.hf_model_config import model_config_from_hf
from migrate.keymap import MODEL_CLASS_FIELD, Keymap, recorded_keymap
from migrate.models.conversion_plan import ConversionPlan
from migrate.models.fused_ops import use_fused_ops
from migrate.models.loading import load_model
from migrate.models.registry import DEFAULT_MODEL_CLASS, FAMILIES, build_model, family_of, load_model_config
from migrate.run_protocol.throughput import PROBE_SIZE, measure_peak
from migrate.train.config import RunConfig
from migrate.train.health.watch import HealthWatch
from migrate.train.knob_faults import apply_faults, check_faults
from migrate.train.knobs import TrainingKnobs
from migrate.train.live_model import autocast_dtype, mindspore_only_record, shared_record
from migrate.train.lora_run import LoraRun, attach_for_training, lora_param_groups
from migrate.train.optim import AdamW, GradClipper, LrSchedule, param_groups
from migrate.train.precision import DynamicLossScaler, autocast_model
from migrate.train.step.cells import MicroStep


@dataclass
class MSTraining:
    """Every live object of a MindSpore run; `migrate hparams` reads its knobs from here."""

    cfg: RunConfig
    model: object
    model_config: object
    plan: ConversionPlan  # the keymap for this model config, resolved once per run (`resolve_plan`)
    micro: MicroStep
    optimizer: AdamW
    clipper: GradClipper
    schedule: LrSchedule
    scaler: DynamicLossScaler | None
    faults: tuple[str, ...] = ()
    decay_rule: str = "hf"
    extra: dict = field(default_factory=dict)
    lora: LoraRun | None = None  # a LoRA run: adapters on a frozen base (migrate.train.lora_run)

    @property
    def keymap(self) -> Keymap:
        return self.plan.keymap

    @property
    def loss_divisor(self) -> int:
        return self.micro.loss_divisor


def trainable_model_config(ms_dir, trust: bool = False):
    """The model config of a converted folder the trainer can train (a family the registry
    marks `trains`: the bundled Llama, hf_llama, hf_qwen2, hf_mistral, hf_gemma, fused or not);
    anything else is refused in one line. `trust`: model.yaml's class may be imported even if
    migrate does not bundle it (`--trust-model-class`; it is refused here all the same)."""
    return _trainable(load_model_config(Path(ms_dir) / "model.yaml", trust), ms_dir)


def _trainable(config, where):
    model_class = getattr(config, "extra", {}).get(MODEL_CLASS_FIELD) or DEFAULT_MODEL_CLASS
    family = FAMILIES.get(model_class)
    if family is None or not family.trains or not isinstance(config, family.config_class):
        held = model_class if family is not None and isinstance(config, family.config_class) else type(config).__name__
        raise MigrateError(f"migrate train trains the bundled Llama family (hf_llama, hf_qwen2, hf_mistral, hf_gemma); "
                           f"{where} holds {held}")
    return config


def resolve_plan(cfg: RunConfig, weights: bool = True, trust: bool = False) -> ConversionPlan:
    """The run's conversion plan, resolved once and carried to every consumer (loading, decay
    pairing, LoRA sites, checkpoint names, `migrate hparams`): the keymap variant and target
    (qkv_concat, mcore) the folder was converted with, for its model config in fp32.
    weights=False without ms_model: the keymap and config `migrate convert` would pick from
    hf_model's config.json. `trust` (`--trust-model-class`) is the plan's: what the run builds
    from it (`load_training_model`) reads it there."""
    if not weights and cfg.ms_model is None:  # none converted: the family of hf_model's config.json
        keymap, config = model_config_from_hf(cfg.require("hf_model"))
        config = _trainable(config, cfg.hf_model)
    else:
        config = trainable_model_config(cfg.require("ms_model"), trust)
        keymap = Keymap.load(recorded_keymap(cfg.require("ms_model")))
    config.compute_dtype = "float32"
    return ConversionPlan(keymap.for_model(config.to_dict()), config, trust)


def load_training_model(cfg: RunConfig, weights: bool = True, plan: ConversionPlan | None = None):
    """(model, config): the bundled model in fp32 with the run's dropout, recompute and autocast policy;
    config is plan.config (`resolve_plan`), the model class is imported as plan.trust allows."""
    plan = plan or resolve_plan(cfg, weights)
    config = plan.config
    if weights:
        model, config = load_model(cfg.require("ms_model"), plan=plan)
    else:
        model = build_model(config, trust=plan.trust)
    config.attention_dropout = cfg.dropout  # the golden sets every *dropout field
    for layer in model.model.layers:
        layer.attention.dropout = cfg.dropout
        if cfg.recompute:
            layer.recompute()
    if cfg.dtype != "fp32":
        autocast_model(model, cfg.dtype)
    model.set_train(True)
    return model, config


def build_training(cfg: RunConfig, faults=(), model=None, model_config=None, weights: bool = True, *,
                   trust: bool = False) -> MSTraining:
    """Every live object of the run. trust: the folder's model class may be imported even if migrate
    does not bundle it (`--trust-model-class`); the run's plan carries it (`resolve_plan`)."""
    faults = check_faults(faults)
    if model is None:
        plan = resolve_plan(cfg, weights, trust)
        model, model_config = load_training_model(cfg, weights, plan)
    else:  # a model built by the caller: the plan for its config
        model_config = model_config or model.config
        plan = ConversionPlan(resolve_plan(cfg, weights, trust).keymap.for_model(model_config.to_dict()),
                              model_config, trust)
    # The knobs come from the config; an injected fault adjusts them (migrate.train.knob_faults).
    knobs = apply_faults(TrainingKnobs.from_config(cfg), faults)
    opt = cfg.optimizer
    lora = None
    if cfg.lora is not None:
        lora = attach_for_training(model, plan, cfg, weights=weights)
        groups = lora_param_groups(model, lora, cfg, knobs.decay_rule)
    else:
        groups = param_groups(model, cfg, plan, knobs.decay_rule)
    optimizer = AdamW(groups, lr=opt.lr, betas=knobs.betas, eps=knobs.eps, bias_correction=knobs.bias_correction)
    # The step's RMSNorms, rotaries and softmax gradients as fused CPU kernels (at the demo size 949
    # kernels a step instead of 1,435; the same figures within float32 rounding): `migrate.models.fused_ops`.
    use_fused_ops(model)
    micro = MicroStep(model, list(optimizer.parameters), knobs.loss_divisor,
                      grad_factors=head_factors(optimizer.parameters, knobs.head_grad_factor),
                      accum_dtype=knobs.accum_dtype)
    scaler = DynamicLossScaler.from_config(cfg.loss_scale) if cfg.dtype == "fp16" else None
    clipper = GradClipper(cfg.max_grad_norm, eps=knobs.clip_eps, unscale=scaler is not None)
    schedule = LrSchedule(cfg, warmup_shift=knobs.warmup_shift, lag=knobs.lr_lag)
    return MSTraining(cfg, model, model_config, plan, micro, optimizer, clipper, schedule, scaler, faults,
                      knobs.decay_rule, lora=lora)


def head_factors(params, factor: float) -> tuple[float, ...] | None:
    """Per parameter, the factor its gradient is multiplied by (fault `head_grad_scale`): `factor` for the
    LM head (the input embedding where the two are tied: no head of its own), 1 for the others; None when
    the factor is 1 (no fault)."""
    if factor == 1.0:
        return None
    names = [p.name for p in params]
    target = "lm_head." if any("lm_head." in n for n in names) else "embedding"
    return tuple(factor if target in n else 1.0 for n in names)


# ---------- throughput ----------
def checkpoint_names(training: MSTraining) -> dict[str, str]:
    """Model parameter name -> the name the converted folder's checkpoint uses (a keymap
    target that renames, e.g. mcore), so training checkpoints read like that folder."""
    return training.plan.checkpoint_names


def flops_per_token(config, seq_length: int) -> int:
    """6 N + 12 L s (heads * head_dim), from the family's anatomy; see the module docstring."""
    return family_of(config).flops_per_token(config, seq_length)


def measure_peak_flops(size: int = PROBE_SIZE, repeats: int = 5) -> float:
    """Best fp32 matmul throughput of MindSpore here (flop/s), one op at a time (`run_protocol.throughput`)."""
    a = Tensor(np.random.default_rng(0).standard_normal((size, size), np.float32))
    matmul = ops.MatMul()
    return measure_peak(lambda: matmul(a, a).asnumpy(), size, repeats)


# ---------- effective hparams ----------
def effective_hparams(training: MSTraining, peak: dict | None = None) -> dict:
    """What the live MindSpore objects will do (the counterpart of the golden's effective_hparams)."""
    cfg, opt = training.cfg, training.optimizer
    groups = [{"weight_decay": g["weight_decay"], "lr": g["lr"], "betas": list(g["betas"]), "eps": g["eps"],
               "bias_correction": g["bias_correction"], "names": list(g["names"]),
               "numel": int(sum(math.prod(p.shape) for p in g["params"]))} for g in opt.param_groups]
    sched = training.schedule
    live = shared_record(training.model)
    out = {
        "side": "mindspore",
        "versions": {"mindspore": ms.__version__},
        "config": cfg.to_dict(),
        "faults": list(training.faults),
        # Read from the live cells, not the config: what the model that trains will do.
        "model": {"class": type(training.model).__name__, "weights_dtype": _one_or_all(live["parameter_dtypes"]),
                  "autocast": autocast_dtype(training.model),
                  "dropout": {"attention_dropout": training.model_config.attention_dropout},
                  "recompute": bool(live["recompute_layers"]),
                  "tie_word_embeddings": bool(training.model_config.tie_word_embeddings),
                  "keymap": training.keymap.name},
        "optimizer": {"class": "migrate.train.optim.AdamW (torch.optim.AdamW semantics)",
                      "decay_rule": training.decay_rule, "groups": groups},
        "scheduler": {"hf_name": sched.name, "num_warmup_steps": sched.num_warmup_steps,
                      "num_training_steps": sched.num_training_steps, "kwargs": sched.kwargs,
                      "lr": sched.table(cfg.total_steps), "lr_index": "lr[i] is the lr of optimizer step i + 1"},
        "clipping": {"max_grad_norm": training.clipper.max_norm, "eps": training.clipper.eps, "norm_type": 2.0,
                     "grad_norm_logged": "total norm before clipping"},
        "accumulation": {"grad_accum_steps": cfg.grad_accum_steps, "loss_divisor": training.loss_divisor,
                         "grad_dtype": training.micro.accum_dtype,
                         "micro_batch_size": cfg.micro_batch_size,
                         "tokens_per_step": cfg.samples_per_step * cfg.seq_length},
        "loss": {"fn": "mean cross-entropy of fp32 logits", "input": "row[:-1]", "target": "row[1:]"},
        "seed": cfg.seed,
        "data": {"dir": str(cfg.data), "shuffle_seed": cfg.shuffle_seed, "reader": "mindspore.dataset.MindDataset",
                 "sampler": "SubsetSampler over run_order"},
        # The golden records live_shared from its torch model, same keys and meaning; the rest is ours alone.
        "live_shared": live,
        "live_mindspore_only": mindspore_only_record(training.model),
        "health": HealthWatch.for_run(cfg).describe(),  # the one decision module both sides run
    }
    if training.scaler is not None:
        s = training.scaler
        out["loss_scale"] = {"init_scale": s.scale, "growth_factor": s.growth_factor,
                             "backoff_factor": s.backoff_factor, "growth_interval": s.growth_interval,
                             "on_overflow": "skip optimizer and scheduler step, back off the scale"}
    if training.lora is not None:
        out["lora"] = training.lora.record(training.model)
    if peak is not None:
        out["throughput"] = peak
    return out


def _one_or_all(names: list[str]):
    return names[0] if len(names) == 1 else names
