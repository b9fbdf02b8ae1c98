"""`migrate hparams`: both sides' optimizer, schedule, clipping and accumulation
knobs, read from the live objects, side by side.

    report = hparams_report(cfg)            # faults=[...] injects MindSpore-side faults
    report.rows                             # [HparamRow(knob, golden, mindspore, same, detail)]
    report.first_difference                 # the first row that differs, or None
    report.exit_status                      # 0 identical, 1 a knob differs
    print(format_report(report))

Golden side: the HF model, `build_optimizer` and `build_scheduler` of
golden/train_torch.py. MindSpore side: `building.build_training` on the bundled
model (the objects `migrate train` steps). Where a framework has no attribute
for a knob, it is measured on the live code:

  * bias correction: one step of a fresh optimizer of the same class with the
    group's betas/eps on a single parameter with gradient 1 and lr 1 -- the
    update is 1/(1+eps) with bias correction, (1-b1)/sqrt(1-b2) without;
  * clipping epsilon (golden): torch's clip_grad_norm_ on a float64 gradient of
    norm 1 with max_norm 0.5 gives 0.5 / (1 + eps).

The decayed / not-decayed sets are compared by MindSpore name: each golden
(HF) name is carried through the keymap (tied weights follow the weight they
are tied to). The lr row compares every step and names the first that differs.
"""
from __future__ import annotations

import importlib
import importlib.util
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from migrate.data.samples import META_FILE, check_seq_length
from migrate.models.conversion_plan import ConversionPlan
from migrate.train.building import build_training
from migrate.train.config import RunConfig
from migrate.train.health.watch import HealthWatch
from migrate.train.lora_run import peft_parameter_name

LR_REL = 1e-12


@dataclass
class HparamRow:
    knob: str
    golden: Any
    mindspore: Any
    same: bool
    detail: str = ""


@dataclass
class HparamsReport:
    rows: list[HparamRow]

    @property
    def first_difference(self) -> HparamRow | None:
        return next((r for r in self.rows if not r.same), None)

    @property
    def exit_status(self) -> int:
        return 0 if self.first_difference is None else 1

    def row(self, knob: str) -> HparamRow:
        return next(r for r in self.rows if r.knob == knob)


def load_golden():
    """golden/train_torch.py, installed with the package as `migrate.golden.train_torch`; from a
    checkout on PYTHONPATH (not installed) its golden/ beside migrate/, under the same name."""
    name = "migrate.golden.train_torch"
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name not in ("migrate.golden", name):
            raise
    path = Path(__file__).resolve().parents[2] / "golden" / "train_torch.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look the module up by name
    spec.loader.exec_module(module)
    return module


# ---------- probes ----------
def probe_torch_bias_correction(optimizer) -> bool:
    import torch

    group = optimizer.param_groups[0]
    p = torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))
    probe = type(optimizer)([p], lr=1.0, betas=tuple(group["betas"]), eps=group["eps"], weight_decay=0.0)
    p.grad = torch.ones(1, dtype=torch.float64)
    probe.step()
    return _bias_corrected(-float(p.detach()[0]), group["betas"], group["eps"])


def probe_ms_bias_correction(optimizer) -> bool:
    import mindspore as ms
    import numpy as np

    p = ms.Parameter(ms.Tensor(np.zeros(1, np.float32)), name="probe")
    probe = type(optimizer)([{"params": [p], "weight_decay": 0.0}], lr=1.0, betas=optimizer.betas, eps=optimizer.eps,
                            bias_correction=optimizer.bias_correction)
    probe.step([ms.Tensor(np.ones(1, np.float32))])
    return _bias_corrected(-float(p.asnumpy()[0]), optimizer.betas, optimizer.eps)


def _bias_corrected(update: float, betas, eps: float) -> bool:
    with_bc = 1.0 / (1.0 + eps)
    without = (1 - betas[0]) / (math.sqrt(1 - betas[1]) + eps)
    return abs(update - with_bc) < abs(update - without)


def probe_torch_clip_eps() -> float:
    import torch

    p = torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))
    p.grad = torch.ones(1, dtype=torch.float64)
    torch.nn.utils.clip_grad_norm_([p], 0.5)
    return float(f"{0.5 / float(p.grad[0]) - 1.0:.6g}")


