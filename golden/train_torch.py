"""Golden PyTorch continued pretraining: the reference the MindSpore trainer must match.

    python golden/train_torch.py --config run.yaml [--out DIR] [--seed N] [--data-seed N] [--trust-model-class]

Does what HF Trainer does for the same settings, spelled out so each choice is
visible: the HF model in fp32 with eager attention; bf16/fp16 as autocast over
fp32 weights (fp16 adds torch.amp.GradScaler, and a step it skips does not
advance the schedule); torch AdamW over HF's two weight-decay groups;
`transformers.get_scheduler`; each micro-batch loss divided by
grad_accum_steps before backward; `clip_grad_norm_` then step.

Writes to the output folder:
  metrics.jsonl  one line per optimizer step: step (1-based), loss (mean of
                 the step's micro-batch losses, unscaled), lr (the lr that
                 step used), grad_norm (total norm before clipping; null when
                 fp16 overflowed), grad_norm_clipped (total norm of the
                 gradients after clip_grad_norm_, measured on them: the
                 figure that shows the clip epsilon), tokens (target tokens
                 so far), time (seconds since the loop started), tokens_per_s
                 (this step's), mfu (with ms_model: `migrate train`'s estimate, see
                 `throughput_basis`); fp16 adds loss_scale (the one this step used)
                 and skipped; a step the health watch flags adds health (its event
                 kinds), and skipped where the policy skipped it. Step 1 adds the
                 golden's own rounding against a float64 twin (`fp64_reference`;
                 run.yaml `reference: auto | fp64 | off`): loss_fp64,
                 loss_fp64_rel_diff, loss_fp64_seq_err, loss_fp64_token_err,
                 grad_norm_fp64, grad_norm_fp64_rel_diff, grad_norm_fp64_tensor_err
  effective_hparams.json  read back from the live model/optimizer/scheduler
  health.jsonl, health_batches/  the health watch's events (`migrate.train.health.log`)
  events.out.tfevents.*  TensorBoard scalars (`migrate.train.tensorboard`; tensorboard: false to omit)
  eval.jsonl, checkpoint-N/  when eval_interval / checkpoint_interval are set

Importable: `build_model`, `build_optimizer`, `build_scheduler`,
`effective_hparams` and `train(cfg, out)` serve tests and `migrate hparams`.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import inspect
import json
import math
import os
import pickle
import random
import shutil
import sys
import time
import warnings
from pathlib import Path
from typing import NamedTuple

if not __package__:  # run as a script from the checkout: `migrate` lies beside golden/
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

from migrate.checkpoints.atomic import atomic_output_dir  # noqa: E402
from migrate.data.samples import load_samples, run_order  # noqa: E402
from migrate.dtype_names import PRECISIONS  # noqa: E402
from migrate.errors import MigrateError  # noqa: E402
from migrate.hf_config import dtype_kwargs  # noqa: E402
from migrate.lora.targets import base_fingerprint, initial_adapter, select_modules  # noqa: E402
from migrate.models.registry import family_of, load_model_config, trust_from_env  # noqa: E402
from migrate.run_protocol.cadence import checkpoint_due, eval_due  # noqa: E402
from migrate.run_protocol.inputs import check_vocab, eval_rows  # noqa: E402
from migrate.run_protocol.record import finite as _finite  # noqa: E402
from migrate.run_protocol.record import step_record  # noqa: E402
from migrate.run_protocol.throughput import PROBE_SIZE, measure_peak, peak_basis  # noqa: E402
from migrate.train.config import RunConfig  # noqa: E402
from migrate.train.decay import hf_decay_names  # noqa: E402
from migrate.train.health.watch import HealthWatch, StepFacts  # noqa: E402
from migrate.train.run_log import RunLog  # noqa: E402
from migrate.train.step.faults import parse_step_faults  # noqa: E402
from migrate.train.step.profile import format_breakdown, profile_for  # noqa: E402

# "bf16" -> torch.bfloat16; fp32 runs without autocast
AUTOCAST = {p.name: getattr(torch, p.compute) if p.low else None for p in PRECISIONS.values()}
# reference: auto measures step 1 in float64 where the twin (weights and gradients, 16 bytes a
# parameter) and the golden's step-1 gradients (4) take at most this share of the memory available
REFERENCE_MEMORY_SHARE = 0.5


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _checkpointing(model) -> bool:
    flag = getattr(model, "is_activation_checkpointing", None)  # transformers 5's name
    return bool(model.is_gradient_checkpointing if flag is None else flag)  # 4.x's


def build_model(cfg: RunConfig, weights: bool = True):
    """HF model in fp32, eager attention, every *dropout config field set to cfg.dropout.
    weights=False builds it on the meta device from config.json alone (no weight read, no
    memory): what `migrate hparams` needs to build the optimizer and scheduler of a 70B."""
    from transformers import AutoConfig, AutoModelForCausalLM

    path = cfg.require("hf_model")
    try:
        config = AutoConfig.from_pretrained(str(path), local_files_only=True)
    except Exception as exc:  # transformers raises OSError/ValueError for bad folders
        raise MigrateError(f"transformers cannot read the HF model in {path}: "
                           f"{str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__}") from None
    for key in config.to_dict():
        if key.endswith("dropout"):
            setattr(config, key, cfg.dropout)
    config.use_cache = False  # training: no KV cache (HF Trainer turns it off with recompute too)
    if weights:
        model = AutoModelForCausalLM.from_pretrained(str(path), config=config, **dtype_kwargs(torch.float32),
                                                     attn_implementation="eager", local_files_only=True)
    else:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, **dtype_kwargs(torch.float32), attn_implementation="eager")
    if cfg.recompute:
        # transformers 5's name for gradient checkpointing; 4.x's gradient_checkpointing_enable
        (getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable)()
    if cfg.lora is not None:
        model = add_lora(model, cfg, weights)
    return model.train()


def add_lora(model, cfg: RunConfig, weights: bool = True):
    """PEFT's LoRA: `LoraConfig` + `get_peft_model` (base frozen, adapters trainable), the adapters
    then set to migrate's initial bits (PEFT's kaiming-uniform A and zero B, drawn from numpy) so
    that `migrate train` starts from the same ones. PEFT picks the modules; they must be the
    ones migrate resolves through the keymap."""
    from peft import LoraConfig, get_peft_model

    spec = cfg.lora
    head = model.get_output_embeddings()
    linear = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    heads = {n for n, m in model.named_modules() if m is head}
    chosen = select_modules(spec.target_list, linear, heads, f"the HF model in {cfg.hf_model}")
    config = LoraConfig(r=spec.rank, lora_alpha=spec.alpha, lora_dropout=spec.dropout, bias="none",
                        target_modules=spec.target_modules, use_rslora=spec.use_rslora, use_dora=spec.use_dora,
                        task_type="CAUSAL_LM")
    with warnings.catch_warnings():  # PEFT asks transformers a deprecated question (is_gradient_checkpointing)
        warnings.simplefilter("ignore", FutureWarning)
        model = get_peft_model(model, config)
    layers = lora_layers(model)
    if sorted(layers) != sorted(chosen):
        raise MigrateError(f"PEFT adapted {sorted(layers)[:3]}..., migrate resolves {sorted(chosen)[:3]}...")
    if weights:
        with torch.no_grad():
            for name, layer in layers.items():
                a, b = initial_adapter(name, layer.in_features, layer.out_features, spec.rank, cfg.seed)
                layer.lora_A["default"].weight.copy_(torch.from_numpy(a))
                layer.lora_B["default"].weight.copy_(torch.from_numpy(b))
    return model


def lora_layers(model) -> dict:
    """HF module name -> PEFT's LoRA layer wrapping it."""
    from peft.tuners.lora import LoraLayer

    return {n.removeprefix("base_model.model."): m for n, m in model.named_modules() if isinstance(m, LoraLayer)}


