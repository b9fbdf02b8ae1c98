"""A parallel layout (dp × mp × pp) and the rules a model must meet to use it.

    layout = Layout(dp=2, mp=4, pp=1, micro_batch_size=1, grad_accum_steps=8, world_size=8)
    check(layout, model_config)       # MigrateError naming the first broken rule
    print(layout.batch_line())        # "global batch 16 = micro batch 1 × dp 2 × grad accum 8"

Terms (MindSpore / MindFormers names in brackets):
- dp: data-parallel replicas; each one reads its own slice of every batch.
- mp: tensor (operator-level, "model") parallel width; q/k/v, gate/up, the
  embedding and lm_head are split over their output dimension, o/down over
  their input dimension (Megatron's column / row parallel pairs).
- pp: pipeline stages [pipeline_stages]; each stage owns num_layers / pp
  consecutive decoder layers.
- micro_batches: pipeline micro-batches per step [micro_size of
  mindspore.parallel.nn.Pipeline]; only meaningful with pp > 1.
- micro_batch_size: samples per device per micro-batch (per dp replica).
- grad_accum_steps: further gradient accumulation on top.
- optimizer_shard: shard AdamW states over dp [enable_parallel_optimizer].

Key/value heads under mp: when n_kv_heads % mp == 0 the k/v projections are
split like q. When n_kv_heads < mp and mp % n_kv_heads == 0 (GQA/MQA with a
wide mp), the k/v projections are *replicated* on every mp rank (strategy
((dp, 1), (1, 1))): each rank computes all kv heads and keeps the ones its
query heads use. Requiring mp % n_kv_heads == 0 keeps every rank's query
heads inside whole kv groups, which a later per-group split (strategy
((dp, 1), (n_kv_heads, 1))) also needs. Any other combination is refused.
A fused `qkv_concat` model keeps each kv group's q, k and v rows together in
one w_qkv, so its k/v cannot be replicated apart from q: it needs
n_kv_heads % mp == 0.
"""
from __future__ import annotations

from dataclasses import dataclass

from migrate.errors import MigrateError


@dataclass(frozen=True)
class Layout:
    dp: int = 1
    mp: int = 1
    pp: int = 1
    micro_batches: int = 1
    optimizer_shard: bool = False
    micro_batch_size: int = 1
    grad_accum_steps: int = 1
    world_size: int | None = None  # None: dp × mp × pp

    @property
    def devices(self) -> int:
        return self.world_size if self.world_size is not None else self.dp * self.mp * self.pp

    @property
    def global_batch(self) -> int:
        """Samples per optimizer step over all devices."""
        pipeline = self.micro_batches if self.pp > 1 else 1
        return self.micro_batch_size * self.dp * self.grad_accum_steps * pipeline

    def batch_line(self, seq_length: int | None = None) -> str:
        """One printable line: the global batch and how it is made, for the trainer to print at start."""
        parts = [f"micro batch {self.micro_batch_size}", f"dp {self.dp}"]
        if self.pp > 1:
            parts.append(f"micro-batches {self.micro_batches}")
        parts.append(f"grad accum {self.grad_accum_steps}")
        line = f"global batch {self.global_batch} = " + " × ".join(parts)
        if seq_length:
            line += f" ({self.global_batch * seq_length:,} tokens of {seq_length})"
        return line + f"; layout dp {self.dp} × mp {self.mp} × pp {self.pp} on {self.devices} devices" + (
            ", optimizer sharded over dp" if self.optimizer_shard and self.dp > 1 else "")

    def describe(self) -> str:
        return f"dp{self.dp} mp{self.mp} pp{self.pp}"


def kv_replicated(layout: Layout, config) -> bool:
    """True when the k/v projections are replicated over mp instead of split (n_kv_heads < mp)."""
    return config.n_kv_heads % layout.mp != 0


# More accelerators than any cluster has (the largest training runs use ~10^5): a layout past it is a
# typo, and acting on it forked a process per rank (`train --dp 10**12`) or enumerated layouts for hours.
MAX_DEVICES = 1 << 20


def validate(layout: Layout, config) -> list[str]:
    """Every rule the layout breaks for this model, in a fixed order; empty when it is usable."""
    errors: list[str] = []
    for name in ("dp", "mp", "pp", "micro_batches", "micro_batch_size", "grad_accum_steps"):
        value = getattr(layout, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            errors.append(f"{name} must be a positive integer, got {value!r}")
    if errors:
        return errors
    dp, mp, pp = layout.dp, layout.mp, layout.pp
    if dp * mp * pp > MAX_DEVICES:
        return [f"dp × mp × pp = {dp:,} × {mp:,} × {pp:,} = {dp * mp * pp:,} ranks is more than any cluster "
                f"({MAX_DEVICES:,} at most)"]
    if dp * mp * pp != layout.devices:
        errors.append(f"dp × mp × pp = {dp} × {mp} × {pp} = {dp * mp * pp}, but the world size is {layout.devices}")
    if config.num_layers % pp:
        errors.append(f"num_layers ({config.num_layers}) is not divisible by pp ({pp}): "
                      f"every pipeline stage needs the same number of layers")
    if config.num_heads % mp:
        errors.append(f"num_heads ({config.num_heads}) is not divisible by mp ({mp}): "
                      f"attention heads are split across mp")
    kv = config.n_kv_heads
    if kv % mp and mp % kv:
        errors.append(f"n_kv_heads ({kv}) and mp ({mp}): kv heads are split when n_kv_heads % mp == 0 "
                      f"or replicated when mp % n_kv_heads == 0, and neither holds")
    elif kv % mp and getattr(config, "qkv_concat", False):
        errors.append(f"n_kv_heads ({kv}) is not divisible by mp ({mp}) with qkv_concat: the fused w_qkv "
                      f"keeps each kv group's q, k and v rows together, so k/v cannot be replicated apart "
                      f"from q; use an mp that divides n_kv_heads, or convert without --qkv-concat")
    if config.vocab_size % mp:
        errors.append(f"vocab_size ({config.vocab_size}) is not divisible by mp ({mp}): "
                      f"the embedding and lm_head are split over the vocabulary; pad it with "
                      f"`migrate vocab resize MS_DIR OUT --pad-to-multiple {mp}`")
    if config.intermediate_size % mp:
        errors.append(f"intermediate_size ({config.intermediate_size}) is not divisible by mp ({mp}): "
                      f"gate/up/down projections are split over it")
    if pp > 1 and layout.micro_batches < pp:
        errors.append(f"micro_batches ({layout.micro_batches}) must be >= pp ({pp}) "
                      f"so that every pipeline stage has work")
    if pp == 1 and layout.micro_batches != 1:
        errors.append(f"micro_batches ({layout.micro_batches}) applies only with pp > 1; "
                      f"use grad_accum_steps to accumulate without a pipeline")
    return errors


def check(layout: Layout, config) -> Layout:
    """Raise MigrateError with the first broken rule; return the layout when it is usable."""
    errors = validate(layout, config)
    if errors:
        raise MigrateError(f"parallel layout {layout.describe()}: {errors[0]}")
    return layout