# ---------- the two sides ----------
def golden_knobs(cfg: RunConfig) -> dict:
    # Both reports (hparams_report, mindformers' mf_hparams_report) start here: a seq_length the data
    # was not tokenized with is refused as both trainers refuse it, not reported as agreeing knobs.
    # The knobs need no data: a data folder not tokenized yet (no data.json) is left to the trainers.
    if (cfg.require("data") / META_FILE).is_file():
        check_seq_length(cfg.data, cfg.seq_length)
    golden = load_golden()
    model = golden.build_model(cfg, weights=False)  # on the meta device: names and shapes, no weights
    optimizer = golden.build_optimizer(model, cfg)
    scheduler = golden.build_scheduler(optimizer, cfg)
    scaler = golden.build_scaler(cfg)
    groups = optimizer.param_groups
    decayed = [g for g in groups if g["weight_decay"] != 0]
    lam, base = scheduler.lr_lambdas[0], scheduler.base_lrs[0]
    hf = cfg.hf_schedule()
    knobs = {
        "optimizer": type(optimizer).__module__ + "." + type(optimizer).__name__,
        "betas": tuple(float(b) for b in groups[0]["betas"]),
        "eps": float(groups[0]["eps"]),
        "weight_decay": float(decayed[0]["weight_decay"]) if decayed else 0.0,
        "bias_correction": probe_torch_bias_correction(optimizer),
        "decayed": {n for g in decayed for n in g["param_names"]},
        "not_decayed": {n for g in groups if g["weight_decay"] == 0 for n in g["param_names"]},
        "clip_max_norm": cfg.max_grad_norm or None,
        "clip_eps": probe_torch_clip_eps(),
        "grad_accum_steps": cfg.grad_accum_steps,
        # golden/train_torch.py: `scaled = loss / cfg.grad_accum_steps` before backward
        "loss_divisor": cfg.grad_accum_steps,
        # backward adds each micro-batch's gradient into p.grad, in the parameter's (fp32 master) dtype
        "grad_accum_dtype": str(next(p for p in model.parameters() if p.requires_grad).dtype).removeprefix("torch."),
        "schedule": hf.name,
        "num_warmup_steps": hf.num_warmup_steps,
        "num_training_steps": hf.num_training_steps,
        "lr": [float(base * lam(s)) for s in range(cfg.total_steps)],
        "health": golden.build_health_watch(cfg).describe(),
    }
    if scaler is not None:
        knobs["loss_scale"] = (scaler.get_scale(), scaler.get_growth_factor(), scaler.get_backoff_factor(),
                               scaler.get_growth_interval())
    if cfg.lora is not None:
        knobs["lora"] = golden.lora_facts(model, fingerprint=False)
    return knobs


AS_BACKWARD = "as the backward gives them"


def gradient_seam(training) -> str:
    """What the MindSpore micro-step does to each gradient before accumulating it, read from its live
    factors (`MicroStep.grad_factors`; a fault's, never a real run's)."""
    factors = training.micro.grad_factors
    if factors is None:
        return AS_BACKWARD
    names = [p.name for p in training.optimizer.parameters]
    scaled = [f"{n} x {float(f.asnumpy()):g}" for n, f in zip(names, factors, strict=True) if float(f.asnumpy()) != 1.0]
    return ", ".join(scaled) or AS_BACKWARD


def ms_knobs(cfg: RunConfig, faults=(), trust: bool = False) -> tuple[dict, Any]:
    from mindspore.nn.utils import no_init_parameters

    with no_init_parameters():  # parameters and AdamW moments keep their shapes, no data: a 70B fits
        training = build_training(cfg, faults, weights=False, trust=trust)
    opt = training.optimizer
    groups = opt.param_groups
    decayed = [g for g in groups if g["weight_decay"] != 0]
    sched = training.schedule
    knobs = {
        "optimizer": type(opt).__module__ + "." + type(opt).__name__,
        "betas": tuple(float(b) for b in opt.betas),
        "eps": float(opt.eps),
        "weight_decay": float(decayed[0]["weight_decay"]) if decayed else 0.0,
        "bias_correction": probe_ms_bias_correction(opt),
        "decayed": {n for g in decayed for n in g["names"]},
        "not_decayed": {n for g in groups if g["weight_decay"] == 0 for n in g["names"]},
        "clip_max_norm": training.clipper.max_norm,
        "clip_eps": training.clipper.eps,
        "grad_accum_steps": cfg.grad_accum_steps,
        "loss_divisor": training.loss_divisor,
        "grad_accum_dtype": training.micro.accum_dtype,
        "schedule": sched.name,
        "num_warmup_steps": sched.num_warmup_steps,
        "num_training_steps": sched.num_training_steps,
        "lr": sched.table(cfg.total_steps),
        "health": HealthWatch.for_run(cfg).describe(),
        "gradients": gradient_seam(training),
    }
    if training.scaler is not None:
        s = training.scaler
        knobs["loss_scale"] = (s.scale, s.growth_factor, s.backoff_factor, s.growth_interval)
    if training.lora is not None:
        knobs["lora"] = training.lora.record(training.model)
    return knobs, training