def lora_facts(model, fingerprint: bool = True) -> dict:
    """What PEFT's live adapters do, with the keys `migrate train` records (`lora` in effective_hparams)."""
    layers = lora_layers(model)
    first = next(iter(layers.values()))
    config = model.peft_config["default"]
    trainable = [p for p in model.parameters() if p.requires_grad]
    base = None
    if fingerprint and first.base_layer.weight.device.type != "meta":
        base = base_fingerprint({n: m.base_layer.weight.detach().float().numpy() for n, m in layers.items()})
    return {"rank": int(first.r["default"]), "alpha": float(config.lora_alpha),
            "scaling": float(first.scaling["default"]),
            "dropout": float(getattr(first.lora_dropout["default"], "p", 0.0)),
            "use_rslora": bool(config.use_rslora), "use_dora": bool(config.use_dora),
            "target_modules": sorted(layers), "trainable_tensors": len(trainable),
            "trainable_numel": int(sum(p.numel() for p in trainable)), "base_sha256": base}


def build_optimizer(model, cfg: RunConfig) -> torch.optim.AdamW:
    """torch AdamW with HF Trainer's groups: decayed, then not decayed (empty groups dropped)."""
    decay = hf_decay_names(model, cfg.optimizer.no_decay)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    groups = [
        {"params": [(n, p) for n, p in named if n in decay], "weight_decay": cfg.optimizer.weight_decay},
        {"params": [(n, p) for n, p in named if n not in decay], "weight_decay": 0.0},
    ]
    # Named params make the live optimizer carry its own `param_names` per group.
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=cfg.optimizer.lr,
                             betas=tuple(cfg.optimizer.betas), eps=cfg.optimizer.eps)


def build_scheduler(optimizer, cfg: RunConfig):
    from transformers import get_scheduler

    hf = cfg.hf_schedule()
    return get_scheduler(hf.name, optimizer, num_warmup_steps=hf.num_warmup_steps,
                         num_training_steps=hf.num_training_steps, scheduler_specific_kwargs=dict(hf.kwargs))


