"""Memory and parallel-layout planner for the bundled Llama.

    result = plan(config, devices=8, device_memory_bytes=64 * GiB, seq_length=4096, global_batch=512)
    print_plan(result)                     # rich table: ranked layouts that fit, rejected ones with reasons
    estimate_memory(config, Layout(...), seq_length, dtype, recompute)   # one layout, per-device breakdown
    measure_peak(config, micro_batch, seq_length)    # real CPU training steps in a subprocess: peak RSS growth

Per-device memory = weights + gradients + optimizer states (+ update
workspace) + saved activations of the micro-batches in flight + the loss
block (last stage) + one layer's working set + a fixed overhead, taken on the
pipeline stage that needs most. Every term is listed in ASSUMPTIONS (printed
under the table); the CPU profile's extra terms are explained where defined.

Activations follow Korthikanti et al. 2022 ("Reducing Activation Recomputation
in Large Transformer Models"): per layer and micro-batch, bytes =
sbh·(34 + 5as/h) for GPT with fp16 activations and dropout, of which the
tensor-parallel region divides by mp and selective recompute drops the
attention-score term. Adapted to this model (no dropout, RMSNorm, SwiGLU,
fp32 softmax, GQA with materialised repeat_kv), with e = activation bytes:

  replicated over mp  2·(4 + e)·sbh   two RMSNorms: fp32 copy of the input + normalised tensor
                      + 2e·sbh        inputs of q/k/v and of gate/up (the norms' outputs)
  split over mp       4e·sbh          q, k, v (k and v after repeat_kv: full width), input of wo
                      + 4e·sbi        SwiGLU: gate out (SiLU input), SiLU out, up out, down input
                      + c·a·s²·b      attention probabilities: fp32 softmax output (c = 4), plus their
                                      cast to the activation dtype for probs·v when e < 4 (c = 4 + e)

Selective recompute drops the c·a·s²·b term; full recompute keeps only each
layer's input (e·sbh) and rebuilds one layer at a time.
"""
from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field

from migrate.dtype_names import PRECISIONS, SPELLINGS
from migrate.errors import MigrateError
from migrate.models.registry import family_of
from migrate.parallel.layout import MAX_DEVICES, Layout, kv_replicated, validate

KiB, MiB, GiB = 2 ** 10, 2 ** 20, 2 ** 30
DTYPE_BYTES = {spelling: PRECISIONS[name].bytes for spelling, name in SPELLINGS.items()}
RECOMPUTE = ("none", "selective", "full")


@dataclass(frozen=True)
class MemoryProfile:
    """How a backend stores a training step. DEVICE: Ascend/GPU; CPU_PYNATIVE: MindSpore CPU, measured here."""

    name: str
    weight_copies: int = 1            # copies of each weight a device holds
    extra_state_bytes: int = 0        # optimizer bytes per parameter beyond master + two moments
    update_workspace_bytes: int = 0   # bytes per parameter the optimizer update keeps live
    activation_bytes: int | None = None  # bytes per activation element; None: those of the training dtype
    score_copies: int | None = None   # fp32 (b, a, s, s) tensors per layer; None: the device rule above
    loss_fp32_copies: int | None = None  # fp32 (tokens, vocab) tensors of the loss; None: e-logits + 3 fp32
    overhead_bytes: int = 2 * GiB     # runtime, communication buffers, kernel workspace
    notes: tuple[str, ...] = ()


DEVICE = MemoryProfile(
    "device",
    notes=("fixed overhead 2 GiB per device: runtime, HCCL/NCCL buffers, kernel workspace",),
)