def _to_ms_names(hf_names: set[str], plan: ConversionPlan, adapters: dict[str, str] | None = None) -> dict[str, str]:
    """MindSpore name -> the HF names it is made of, for the MindSpore parameters whose
    HF sources all lie in `hf_names` (a fused parameter needs every one of them); HF
    names no MindSpore parameter covers map from an `<unpaired ...>` marker. `adapters`:
    PEFT's name -> MindSpore's, for a LoRA run's adapters."""
    sources = {**plan.sources, **{ms: (peft,) for peft, ms in (adapters or {}).items()}}
    out = {ms: ", ".join(hf) for ms, hf in sources.items() if all(n in hf_names for n in hf)}
    # A tied HF head has no MindSpore parameter of its own: the embedding carries it.
    covered = {n for hf in sources.values() for n in hf} | {pair.src for pair in plan.tied}
    out.update({f"<unpaired {n}>": n for n in hf_names if n not in covered})
    return out


def _set_row(knob: str, golden_hf: set[str], ms_names: set[str], plan: ConversionPlan,
             adapters: dict[str, str] | None = None) -> HparamRow:
    hf_of = _to_ms_names(golden_hf, plan, adapters)
    golden_ms = set(hf_of)
    only_ms, only_golden = sorted(ms_names - golden_ms), sorted(golden_ms - ms_names)
    detail = []
    if only_ms:
        detail.append(f"only MindSpore ({_kinds(only_ms)}): " + ", ".join(only_ms[:4])
                      + (" ..." if len(only_ms) > 4 else ""))
    if only_golden:
        detail.append(f"only golden ({_kinds(only_golden)}): "
                      + ", ".join(f"{n} ({hf_of.get(n, '?')})" for n in only_golden[:4])
                      + (" ..." if len(only_golden) > 4 else ""))
    return HparamRow(knob, f"{len(golden_ms)} parameters", f"{len(ms_names)} parameters",
                     not only_ms and not only_golden, "; ".join(detail))


def _kinds(names: list[str]) -> str:
    """'14 bias, 5 norm weight' style summary of parameter names."""
    kinds: dict[str, int] = {}
    for name in names:
        kind = "bias" if name.endswith("bias") else "norm weight" if "norm" in name else "weight"
        kinds[kind] = kinds.get(kind, 0) + 1
    return ", ".join(f"{n} {k}" for k, n in kinds.items())


def _lr_row(golden: list[float], ms: list[float]) -> HparamRow:
    if len(golden) != len(ms):
        return HparamRow("lr", f"{len(golden)} steps", f"{len(ms)} steps", False, "schedules of different length")
    for i, (g, m) in enumerate(zip(golden, ms, strict=True)):
        if abs(g - m) > LR_REL * max(abs(g), abs(m), 1e-300):
            return HparamRow("lr", g, m, False, f"first differs at optimizer step {i + 1}")
    return HparamRow("lr", f"{len(golden)} steps", f"{len(ms)} steps", True,
                     f"identical to {LR_REL:g} relative at every step")