def build_scaler(cfg: RunConfig):
    if cfg.dtype != "fp16":
        return None
    ls = cfg.loss_scale
    return torch.amp.GradScaler("cpu", init_scale=ls.init_scale, growth_factor=ls.growth_factor,
                                backoff_factor=ls.backoff_factor, growth_interval=ls.growth_interval)


def live_facts(model, autocast) -> dict:
    """Read from the live model, with the meaning and keys of `migrate train`'s `live_shared`:
    parameter dtypes; the dtype the linear layers of each decoder layer and the LM head compute
    in under the run's autocast (their output dtype in a two-token probe forward, in eval mode
    and without grad: no dropout, no RNG drawn, nothing kept); the decoder layers whose
    gradient checkpointing flag is set."""
    if hasattr(model, "get_base_model"):  # PEFT's wrapper: the HF model is inside (adapters included)
        model = model.get_base_model()
    layers, seen, hooks = list(model.base_model.layers), {}, []

    def watch(key, module):
        for sub in module.modules():
            if isinstance(sub, torch.nn.Linear):
                hooks.append(sub.register_forward_hook(
                    lambda _m, _args, out, key=key: seen.setdefault(key, set()).add(_dtype_name(out.dtype))))

    for i, layer in enumerate(layers):
        watch(i, layer)
    watch("lm_head", model.get_output_embeddings())
    training = model.training
    model.eval()
    try:
        with torch.no_grad(), _autocast(autocast):
            model(input_ids=torch.zeros((1, 2), dtype=torch.long, device=model.device))
    finally:
        for hook in hooks:
            hook.remove()
        model.train(training)
    return {
        "parameter_dtypes": sorted({_dtype_name(p.dtype) for p in model.parameters()}),
        "linear_compute_dtypes": {"decoder_layers": [sorted(seen.get(i, ())) for i in range(len(layers))],
                                  "lm_head": sorted(seen.get("lm_head", ()))},
        "recompute_layers": [i for i, layer in enumerate(layers) if getattr(layer, "gradient_checkpointing", False)],
    }


def _dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def clip_eps() -> float:
    """The epsilon clip_grad_norm_ adds to the norm (max_norm / (norm + eps)), measured on a float64 tensor."""
    p = torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))
    p.grad = torch.ones(1, dtype=torch.float64)
    torch.nn.utils.clip_grad_norm_([p], 0.5)
    return float(f"{0.5 / float(p.grad[0]) - 1.0:.6g}")


def effective_hparams(cfg: RunConfig, model, optimizer, scheduler, scaler=None) -> dict:
    """What the live objects will actually do, for `migrate hparams` to compare."""
    import transformers

    groups = []
    for g in optimizer.param_groups:
        group = {k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items()
                 if k not in ("params", "param_names")}
        group["names"] = list(g["param_names"])
        group["numel"] = sum(p.numel() for p in g["params"])
        groups.append(group)
    # LambdaLR's own lambda for every step, without stepping the live scheduler.
    lam, base = scheduler.lr_lambdas[0], scheduler.base_lrs[0]
    hf = cfg.hf_schedule()
    out = {
        "side": "golden",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "config": cfg.to_dict(),
        "model": {
            "class": type(model).__name__,
            "attn_implementation": model.config._attn_implementation,
            "weights_dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
            "autocast": str(AUTOCAST[cfg.dtype]).replace("torch.", "") if AUTOCAST[cfg.dtype] else None,
            "dropout": {k: v for k, v in model.config.to_dict().items() if k.endswith("dropout")},
            "gradient_checkpointing": _checkpointing(model),
            "tie_word_embeddings": bool(getattr(model.config, "tie_word_embeddings", False)),
        },
        "optimizer": {"class": type(optimizer).__name__, "defaults_lr": optimizer.defaults["lr"], "groups": groups},
        "scheduler": {"class": type(scheduler).__name__, "hf_name": hf.name, "num_warmup_steps": hf.num_warmup_steps,
                      "num_training_steps": hf.num_training_steps, "kwargs": dict(hf.kwargs),
                      "lr": [float(base * lam(s)) for s in range(cfg.total_steps)],
                      "lr_index": "lr[i] is the lr of optimizer step i + 1"},
        "clipping": {"fn": "torch.nn.utils.clip_grad_norm_", "max_grad_norm": cfg.max_grad_norm or None,
                     "eps": clip_eps(), "norm_type": 2.0, "grad_norm_logged": "total norm before clipping"},
        "accumulation": {"grad_accum_steps": cfg.grad_accum_steps, "micro_batch_size": cfg.micro_batch_size,
                         "loss": "each micro-batch mean loss / grad_accum_steps before backward",
                         # backward adds each micro-batch's gradient into p.grad, in the parameters' dtype
                         "grad_dtype": _dtype_name(next(p for p in model.parameters() if p.requires_grad).dtype),
                         "tokens_per_step": cfg.samples_per_step * cfg.seq_length},
        "loss": {"fn": "HF ForCausalLMLoss", "input": "row[:-1]", "target": "row[1:]", "reduction": "mean"},
        "seed": cfg.seed,
        "data": {"dir": str(cfg.data), "shuffle_seed": cfg.shuffle_seed,
                 "order": "epoch e = numpy.random.default_rng([seed, e]).permutation(n)"},
        "live_shared": live_facts(model, AUTOCAST[cfg.dtype]),  # `migrate train` records the same
        "health": build_health_watch(cfg).describe(),  # the one decision module both sides run
    }
    if cfg.lora is not None:
        out["lora"] = lora_facts(model)
    if scaler is not None:
        out["loss_scale"] = {"init_scale": scaler.get_scale(), "growth_factor": scaler.get_growth_factor(),
                             "backoff_factor": scaler.get_backoff_factor(),
                             "growth_interval": scaler.get_growth_interval(),
                             "on_overflow": "skip optimizer and scheduler step, back off the scale"}
    return out