# MindSpore 2.10 on CPU, PyNative, fp32: what `measure_peak` runs. Each extra
# term is a property of that stack, found by reading its source or by a
# measurement of that term alone (not by fitting the total):
CPU_PYNATIVE = MemoryProfile(
    "cpu-pynative",
    # A Parameter keeps the host array it was built from and gets a separate
    # device copy on first use (RSS +3.8 B/param at the first forward).
    weight_copies=2,
    # The bundled model carries activations in fp32 on CPU, whatever the dtype (bf16/fp16 are emulated).
    activation_bytes=4,
    # mindspore.experimental.optim.AdamW clones max_exp_avg_sq even with amsgrad=False.
    extra_state_bytes=4,
    # The AdamW update is a jit graph (hyper_map of _run_adamw_opt) with 12
    # full-size fp32 intermediates per parameter (param·wd, m·β1, g·(1-β1),
    # their sum, v·β2, addcmul, sqrt, /bc2, +eps, m/denom, ·step, param-…);
    # the CPU graph executor keeps a compiled graph's buffers between launches.
    update_workspace_bytes=12 * 4,
    # PyNative keeps what each op's bprop reads: Mul keeps both inputs, so the
    # raw q·kᵀ scores (kept by the ·scaling Mul) join the softmax output. (One
    # decoder layer's fwd+bwd alone measured 2 to 4 score-sized fp32 tensors,
    # growing with s; 2 is the count this rule gives.)
    score_copies=2,
    # Linear + ops.cross_entropy (log_softmax as x - logsumexp, nll via gather_d)
    # through value_and_grad peaks at 14.0 fp32 (tokens × vocab) tensors,
    # measured alone at vocab 4000 and 16000 (4 forward, the rest gradients).
    loss_fp32_copies=14,
    # Growth of the same measured step on a 10k-parameter model (62 MiB):
    # kernel libraries, thread pools, the optimizer's compiled graph.
    overhead_bytes=64 * MiB,
    notes=("CPU profile: MindSpore 2.10 PyNative fp32 (host + device weight copies, AdamW's max_exp_avg_sq "
           "and 12-buffer update graph, q·kᵀ scores kept, 14 fp32 logit-sized loss tensors, 64 MiB runtime)",
           "CPU profile adds the update buffers to the activations (no reuse credited): an upper bound; "
           "MindSpore's pool was measured to hand 23-50% of freed activation memory to the update",),
)


ASSUMPTIONS = (
    "weights, grads, AdamW: bf16/fp16 = 2 weight + 2 grad + 4 fp32 master + 4 + 4 moments = 16 B/param; "
    "fp32 = 4 + 4 + 4 + 4 = 16 B/param; optimizer sharding divides master and moments by dp",
    "gradients kept whole (accumulated in place; no gradient sharding)",
    "mp splits q/k/v/o, gate/up/down, embedding and lm_head; norms replicated; kv projections replicated "
    "when n_kv_heads < mp",
    "activations per layer (Korthikanti et al. 2022 adapted: no dropout, RMSNorm, SwiGLU, fp32 softmax, "
    "repeat_kv materialised): 2(4+e)sbh + 2e·sbh replicated, (4e·sbh + 4e·sbi + c·as²b)/mp split, "
    "e = activation bytes, c = 4 (+e when e < 4); selective recompute drops c·as²b; "
    "full recompute keeps e·sbh per layer",
    "working set during backward: one layer's activations (its gradients, or the layer being rebuilt)",
    "loss on the last stage: logits in the activation dtype + 3 fp32 (tokens × vocab/mp) tensors",
    "1F1B pipeline: stage k holds min(pp − k, micro-batches) micro-batches of activations; "
    "embedding on stage 0, final norm + lm_head on the last; a tied embedding is stored on both",
    "memory is that of the fullest pipeline stage",
)
RANKING = "ranked by: least recompute, then smallest mp, then smallest pp, then largest micro batch, then least memory"


# ---------------------------------------------------------------- parameters
def total_params(config) -> int:
    return family_of(config).parameter_count(config)


def stage_params(config, layout: Layout) -> list[int]:
    """Parameters one device of each pipeline stage holds (the family's anatomy, placed)."""
    mp, pp = layout.mp, layout.pp
    anatomy = family_of(config).anatomy_of(config)
    layer = anatomy.layer.per_device(mp, kv_replicated(layout, config))
    emb = anatomy.embedding // mp
    layers = anatomy.num_layers // pp
    stages = []
    for k in range(pp):
        n = layers * layer
        if k == 0:
            n += emb
        if k == pp - 1:
            n += anatomy.final_norm
            if not anatomy.tied or pp > 1:
                n += emb  # lm_head, or the tied table's copy on the last stage
        stages.append(n)
    return stages


# ---------------------------------------------------------------- activations
def _activation_bytes(dtype: str, profile: MemoryProfile) -> int:
    return profile.activation_bytes or DTYPE_BYTES[dtype]


def layer_activation_bytes(config, seq_length: int, micro_batch: int, mp: int, dtype: str,
                           recompute: str, profile: MemoryProfile = DEVICE) -> int:
    """Saved activations of one decoder layer for one micro-batch on one device."""
    e = _activation_bytes(dtype, profile)
    s, b, h, a, i = seq_length, micro_batch, config.hidden_size, config.num_heads, config.intermediate_size
    sbh, sbi = s * b * h, s * b * i
    if recompute == "full":
        return e * sbh
    replicated = 2 * (4 + e) * sbh + 2 * e * sbh
    split = 4 * e * sbh + 4 * e * sbi
    if recompute == "selective":
        return replicated + split // mp
    c = 4 * profile.score_copies if profile.score_copies is not None else (4 if e == 4 else 4 + e)
    return replicated + (split + c * a * s * s * b) // mp