def hparams_report(cfg: RunConfig, faults=(), *, trust: bool = False) -> HparamsReport:
    """Both sides' knobs from the live objects; `faults` are injected on the MindSpore side; `trust`:
    ms_model's class may be imported even if migrate does not bundle it (`--trust-model-class`)."""
    g = golden_knobs(cfg)
    m, training = ms_knobs(cfg, faults, trust)
    rows = [HparamRow("optimizer", g["optimizer"], m["optimizer"], True, "torch semantics on both sides")]
    for knob in ("betas", "eps", "weight_decay", "bias_correction"):
        rows.append(HparamRow(knob, g[knob], m[knob], g[knob] == m[knob]))
    pairing = training.plan  # MindSpore name <- HF names: the run's plan, resolved once
    adapters = lora_names(training.lora)
    rows.append(_set_row("decayed_parameters", g["decayed"], m["decayed"], pairing, adapters))
    rows.append(_set_row("not_decayed_parameters", g["not_decayed"], m["not_decayed"], pairing, adapters))
    rows.append(HparamRow("clip_max_norm", g["clip_max_norm"], m["clip_max_norm"],
                          g["clip_max_norm"] == m["clip_max_norm"]))
    rows.append(HparamRow("clip_eps", g["clip_eps"], m["clip_eps"], math.isclose(g["clip_eps"], m["clip_eps"],
                                                                                 rel_tol=1e-3, abs_tol=1e-12),
                          "coefficient = max_norm / (total_norm + eps)"))
    rows.append(HparamRow("grad_accum_steps", g["grad_accum_steps"], m["grad_accum_steps"],
                          g["grad_accum_steps"] == m["grad_accum_steps"]))
    rows.append(HparamRow("loss_divisor", g["loss_divisor"], m["loss_divisor"], g["loss_divisor"] == m["loss_divisor"],
                          "each micro-batch loss is divided by this before backward"))
    rows.append(HparamRow("grad_accum_dtype", g["grad_accum_dtype"], m["grad_accum_dtype"],
                          g["grad_accum_dtype"] == m["grad_accum_dtype"],
                          "the dtype each micro-batch's gradient is added in"))
    rows.append(HparamRow("gradients", AS_BACKWARD, m["gradients"], m["gradients"] == AS_BACKWARD,
                          "what the micro-step does to the gradients the backward hands it"))
    if "loss_scale" in g or "loss_scale" in m:
        rows.append(HparamRow("loss_scale", g.get("loss_scale"), m.get("loss_scale"),
                              g.get("loss_scale") == m.get("loss_scale"),
                              "(init_scale, growth_factor, backoff_factor, growth_interval)"))
    for knob in ("schedule", "num_warmup_steps", "num_training_steps"):
        rows.append(HparamRow(knob, g[knob], m[knob], g[knob] == m[knob]))
    rows.append(_lr_row(g["lr"], m["lr"]))
    rows.append(HparamRow("health", g["health"]["policy"], m["health"]["policy"], g["health"] == m["health"],
                          "health watch policy; every threshold compared too"))
    if "lora" in g or "lora" in m:
        rows += _lora_rows(g.get("lora") or {}, m.get("lora") or {})
    return HparamsReport(rows)


def lora_names(run) -> dict[str, str]:
    """PEFT's live name -> MindSpore's, for every adapter of a LoRA run (empty for full training)."""
    if run is None:
        return {}
    return {peft_parameter_name(s.hf_module, which): name
            for s in run.sites for which, name in zip("AB", s.ms_names, strict=True)}


def _lora_rows(g: dict, m: dict) -> list[HparamRow]:
    """One row per adapter knob (the trainable set is in the decay rows, by name)."""
    rows = []
    for key in ("rank", "alpha", "scaling", "dropout", "use_rslora", "use_dora", "trainable_numel"):
        rows.append(HparamRow(f"lora.{key}", g.get(key), m.get(key), g.get(key) == m.get(key)))
    gt, mt = g.get("target_modules") or [], m.get("target_modules") or []
    only = sorted(set(gt) ^ set(mt))
    rows.append(HparamRow("lora.target_modules", f"{len(gt)} modules", f"{len(mt)} modules", not only,
                          f"on one side only: {', '.join(only[:4])}" if only else "HF module names"))
    return rows


def format_report(report: HparamsReport) -> str:
    """Plain-text table, one knob a line, then the verdict."""
    table = [("knob", "golden (torch)", "mindspore", "")]
    for r in report.rows:
        table.append((r.knob, _short(r.golden), _short(r.mindspore), ("ok" if r.same else "DIFFERS")
                      + (f"  {r.detail}" if r.detail else "")))
    widths = [max(len(row[i]) for row in table) for i in range(3)]
    lines = ["  ".join(row[i].ljust(widths[i]) for i in range(3)) + "  " + row[3] for row in table]
    first = report.first_difference
    lines.append("all knobs agree" if first is None else f"first difference: {first.knob}")
    return "\n".join(line.rstrip() for line in lines)


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)
