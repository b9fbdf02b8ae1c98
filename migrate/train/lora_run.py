"""LoRA in a MindSpore training run: adapters on the converted model, the base frozen.

    run = attach_for_training(model, plan, cfg)   # after the model is built
    groups = lora_param_groups(run, cfg, decay_rule)              # AdamW over the adapters alone
    run.record(model)                                             # effective_hparams.json's "lora"

The base weights get `requires_grad = False`, so the micro-step differentiates, and AdamW keeps
moments for, the adapters alone. Which adapters decay follows HF Trainer's rule on the names
PEFT gives them (`...q_proj.lora_A.default.weight`: none is a bias or a norm), so both sides
agree by construction. The adapters start from `migrate.lora.targets.initial_adapter`, the
bits golden/train_torch.py loads into PEFT's.

A LoRA run's checkpoints hold the adapters (adapter.ckpt, MindSpore names) and lora.json (the
spec, the adapted HF modules, and the base: the converted folder and its fingerprint) instead
of the whole model: the base is the run's `ms_model`, checked against the fingerprint on resume.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from migrate.errors import MigrateError
from migrate.lora.cells import adapter_parameters, attach_lora, lora_kernels
from migrate.lora.record import adapter_record
from migrate.lora.spec import LoraSpec
from migrate.lora.targets import Site, base_fingerprint, hf_weights_of, initial_adapter, resolve_targets
from migrate.models.conversion_plan import ConversionPlan
from migrate.train.config import RunConfig
from migrate.train.decay import hf_name_decays

PEFT_ADAPTER_NAME = "default"  # what PEFT calls the one adapter of get_peft_model


@dataclass
class LoraRun:
    spec: LoraSpec                 # as the run builds it (a fault may change it)
    sites: list[Site]
    base_sha256: str | None        # None when the model was built without weights (`migrate hparams`)
    keymap: str

    def parameters(self, model) -> list:
        return adapter_parameters(model)

    def record(self, model) -> dict:
        """What the live adapters do, with the keys golden/train_torch.py records from PEFT's."""
        kernels = lora_kernels(model)
        params = self.parameters(model)
        first = kernels[0][1]
        return {"rank": first.rank, "alpha": float(self.spec.alpha), "scaling": first.scaling,
                "dropout": first.dropout, "use_rslora": self.spec.use_rslora, "use_dora": False,
                "target_modules": sorted(m for _, k in kernels for m in k.hf_modules),
                "trainable_tensors": len(params),
                "trainable_numel": int(sum(int(p.size) for p in params)),
                "base_sha256": self.base_sha256}

    def checkpoint_record(self, ms_model) -> dict:
        """lora.json: enough to read the adapters back onto their base."""
        return adapter_record(self.spec, self.sites, self.keymap, ms_model, self.base_sha256)


def peft_parameter_name(hf_module: str, which: str) -> str:
    """The name PEFT's live model gives an adapter weight (adapter name included)."""
    return f"base_model.model.{hf_module}.lora_{which}.{PEFT_ADAPTER_NAME}.weight"


def attach_for_training(model, plan: ConversionPlan, cfg: RunConfig, weights: bool = True) -> LoraRun:
    """Freeze the base, add the run's adapters (from their shared initial bits), fingerprint the base.
    plan: the run's conversion plan (`building.resolve_plan`), which places the adapters."""
    spec = cfg.lora
    sites = resolve_targets(spec, plan)
    params = {p.name: p for p in model.get_parameters()}
    base = None
    if weights:
        base = base_fingerprint(hf_weights_of(sites, lambda name: params[name].asnumpy(), plan.fields))
    for p in params.values():
        p.requires_grad = False
    adapters = {s.hf_module: initial_adapter(s.hf_module, s.in_features, s.out_features, spec.rank, cfg.seed)
                for s in sites}
    attach_lora(model, sites, spec, adapters, plan.fields)
    model.set_train(model.training)  # the new kernels take the model's mode (dropout while training)
    if cfg.recompute:
        for layer in model.model.layers:
            layer.recompute()  # again: Cell.recompute marks the cells below it at the time of the call
    return LoraRun(spec, sites, base, plan.keymap.name)


def lora_param_groups(model, run: LoraRun, cfg: RunConfig, decay_rule: str = "hf") -> list[dict]:
    """[decayed, not decayed] adapters: HF Trainer's rule on PEFT's names ("mindspore": its default filter)."""
    groups: list[dict] = [{"params": [], "weight_decay": cfg.optimizer.weight_decay},
                          {"params": [], "weight_decay": 0.0}]
    for _, kernel in lora_kernels(model):
        for module, a, b in zip(kernel.hf_modules, kernel.lora_a, kernel.lora_b, strict=True):
            for which, p in (("A", a), ("B", b)):
                if decay_rule == "mindspore":
                    decays = "beta" not in p.name and "gamma" not in p.name
                else:
                    decays = hf_name_decays(peft_parameter_name(module, which), cfg.optimizer.no_decay)
                groups[0 if decays else 1]["params"].append(p)
    return groups


def check_checkpoint_base(record: dict, run: LoraRun, where: Path) -> None:
    """A resumed LoRA run must sit on the base its adapters were trained on."""
    saved = (record.get("base") or {}).get("sha256")
    if saved and run.base_sha256 and saved != run.base_sha256:
        raise MigrateError(f"cannot resume from {where}: its adapters were trained on another base model "
                           f"(base sha256 {saved[:12]}…, this run's ms_model {run.base_sha256[:12]}…)")