def loss_block_bytes(config, seq_length: int, micro_batch: int, mp: int, dtype: str,
                     profile: MemoryProfile = DEVICE) -> int:
    """Final norm, lm_head input and the loss over the vocabulary, for one micro-batch (last stage)."""
    e = _activation_bytes(dtype, profile)
    tokens = seq_length * micro_batch
    norm_and_input = (4 + e) * tokens * config.hidden_size + e * tokens * config.hidden_size
    per_logit = 4 * profile.loss_fp32_copies if profile.loss_fp32_copies is not None else e + 3 * 4
    return norm_and_input + per_logit * tokens * config.vocab_size // mp


# ---------------------------------------------------------------- estimate
@dataclass(frozen=True)
class MemoryEstimate:
    """Per-device bytes on the fullest pipeline stage."""

    stage: int
    params: int            # parameters held by one device of that stage
    weights: int
    grads: int
    optimizer: int         # master + moments (+ profile extras), after sharding
    workspace: int         # optimizer update buffers (CPU profile)
    activations: int       # saved layer activations of all in-flight micro-batches
    loss: int              # loss block (last stage only)
    working: int           # one layer's activations during backward
    overhead: int

    @property
    def states(self) -> int:
        return self.weights + self.grads + self.optimizer + self.workspace

    @property
    def total(self) -> int:
        return self.states + self.activations + self.loss + self.working + self.overhead


def state_bytes_per_param(dtype: str, dp: int, optimizer_shard: bool,
                          profile: MemoryProfile = DEVICE) -> tuple[float, float, float]:
    """(weight, grad, optimizer) bytes per parameter: the 16 B/param rule, optimizer part / dp when sharded."""
    if dtype not in DTYPE_BYTES:
        raise MigrateError(f"unknown dtype {dtype!r}; use fp32, bf16 or fp16")
    w = DTYPE_BYTES[dtype]
    master = 4 if w != 4 else 0  # fp32 training: the weight is the master copy
    optimizer = master + 4 + 4 + profile.extra_state_bytes
    if optimizer_shard and dp > 1:
        optimizer = optimizer / dp
    return float(w * profile.weight_copies), float(w), float(optimizer)


def estimate_memory(config, layout: Layout, seq_length: int, dtype: str = "bf16", recompute: str = "none",
                    profile: MemoryProfile = DEVICE) -> MemoryEstimate:
    if recompute not in RECOMPUTE:
        raise MigrateError(f"unknown recompute {recompute!r}; use one of: {', '.join(RECOMPUTE)}")
    w, g, o = state_bytes_per_param(dtype, layout.dp, layout.optimizer_shard, profile)
    per_layer = layer_activation_bytes(config, seq_length, layout.micro_batch_size, layout.mp, dtype,
                                       recompute, profile)
    working = layer_activation_bytes(config, seq_length, layout.micro_batch_size, layout.mp, dtype, "none", profile)
    layers = config.num_layers // layout.pp
    best = None
    for k, n in enumerate(stage_params(config, layout)):
        in_flight = min(layout.pp - k, layout.micro_batches) if layout.pp > 1 else 1
        est = MemoryEstimate(
            stage=k, params=n,
            weights=int(n * w), grads=int(n * g), optimizer=int(n * o),
            workspace=n * profile.update_workspace_bytes,
            activations=per_layer * layers * in_flight,
            loss=loss_block_bytes(config, seq_length, layout.micro_batch_size, layout.mp, dtype, profile)
            if k == layout.pp - 1 else 0,
            working=working,
            overhead=profile.overhead_bytes,
        )
        if best is None or est.total > best.total:
            best = est
    return best


# ---------------------------------------------------------------- enumeration
@dataclass(frozen=True)
class Candidate:
    layout: Layout
    recompute: str
    memory: MemoryEstimate | None = None
    reason: str | None = None  # why rejected; None when it fits

    @property
    def fits(self) -> bool:
        return self.reason is None

    def label(self) -> str:
        lay = self.layout
        return f"dp{lay.dp} mp{lay.mp} pp{lay.pp} mb{lay.micro_batch_size} {self.recompute}"