def build_health_watch(cfg: RunConfig) -> HealthWatch:
    """The health watch of run.yaml's `health:` section (`migrate.train.health.watch`, shared with `migrate train`)."""
    return HealthWatch.for_run(cfg)


def throughput_basis(cfg: RunConfig, trust: bool = False) -> dict | None:
    """The MFU estimate's figures, as `migrate train` takes them: flops per token from the converted
    model's family (PaLM's 6N + 12 L s h, `migrate.models.anatomy`), and run.yaml's peak_flops, else the
    best fp32 torch.matmul 1024^3 measured here. None without ms_model (no family to count with).
    trust: ms_model's class may be imported even if migrate does not bundle it (`--trust-model-class`)."""
    if cfg.ms_model is None or not (Path(cfg.ms_model) / "model.yaml").is_file():
        return None
    config = load_model_config(Path(cfg.ms_model) / "model.yaml", trust)
    return peak_basis(family_of(config).flops_per_token(config, cfg.seq_length), given=None,
                      config_peak=cfg.peak_flops, measure=_measure_peak_flops,
                      measured_source="measured: best fp32 torch.matmul 1024x1024x1024 on this device "
                                      "(achievable peak)")


def _measure_peak_flops(size: int = PROBE_SIZE, repeats: int = 5) -> float:
    a = torch.randn(size, size, generator=torch.Generator().manual_seed(0))
    return measure_peak(lambda: torch.matmul(a, a), size, repeats)


def micro_loss(model, rows: torch.Tensor) -> torch.Tensor:
    """HF's causal-LM loss of row[:-1] predicting row[1:] (labels given pre-shifted)."""
    logits = model(input_ids=rows[:, :-1]).logits
    targets = rows[:, 1:].contiguous()
    return causal_loss(model, logits, targets)


def causal_loss(model, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """HF's causal-LM loss of `logits` predicting `targets` (pre-shifted, `shift_labels`). transformers
    4.4x's loss takes no `shift_labels` and shifts itself: given one more position on each side, which
    that shift drops again (a last logit row, a first ignored label), it computes the same mean."""
    loss_fn = getattr(model, "loss_function", None)
    if loss_fn is None:  # 4.45: no loss_function; its causal LMs compute this cross entropy inline
        return torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=-100)
    if "shift_labels" in inspect.signature(loss_fn).parameters:
        return loss_fn(logits, None, vocab_size=model.config.vocab_size, shift_labels=targets)
    padded = torch.nn.functional.pad(logits, (0, 0, 0, 1))
    return loss_fn(padded, torch.nn.functional.pad(targets, (1, 0), value=-100), vocab_size=model.config.vocab_size)


def reference_skipped(cfg: RunConfig, model, available: int | None = None) -> str | None:
    """Why step 1 is not measured against a float64 twin (None: it is). Dropout draws other masks
    in the twin, so its loss would be no reference; `auto` also skips a twin that does not fit."""
    if cfg.reference == "off":
        return "reference: off"
    dropout = {k: v for k, v in model.config.to_dict().items()
               if k.endswith("dropout") and isinstance(v, (int, float)) and v > 0}
    if cfg.lora is not None and cfg.lora.dropout > 0:
        dropout["lora.dropout"] = cfg.lora.dropout
    if dropout:
        return (f"dropout is on ({', '.join(f'{k} {v:g}' for k, v in dropout.items())}): a float64 twin draws "
                "other masks, so its loss is no reference")
    if cfg.reference == "fp64":
        return None
    every = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    need = 8 * every + 12 * trainable  # twin weights, twin gradients, the golden's own gradients
    if available is None:
        import psutil

        available = int(psutil.virtual_memory().available)
    if need > REFERENCE_MEMORY_SHARE * available:
        return (f"a float64 twin needs {need / 2**30:.1f} GiB, more than {REFERENCE_MEMORY_SHARE:.0%} of the "
                f"{available / 2**30:.1f} GiB available (reference: fp64 measures it anyway)")
    return None


