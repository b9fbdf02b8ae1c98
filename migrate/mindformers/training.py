"""run.yaml's training knobs as MindFormers 2.0.0 YAML sections, with torch's meaning.

Each function returns the section(s) and the differences that remain, stated; a knob
MindFormers cannot express the golden's way is refused in one line naming it. Why
each mapping computes what the golden computes is `migrate.mindformers.table`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from migrate.errors import MigrateError
from migrate.train.config import RunConfig
from migrate.train.decay import HF_DEFAULT


@dataclass
class Batching:
    """How the golden's global batch is laid out in MindFormers."""

    batch_size: int          # runner_config.batch_size: rows per device per micro-batch
    accumulation: int        # runner_config.gradient_accumulation_steps (pp == 1)
    micro_batch_num: int     # parallel_config.micro_batch_num (pp > 1, else 1)
    dp: int
    notes: list[str] = field(default_factory=list)

    @property
    def global_batch(self) -> int:
        return self.batch_size * self.dp * self.accumulation * self.micro_batch_num


def batching(cfg: RunConfig, dp: int, pp: int, micro_batches: int, cpu: bool) -> Batching:
    """The golden's global batch (micro_batch_size × grad_accum_steps) over dp × accumulation
    (or pipeline micro-batches): per-device rows as close to the golden's micro batch as divides."""
    total = cfg.micro_batch_size * cfg.grad_accum_steps
    if cpu:
        notes = []
        if cfg.grad_accum_steps > 1:
            notes.append(f"CPU: one batch of {total} rows instead of {cfg.grad_accum_steps} accumulated micro-batches "
                         f"of {cfg.micro_batch_size} (MindFormers accumulates only under semi_auto_parallel, which "
                         "MindSpore runs on Ascend/GPU): the same mean loss and gradient, more memory")
        return Batching(total, 1, 1, 1, notes)
    if pp > 1:
        if total % (dp * micro_batches):
            raise MigrateError(f"the golden's global batch {total} (micro_batch_size × grad_accum_steps) is not "
                               f"divisible by dp × micro-batches = {dp} × {micro_batches}")
        return Batching(total // (dp * micro_batches), 1, micro_batches, dp)
    if total % dp:
        raise MigrateError(f"the golden's global batch {total} (micro_batch_size × grad_accum_steps) is not "
                           f"divisible by dp {dp}")
    per_rank = total // dp
    size = max(b for b in range(1, min(cfg.micro_batch_size, per_rank) + 1) if per_rank % b == 0)
    return Batching(size, per_rank // size, 1, dp)


def optimizer_section(cfg: RunConfig) -> dict:
    """mindformers.core.optim.AdamW (BasicAdamW): torch.optim.AdamW's update, written out in full."""
    rules = list(cfg.optimizer.no_decay)
    if cfg.optimizer.weight_decay and sorted(rules) != sorted(HF_DEFAULT):
        raise MigrateError(f"optimizer.no_decay {rules}: MindFormers 2.0.0 exempts exactly the 1-D parameters and "
                           "names ending in .bias from weight decay (get_optimizer_grouped_parameters), which for "
                           f"the Llama family is no_decay {list(HF_DEFAULT)}; no YAML field changes that set")
    o = cfg.optimizer
    return {"type": "AdamW", "betas": [float(o.betas[0]), float(o.betas[1])], "eps": float(o.eps),
            "weight_decay": float(o.weight_decay), "use_fused": False}


def lr_section(cfg: RunConfig) -> dict:
    """The lr_schedule whose formula is transformers.get_scheduler's for this run."""
    hf, lr = cfg.hf_schedule(), float(cfg.optimizer.lr)
    warmup, total = hf.num_warmup_steps, hf.num_training_steps
    if hf.name in ("constant", "constant_with_warmup"):
        return {"type": "ConstantWarmUpLR", "learning_rate": lr, "warmup_steps": warmup, "warmup_lr_init": 0.0,
                "total_steps": total}
    if hf.name == "linear":
        return {"type": "LinearWithWarmUpLR", "learning_rate": lr, "warmup_steps": warmup, "warmup_lr_init": 0.0,
                "total_steps": total}
    if hf.name == "polynomial":
        return {"type": "PolynomialWithWarmUpLR", "learning_rate": lr, "warmup_steps": warmup, "warmup_lr_init": 0.0,
                "total_steps": total, "lr_end": float(hf.kwargs["lr_end"]), "power": float(hf.kwargs["power"])}
    if hf.name in ("cosine", "cosine_with_min_lr"):
        floor = hf.kwargs.get("min_lr")
        if floor is None:
            floor = lr * hf.kwargs.get("min_lr_rate", 0.0)
        return {"type": "CosineWithWarmUpLR", "learning_rate": lr, "warmup_steps": warmup, "warmup_lr_init": 0.0,
                "total_steps": total, "decay_steps": total, "num_cycles": 0.5, "lr_end": float(floor)}
    raise MigrateError(f"schedule {hf.name}: no MindFormers lr_schedule is mapped to it")


def wrapper_section(cfg: RunConfig, batch: Batching) -> tuple[dict, list[str]]:
    """runner_wrapper: clipping, loss scale and (with accumulation or pp) the dividing wrapper."""
    notes = []
    if cfg.dtype == "fp16":
        ls = cfg.loss_scale
        if not math.isclose(ls.backoff_factor * ls.growth_factor, 1.0):
            raise MigrateError(f"loss_scale: MindSpore's DynamicLossScaleUpdateCell divides by scale_factor on "
                               f"overflow and multiplies by it on growth; backoff_factor {ls.backoff_factor} is not "
                               f"1 / growth_factor {ls.growth_factor}")
        scale: float | dict = {"type": "DynamicLossScaleUpdateCell", "loss_scale_value": float(ls.init_scale),
                               "scale_factor": float(ls.growth_factor), "scale_window": int(ls.growth_interval)}
        notes.append("fp16 loss scale: DynamicLossScaleUpdateCell keeps the scale >= 1 "
                     "(torch's GradScaler has no floor)")
    else:
        scale = 1.0
    clip = bool(cfg.max_grad_norm)
    pipeline = batch.accumulation > 1 or batch.micro_batch_num > 1
    section = {"type": "MFPipelineWithLossScaleCell" if pipeline else "MFTrainOneStepCell",
               "scale_sense": scale, "use_clip_grad": clip, "max_grad_norm": float(cfg.max_grad_norm or 1.0)}
    if pipeline:
        section["micro_batch_num"] = batch.accumulation * batch.micro_batch_num
    if clip:
        notes.append(f"clipping below max_grad_norm: MindFormers' ClipGradNorm still scales the gradient by "
                     f"max/(max + 1e-6) = 1 - {1e-6 / cfg.max_grad_norm:.2g} where clip_grad_norm_ leaves it")
    return section, notes


def steps_per_epoch(samples: int, global_batch: int) -> int:
    if samples < global_batch:
        raise MigrateError(f"the data holds {samples} rows, fewer than one global batch of {global_batch}")
    return samples // global_batch


def stop_callback(cfg: RunConfig) -> dict:
    """The callback that stops MindFormers 2.0.0 at total_steps: its TrainCallBack, listed in `callbacks`
    (base_trainer.py builds every listed callback; runner_config.stop_step builds one it never adds)."""
    return {"type": "TrainCallBack", "stop_step": int(cfg.total_steps)}


def runner_section(cfg: RunConfig, batch: Batching, samples: int, cpu: bool) -> tuple[dict, list[str]]:
    """runner_config: MindFormers trains epochs × dataset-size steps, so epochs is chosen for exactly
    total_steps; on CPU, which has no dataset sink, whole epochs are planned and `stop_callback` ends
    the run at total_steps."""
    spe = steps_per_epoch(samples, batch.global_batch)
    section = {"batch_size": batch.batch_size, "gradient_accumulation_steps": batch.accumulation}
    notes = data_order_notes(cfg, samples, batch.global_batch, spe)
    if cpu:
        # MindSpore's Model.train runs the non-sink loop on CPU even with dataset_sink_mode True, for the epochs
        # MindFormers computed for sinks: sink_size 1 would train total_steps whole epochs.
        section.update(epochs=math.ceil(cfg.total_steps / spe), sink_mode=False)
        return section, notes
    epochs: float | int = cfg.total_steps // spe if cfg.total_steps % spe == 0 else round(
        (cfg.total_steps + 0.5) / spe, 6)
    assert int(spe * epochs) == cfg.total_steps  # MindFormers: int(dataset_size / sink_size * epochs) sink steps
    section.update(epochs=epochs, sink_mode=True, sink_size=1)
    return section, notes


def data_order_notes(cfg: RunConfig, samples: int, global_batch: int, spe: int) -> list[str]:
    """MindFormers batches each epoch with drop_remainder; the golden draws rows on across epochs."""
    left = samples - spe * global_batch
    if not left or cfg.total_steps <= spe or cfg.shuffle:
        return []
    return [f"data order: {samples} rows are not a multiple of the global batch {global_batch}; MindFormers drops "
            f"the last {left} rows of every epoch (drop_remainder) where the golden draws them and wraps, so from "
            f"step {spe + 1} the batches differ (tokenize a multiple of {global_batch} rows for the same batches)"]


def dataset_section(cfg: RunConfig, mindrecord: str, batch: Batching, cpu: bool) -> dict:
    """MindDataset over `migrate data tokenize`'s rows of seq_length + 1 tokens; the model slices them.
    (MindSpore refuses more dataset workers than the host has cores.)"""
    loader = {"type": "MindDataset", "dataset_dir": mindrecord, "shuffle": bool(cfg.shuffle)}
    return {"data_loader": loader, "input_columns": ["input_ids"], "num_parallel_workers": 1 if cpu else 8,
            "python_multiprocessing": False, "drop_remainder": True, "batch_size": batch.batch_size,
            "repeat": 1, "numa_enable": False, "prefetch_size": 1,
            "seed": cfg.shuffle_seed if cfg.shuffle_seed is not None else cfg.seed}


def training_notes(cfg: RunConfig) -> list[str]:
    notes = []
    if cfg.shuffle:
        notes.append("sample order: MindFormers' MindDataset shuffle is its own, not the golden's run_order "
                     "(set shuffle: false in run.yaml for file order on both sides)")
    if cfg.eval_interval:
        notes.append("eval_interval/eval_data are not translated (MindFormers' do_eval needs its own metric setup)")
    if cfg.dropout:
        raise MigrateError(f"dropout {cfg.dropout}: MindFormers 2.0.0's LlamaForCausalLM has no dropout")
    return notes