@dataclass
class PlanResult:
    config: object
    devices: int
    device_memory_bytes: int
    seq_length: int
    global_batch: int
    dtype: str
    optimizer_shard: bool
    profile: MemoryProfile
    valid: list[Candidate] = field(default_factory=list)      # fitting, ranked best first
    rejected: list[Candidate] = field(default_factory=list)   # with reasons, in enumeration order

    @property
    def best(self) -> Candidate | None:
        return self.valid[0] if self.valid else None

    @property
    def assumptions(self) -> list[str]:
        return list(ASSUMPTIONS) + list(self.profile.notes) + [RANKING]


def _divisors(n: int) -> list[int]:
    """n's divisors in increasing order, in O(sqrt n)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


def plan(config, devices: int, device_memory_bytes: int, seq_length: int, global_batch: int,
         dtype: str = "bf16", micro_batch_sizes: Iterable[int] = (1, 2, 4, 8), optimizer_shard: bool = True,
         recompute: Iterable[str] = RECOMPUTE, profile: MemoryProfile = DEVICE, estimate=None) -> PlanResult:
    """Every (dp, mp, pp, micro batch, recompute) with dp·mp·pp = devices: validated, estimated, ranked.

    With pp > 1 the per-replica batch runs as pipeline micro-batches
    (grad_accum_steps 1); with pp == 1 as gradient accumulation. `estimate`: the per-layout
    estimator (default `estimate_memory`; `migrate.lora.memory.lora_estimate` for a LoRA run).
    """
    if dtype not in DTYPE_BYTES:
        raise MigrateError(f"unknown dtype {dtype!r}; use fp32, bf16 or fp16")
    if devices < 1 or global_batch < 1 or seq_length < 1:
        raise MigrateError("devices, global_batch and seq_length must be >= 1")
    if devices > MAX_DEVICES:
        raise MigrateError(f"--devices {devices:,} is more than any cluster ({MAX_DEVICES:,} at most)")
    result = PlanResult(config, devices, device_memory_bytes, seq_length, global_batch, dtype,
                        optimizer_shard, profile)
    order = {name: i for i, name in enumerate(RECOMPUTE)}
    for dp in _divisors(devices):
        for mp in _divisors(devices // dp):
            pp = devices // (dp * mp)
            for mbs in micro_batch_sizes:
                for rc in recompute:
                    per_step = dp * mbs
                    if global_batch % per_step:
                        lay = Layout(dp, mp, pp, 1, optimizer_shard, mbs, 1, devices)
                        result.rejected.append(Candidate(lay, rc, reason=(
                            f"global batch {global_batch} is not divisible by micro batch × dp = "
                            f"{mbs} × {dp} = {per_step}")))
                        continue
                    steps = global_batch // per_step
                    micro, accum = (steps, 1) if pp > 1 else (1, steps)
                    lay = Layout(dp, mp, pp, micro, optimizer_shard, mbs, accum, devices)
                    errors = validate(lay, config)
                    if errors:
                        result.rejected.append(Candidate(lay, rc, reason=errors[0]))
                        continue
                    mem = (estimate or estimate_memory)(config, lay, seq_length, dtype, rc, profile)
                    if mem.total > device_memory_bytes:
                        result.rejected.append(Candidate(lay, rc, mem, reason=(
                            f"needs {mem.total / GiB:.1f} GiB > {device_memory_bytes / GiB:.1f} GiB "
                            f"(stage {mem.stage}: states {mem.states / GiB:.1f}, "
                            f"activations {(mem.activations + mem.working + mem.loss) / GiB:.1f})")))
                        continue
                    result.valid.append(Candidate(lay, rc, mem))
    result.valid.sort(key=lambda c: (order[c.recompute], c.layout.mp, c.layout.pp,
                                     -c.layout.micro_batch_size, c.memory.total))
    # Rule violations first, then memory misses from the closest.
    result.rejected.sort(key=lambda c: (c.memory is not None, c.memory.total if c.memory else 0))
    return result


# ---------------------------------------------------------------- printing
def _gib(n: int) -> str:
    return f"{n / GiB:.1f}"


def plan_table(result: PlanResult, max_rows: int = 20):
    from rich.table import Table

    cfg = result.config
    title = (f"{total_params(cfg) / 1e9:.2f}B params · {result.devices} devices × "
             f"{result.device_memory_bytes / GiB:.0f} GiB · seq {result.seq_length} · global batch "
             f"{result.global_batch} · {result.dtype} · optimizer sharding "
             f"{'on' if result.optimizer_shard else 'off'} · profile {result.profile.name}")
    table = Table(title=title, title_justify="left")
    for col in ("#", "dp", "mp", "pp", "micro batch", "micro-batches", "grad accum", "recompute",
                "weights+grads+opt GiB", "activations GiB", "loss GiB", "total GiB", "headroom GiB"):
        table.add_column(col, justify="right" if col not in ("recompute",) else "left")
    for n, cand in enumerate(result.valid[:max_rows], 1):
        lay, mem = cand.layout, cand.memory
        table.add_row(str(n), str(lay.dp), str(lay.mp), str(lay.pp), str(lay.micro_batch_size),
                      str(lay.micro_batches), str(lay.grad_accum_steps), cand.recompute, _gib(mem.states),
                      _gib(mem.activations + mem.working), _gib(mem.loss), _gib(mem.total),
                      _gib(result.device_memory_bytes - mem.total))
    return table


def rejected_table(result: PlanResult, max_rows: int = 20):
    from rich.table import Table

    table = Table(title=f"rejected: {len(result.rejected)} of {len(result.rejected) + len(result.valid)} "
                        f"(rule violations first, then the closest memory misses)",
                  title_justify="left")
    table.add_column("layout")
    table.add_column("reason")
    for cand in result.rejected[:max_rows]:
        table.add_row(cand.label(), cand.reason)
    if len(result.rejected) > max_rows:
        table.add_row("…", f"{len(result.rejected) - max_rows} more (PlanResult.rejected)")
    return table


def print_plan(result: PlanResult, console=None, max_rows: int = 20, show_rejected: int = 12) -> None:
    from rich.console import Console

    console = console or Console()
    if result.valid:
        console.print(plan_table(result, max_rows))
        if len(result.valid) > max_rows:
            console.print(f"… {len(result.valid) - max_rows} more layouts fit")
        best = result.best
        console.print("best: " + best.layout.batch_line(result.seq_length) + f", recompute {best.recompute}")
    else:
        console.print(f"[bold red]no layout fits[/] {result.devices} devices × "
                      f"{result.device_memory_bytes / GiB:.0f} GiB")
    if show_rejected:
        console.print(rejected_table(result, show_rejected))
    console.print("assumptions:")
    for line in result.assumptions:
        console.print(f"  · {line}", soft_wrap=True)


# ---------------------------------------------------------------- measurement
def measure_peak_details(config, micro_batch: int, seq_length: int, steps: int = 2, mode: str = "pynative",
                         timeout: float = 600) -> dict:
    """Run `steps` real training steps (bundled model, experimental AdamW, value_and_grad, fp32, CPU)
    in a fresh interpreter; return its baseline RSS after imports, peak RSS and growth, in bytes."""
    data = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    data["compute_dtype"] = "float32"
    arg = json.dumps({"config": data, "micro_batch": micro_batch, "seq_length": seq_length,
                      "steps": steps, "mode": mode})
    # The child quiets MindSpore's log itself (GLOG_v, in its entry point); it inherits the rest.
    proc = subprocess.run([sys.executable, "-m", "migrate.memory_plan_measure", arg], capture_output=True, text=True,
                          timeout=timeout)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        tail = " ".join(proc.stderr.strip().splitlines()[-3:])[:300]
        raise MigrateError(f"measuring peak memory failed (exit {proc.returncode}): {tail}")
    return json.loads(lines[-1])


def measure_peak(config, micro_batch: int, seq_length: int, steps: int = 2, mode: str = "pynative") -> int:
    """Peak RSS growth in bytes over the post-import baseline of `steps` CPU fp32 training steps."""
    return int(measure_peak_details(config, micro_batch, seq_length, steps, mode)["growth"])


def cpu_estimate(config, micro_batch: int, seq_length: int) -> MemoryEstimate:
    """The planner's estimate for what `measure_peak` runs: fp32, dp = mp = pp = 1, no recompute, CPU profile."""
    layout = Layout(micro_batch_size=micro_batch)
    return estimate_memory(config, layout, seq_length, "fp32", "none", CPU_PYNATIVE)


__all__ = [
    "ASSUMPTIONS", "CPU_PYNATIVE", "DEVICE", "GiB", "MiB", "Candidate", "MemoryEstimate", "MemoryProfile",
    "PlanResult", "cpu_estimate", "estimate_memory", "layer_activation_bytes", "loss_block_bytes",
    "measure_peak", "measure_peak_details", "plan", "plan_table", "print_plan", "rejected_table",
    "stage_params", "state_bytes_per_param", "total_params",
]