def fp64_reference(model, batches: list, cfg: RunConfig, params: list, scaler=None) -> dict:
    """Step 1's loss and gradient norm as the golden computes them, beside a float64 twin's.

    The twin is `copy.deepcopy(model).double()`: the very weights step 1 uses, in the same train /
    eval mode, without autocast (in bf16 / fp16 runs the fp32 master weights in float64, so the
    figures are the golden's own low-precision error). Each micro-batch of ``batches`` (step 1's
    rows) runs forward and backward on both, the golden's as in its loop (autocast, loss /
    grad_accum_steps, fp16's loss scale undone as GradScaler.unscale_ does; the norm over
    ``params``, the optimizer's, in its order, as clip_grad_norm_ sums it). With e_t = the
    golden's loss of token t minus the twin's, the returned fields are:

      loss_fp64                  mean of the twin's micro-batch losses (as ``loss`` is of the golden's)
      loss_fp64_rel_diff         |loss - loss_fp64| / |loss_fp64|: the plain difference, which can be
                                 lucky (errors of opposite sign cancel)
      loss_fp64_seq_err          mean over the step's sequences of |mean of e_t over the sequence| /
                                 |loss_fp64|: bounds the golden's own error (the plain difference is
                                 at most it) without assuming the sequences' errors cancel
      loss_fp64_token_err        mean over tokens of |e_t| / |loss_fp64|: the same bound per token,
                                 looser where tokens round independently (bf16: 40x the plain one)
      grad_norm_fp64             the twin's global gradient norm
      grad_norm_fp64_rel_diff    |grad_norm - grad_norm_fp64| / grad_norm_fp64
      grad_norm_fp64_tensor_err  sum over tensors of |sum g^2 - sum g_fp64^2| / (2 grad_norm_fp64^2):
                                 the same kind of bound on the norm's error, tensor by tensor

    Nothing of the golden's training changes: the torch RNG state is restored, the golden's
    gradients are dropped (set to None, as zero_grad leaves them) and the twin is freed."""
    import torch.nn.functional as F

    autocast, accum = AUTOCAST[cfg.dtype], cfg.grad_accum_steps
    scale = scaler.get_scale() if scaler is not None else None
    with torch.random.fork_rng(devices=[]):
        twin = copy.deepcopy(model).double()
        losses, losses64, token_err = [], [], []
        for rows in batches:
            inputs, targets = rows[:, :-1], rows[:, 1:].contiguous()
            with _autocast(autocast):
                logits = model(input_ids=inputs).logits
                loss = causal_loss(model, logits, targets)
            scaled = loss / accum
            (scaled * scale if scale is not None else scaled).backward()
            losses.append(loss.item())
            tokens = F.cross_entropy(logits.detach().float().flatten(0, 1), targets.flatten(), reduction="none")
            del logits
            logits64 = twin(input_ids=inputs).logits
            tokens64 = F.cross_entropy(logits64.flatten(0, 1), targets.flatten(), reduction="none")
            (tokens64.mean() / accum).backward()
            losses64.append(tokens64.mean().item())
            token_err.append((tokens.double() - tokens64.detach()).view(targets.shape))  # e_t, one row a sequence
            del logits64, tokens64
        twin_of = {id(p): q for p, q in zip(model.parameters(), twin.parameters(), strict=True)}
        pairs = [(p, twin_of[id(p)]) for p in params if p.grad is not None]
        grads = [p.grad if scale is None else p.grad * torch.tensor(1.0 / scale, dtype=torch.float32)
                 for p, _ in pairs]  # GradScaler.unscale_ multiplies by the fp32 inverse scale
        grad_norm = float(torch.nn.utils.get_total_norm(grads))  # as clip_grad_norm_ measures it
        squares = [(float(g.double().pow(2).sum()), float(q.grad.pow(2).sum()))
                   for g, (_, q) in zip(grads, pairs, strict=True)]
        del twin, grads, pairs
    for p in model.parameters():
        p.grad = None
    loss, loss64, err = sum(losses) / len(losses), sum(losses64) / len(losses64), torch.cat(token_err)
    out = {"loss_fp64": loss64, "loss_fp64_rel_diff": abs(loss - loss64) / abs(loss64),
           "loss_fp64_seq_err": float(err.mean(dim=1).abs().mean()) / abs(loss64),
           "loss_fp64_token_err": float(err.abs().mean()) / abs(loss64)}
    norm64_sq = sum(b for _, b in squares)
    if math.isfinite(grad_norm) and norm64_sq > 0:  # an fp16 overflow has no gradient figure
        norm64 = math.sqrt(norm64_sq)
        out.update(grad_norm_fp64=norm64, grad_norm_fp64_rel_diff=abs(grad_norm - norm64) / norm64,
                   grad_norm_fp64_tensor_err=sum(abs(a - b) for a, b in squares) / (2 * norm64_sq))
    return {k: _finite(v) for k, v in out.items()}


def train(cfg: RunConfig, out: str | Path | None = None, log=print, *, step_faults=(), profile: bool = False,
          trust: bool = False) -> Path:
    """Run the golden training; returns the output folder (metrics.jsonl, effective_hparams.json,
    health.jsonl, TensorBoard events). step_faults: `migrate.train.step.faults` specs, applied
    where `migrate train` applies them. The health policy `stop` raises HealthStop (exit 3).
    profile: the step-time breakdown `migrate train --profile` logs (torch CPU is synchronous,
    so no sync is needed), as time_*_s fields and a table logged at the end. The step record,
    the run log, the eval and checkpoint cadence are the run protocol's (`migrate.run_protocol`,
    `migrate.train.run_log`), as `migrate train`'s. trust: ms_model's class may be imported even if
    migrate does not bundle it (its MFU figures, `throughput_basis`)."""
    faults = parse_step_faults(step_faults, cfg.total_steps)  # a step past the end: refused, as migrate train does
    out = Path(out) if out is not None else cfg.out_dir.golden
    out.mkdir(parents=True, exist_ok=True)
    samples = load_samples(cfg.data, cfg.seq_length)
    order = run_order(cfg, len(samples))
    rows_eval = eval_rows(cfg)
    seed_everything(cfg.seed)
    model = build_model(cfg)
    check_vocab(cfg.data, model.config.vocab_size, cfg.hf_model)
    optimizer, scaler = build_optimizer(model, cfg), build_scaler(cfg)
    scheduler = build_scheduler(optimizer, cfg)
    hparams = effective_hparams(cfg, model, optimizer, scheduler, scaler)
    basis = throughput_basis(cfg, trust)
    if basis is not None:
        hparams["throughput"] = basis
    (out / "effective_hparams.json").write_text(json.dumps(hparams, indent=2) + "\n")
    params = [p for g in optimizer.param_groups for p in g["params"]]
    run_log = RunLog(out, cfg, echo=log, watch=build_health_watch(cfg))
    prof = profile_for(profile)  # off: no clock, no fields
    reference = _step1_reference(cfg, model, params, samples, order, scaler, log)  # before the clock starts
    start, tokens = time.perf_counter(), 0
    with contextlib.closing(run_log):
        for step in range(cfg.total_steps):
            step_start = time.perf_counter()
            prof.begin()
            done = optimizer_step(model, optimizer, scheduler, scaler, cfg, step, params=params,
                                  read=lambda micro, step=step: batch_rows(samples, order, step, micro),
                                  decide=lambda facts, losses, step=step: run_log.health.step(facts, losses,
                                                                                              order[step]),
                                  faults=faults, prof=prof)
            tokens += done.step_tokens
            step_loss, lr, grad_norm, clipped_norm = done.loss, done.lr, done.grad_norm, done.clipped_norm
            scale, skipped, verdict, step_tokens = done.scale, done.skipped, done.verdict, done.step_tokens
            now = time.perf_counter()
            record = step_record(step + 1, step_loss, lr, float(grad_norm), float(clipped_norm), tokens=tokens,
                                 step_tokens=step_tokens, step_seconds=now - step_start, run_seconds=now - start,
                                 flops_per_token=basis["flops_per_token"] if basis is not None else None,
                                 peak_flops=basis["peak_flops"] if basis is not None else None,
                                 loss_scale=scale, skipped=skipped, health=[e.kind for e in verdict.events],
                                 extra=[reference if step == 0 else {}, prof.end(now - step_start)])
            run_log.step(record, verdict)
            run_log.health.stop_if(verdict)
            if rows_eval is not None and eval_due(cfg, step + 1):
                run_log.eval(step + 1, _evaluate(model, rows_eval, cfg), len(rows_eval))
            if checkpoint_due(cfg, step + 1):
                _save_checkpoint(model, optimizer, scheduler, scaler, cfg, out, step + 1)
    if profile:
        log(format_breakdown(run_log.metrics.records(), "golden PyTorch step time"))
    return out


class StepDone(NamedTuple):
    """What one golden optimizer step did (`optimizer_step`). A NamedTuple, not a dataclass: tests
    load this file without registering it as a module, which dataclasses need."""

    loss: float            # mean of the micro-batch losses
    losses: list
    lr: float              # the lr optimizer.step() used
    grad_norm: float       # total norm before clipping (unscaled)
    clipped_norm: float    # measured on the clipped gradients
    scale: float | None    # fp16: the loss scale this step's backward used
    skipped: bool
    verdict: object        # the health watch's
    step_tokens: int


def batch_rows(samples, order, step: int, micro: int) -> torch.Tensor:
    """Micro-batch `micro` of optimizer step `step` (0-based): the rows run_order gives it."""
    return torch.from_numpy(np.asarray(samples[order[step, micro]], dtype=np.int64))


def optimizer_step(model, optimizer, scheduler, scaler, cfg: RunConfig, step: int, *, params, read, decide,
                   faults=None, prof=None, observe=None) -> StepDone:
    """Optimizer step step + 1 (`step` 0-based), the one `train` runs in its loop: every micro-batch's
    forward and backward (loss / grad_accum_steps, scaled in fp16), unscale, clip_grad_norm_, the
    health watch's decision, AdamW and the scheduler step, gradients zeroed.

    read(micro) gives a micro-batch's rows; decide(StepFacts, losses) is the health watch's
    verdict. observe (`migrate replay`): an object told what the step computes as it goes --
    ``micro(index, loss, grads)`` after each backward (the accumulated gradients, scaled in fp16),
    ``clipped(grad_norm, clipped_norm, grads)`` after clipping, ``stepped(lr, moments, params)``
    after the optimizer step; gradients and parameters by name, as numpy float32 (float64 kept)."""
    faults = faults if faults is not None else parse_step_faults(())
    prof = prof if prof is not None else profile_for(False)
    named = [(n, p) for g in optimizer.param_groups for n, p in zip(g["param_names"], g["params"], strict=True)]
    scheduled = [g["lr"] for g in optimizer.param_groups]
    if faults.lr_factor(step + 1) != 1.0:
        for g in optimizer.param_groups:
            g["lr"] *= faults.lr_factor(step + 1)
    lr = optimizer.param_groups[0]["lr"]  # what this step's optimizer.step() uses
    autocast, losses, step_tokens = AUTOCAST[cfg.dtype], [], 0
    for micro in range(cfg.grad_accum_steps):
        with prof.phase("data"):
            rows = read(micro)
        with prof.phase("fwd_bwd"):
            with _autocast(autocast):
                loss = micro_loss(model, rows)
            scaled = loss / cfg.grad_accum_steps
            (scaler.scale(scaled) if scaler else scaled).backward()
            losses.append(loss.item())
        step_tokens += rows[:, 1:].numel()
        if observe is not None:
            observe.micro(micro, losses[-1], _named_arrays((n, p.grad) for n, p in named if p.grad is not None))
    if faults.poison_grad(step + 1):  # before unscale_, so that fp16's scaler sees it
        with torch.no_grad():
            next(p for p in params if p.grad is not None).grad.view(-1)[0] = float("nan")
    with prof.phase("clip"):
        if scaler:
            scaler.unscale_(optimizer)  # clip and log the true gradient norm
        grads = [p.grad for p in params if p.grad is not None]
        if cfg.max_grad_norm:
            grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
            clipped_norm = torch.nn.utils.get_total_norm(grads)  # measured on the clipped tensors
        else:
            grad_norm = clipped_norm = torch.nn.utils.get_total_norm(grads)
    if observe is not None:
        observe.clipped(float(grad_norm), float(clipped_norm),
                        _named_arrays((n, p.grad) for n, p in named if p.grad is not None))
    scale = scaler.get_scale() if scaler else None  # the scale this step's backward used
    step_loss = sum(losses) / len(losses)
    verdict = decide(StepFacts(step + 1, _finite(step_loss), _finite(float(grad_norm)), lr, scale), losses)
    if verdict.action == "continue":
        with prof.phase("optimizer"):
            skipped = _optimizer_step(optimizer, scaler)
    else:  # the health policy skips (or stops at) this step: no optimizer, no scheduler step
        skipped = True
        if scaler:
            scaler.update()  # the scale moves as on any step (unscale_ recorded the overflow, if any)
    if observe is not None:
        state = optimizer.state
        moments = {key: _named_arrays((n, state[p][key]) for n, p in named if key in state.get(p, {}))
                   for key in ("exp_avg", "exp_avg_sq")}
        observe.stepped(lr, moments, _named_arrays((n, p) for n, p in named), skipped)
    if not skipped:
        scheduler.step()
    else:
        for g, scheduled_lr in zip(optimizer.param_groups, scheduled, strict=True):
            g["lr"] = scheduled_lr  # an injected lr factor must not outlive its step
    optimizer.zero_grad(set_to_none=True)
    return StepDone(step_loss, losses, lr, float(grad_norm), float(clipped_norm), scale, skipped, verdict,
                    step_tokens)


def _named_arrays(pairs) -> dict:
    """name -> a numpy copy (float32, or float64 as it is) of each tensor."""
    out = {}
    for name, t in pairs:
        t = t.detach()
        out[name] = (t if t.dtype == torch.float64 else t.float()).numpy().copy()
    return out


def load_checkpoint(cfg: RunConfig, folder: str | Path):
    """(model, optimizer, scheduler, scaler, step) as `train` left them after writing `folder`
    (a checkpoint-N of its run): the weights save_pretrained wrote, the optimizer, scheduler and
    fp16 scaler state of trainer_state.pt. The next step `optimizer_step` runs is step + 1 (0-based: step).
    Dropout RNG is not saved: a run with dropout does not replay its masks."""
    folder = Path(folder)
    state_file = folder / "trainer_state.pt"
    if not (folder / "config.json").is_file() or not state_file.is_file():
        raise MigrateError(f"{folder} is not a golden checkpoint (config.json and trainer_state.pt)")
    model = build_model(cfg.replace(hf_model=folder))
    optimizer, scaler = build_optimizer(model, cfg), build_scaler(cfg)
    scheduler = build_scheduler(optimizer, cfg)
    try:
        state = torch.load(state_file, map_location="cpu", weights_only=True)
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        if scaler is not None:
            scaler.load_state_dict(state["scaler"])
        step = int(state["step"])
    except (KeyError, TypeError, ValueError, RuntimeError, pickle.UnpicklingError) as exc:
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise MigrateError(f"{state_file} does not fit this run: {why}") from None
    return model, optimizer, scheduler, scaler, step


def _step1_reference(cfg: RunConfig, model, params, samples, order, scaler, log) -> dict:
    """`fp64_reference` on step 1's rows, or {} with a note saying why it is skipped."""
    why = reference_skipped(cfg, model)
    if why is not None:
        if cfg.reference != "off":
            log(f"note: no float64 reference at step 1: {why}; `migrate compare` falls back to depth-scaled bounds")
        return {}
    batches = [torch.from_numpy(np.asarray(samples[order[0, micro]], dtype=np.int64))
               for micro in range(cfg.grad_accum_steps)]
    reference = fp64_reference(model, batches, cfg, params, scaler)  # get_scale() only reads the scaler
    figures = {k: "n/a" if v is None else f"{v:.2e}" for k, v in reference.items()}
    log(f"float64 reference at step 1: loss rel diff {figures['loss_fp64_rel_diff']} (per sequence "
        f"{figures['loss_fp64_seq_err']}, per token {figures['loss_fp64_token_err']})"
        + (f", grad norm rel diff {figures['grad_norm_fp64_rel_diff']} (per tensor "
           f"{figures['grad_norm_fp64_tensor_err']})" if "grad_norm_fp64" in figures else ""))
    return reference


def _optimizer_step(optimizer, scaler) -> bool:
    """Step; True when the fp16 scaler skipped it for inf/nan gradients (as HF/accelerate detect it)."""
    if scaler is None:
        optimizer.step()
        return False
    before = scaler.get_scale()
    scaler.step(optimizer)
    scaler.update()
    return scaler.get_scale() < before


def _autocast(dtype):
    return torch.autocast("cpu", dtype=dtype) if dtype is not None else contextlib.nullcontext()


@torch.no_grad()
def _evaluate(model, rows, cfg: RunConfig) -> float:
    """Mean loss over the eval rows in file order, micro_batch_size at a time."""
    model.eval()
    total = 0.0
    for start in range(0, len(rows), cfg.micro_batch_size):
        batch = torch.from_numpy(np.asarray(rows[start:start + cfg.micro_batch_size], dtype=np.int64))
        with _autocast(AUTOCAST[cfg.dtype]):
            total += micro_loss(model, batch).item() * len(batch)
    model.train()
    return total / len(rows)


def _save_checkpoint(model, optimizer, scheduler, scaler, cfg: RunConfig, out: Path, step: int) -> None:
    with atomic_output_dir(out / f"checkpoint-{step}", overwrite=True) as tmp:
        model.save_pretrained(str(tmp))
        torch.save({"step": step, "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                    "scaler": scaler.state_dict() if scaler else None}, tmp / "trainer_state.pt")
    if cfg.keep_checkpoints:
        done = sorted(out.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
        for old in done[: -cfg.keep_checkpoints]:
            shutil.rmtree(old)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="run.yaml")
    parser.add_argument("--out", help="output folder (default: the config's out_dir.golden)")
    parser.add_argument("--seed", type=int, help="override seed")
    parser.add_argument("--data-seed", type=int, help="override data_seed")
    parser.add_argument("--step-fault", action="append", metavar="KIND@STEP[-LAST]",
                        help="rehearse the health watch: nan_grad or lr_x100 at those steps (as migrate train)")
    parser.add_argument("--profile", action="store_true",
                        help="time each step's phases (time_*_s fields in metrics.jsonl, a table at the end)")
    parser.add_argument("--trust-model-class", action="store_true",
                        help="ms_model's model.yaml may name a class migrate does not bundle (as migrate train; "
                             "MIGRATE_TRUST_MODEL_CLASS=1 does the same)")
    args = parser.parse_args(argv)
    trust = args.trust_model_class or trust_from_env(os.environ)  # the entry point reads the environment
    # transformers' "Loading weights" / "Writing model shards" bars, at the start and at every checkpoint,
    # would cut into the run's own step lines
    hf_logging.disable_progress_bar()
    try:
        cfg = RunConfig.load(args.config)
        overrides = {k: v for k, v in (("seed", args.seed), ("data_seed", args.data_seed)) if v is not None}
        if overrides:
            cfg = cfg.replace(**overrides)
        out = train(cfg, args.out, step_faults=args.step_fault or (), profile=args.profile, trust=trust)
    except MigrateError as exc:
        print(f"train_torch: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return exc.exit_code
    print(f"golden run written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
