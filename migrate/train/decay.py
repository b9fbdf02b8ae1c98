"""Which parameters get weight decay, decided once for both frameworks.

HF Trainer (transformers 5, `Trainer.get_decay_parameter_names`) decays every
parameter except those inside an `nn.LayerNorm` and those whose lower-cased
name matches `bias`, `layernorm`, `rmsnorm`, `(^|.)norm(.|$)` or `_norm(.|$)`.
`LlamaRMSNorm` is not an `nn.LayerNorm` (ALL_LAYERNORM_LAYERS is just
[nn.LayerNorm]); Llama's norms are excluded by their names
(`input_layernorm`, `post_attention_layernorm`, `model.norm`).

The rules here are those HF patterns, grouped under names a run config can
list. The golden side asks transformers' own `get_parameter_names`; the
MindSpore side never looks at its own names: a MindSpore parameter decays iff
its HF pair (through the keymap) does, so both sides agree by construction.
"""
from __future__ import annotations

import inspect
import re
from collections.abc import Iterable

from migrate.errors import MigrateError
from migrate.models.conversion_plan import ConversionPlan

# rule name -> HF Trainer's forbidden-name patterns (searched in the lower-cased name)
NO_DECAY_RULES: dict[str, tuple[str, ...]] = {
    "bias": (r"bias",),
    "norm": (r"layernorm", r"rmsnorm", r"(?:^|\.)norm(?:$|\.)", r"_norm(?:$|\.)"),
    "embedding": (r"embed",),  # not HF's default; some pretraining recipes also spare embeddings
}
HF_DEFAULT = ("bias", "norm")  # exactly Trainer.get_decay_parameter_names


def _patterns(rules: Iterable[str]) -> list[str]:
    unknown = [r for r in rules if r not in NO_DECAY_RULES]
    if unknown:
        raise MigrateError(f"unknown no_decay rule {unknown[0]!r}; known: {', '.join(NO_DECAY_RULES)}")
    return [p for r in rules for p in NO_DECAY_RULES[r]]


def hf_decay_names(model, no_decay_rules: Iterable[str] = HF_DEFAULT) -> set[str]:
    """Trainable torch parameter names that decay, as `named_parameters` lists them (tied weights once)."""
    from torch import nn
    from transformers.trainer_pt_utils import get_parameter_names

    rules = list(no_decay_rules)
    layer_types = [nn.LayerNorm] if "norm" in rules else []  # HF's forbidden layer type
    if "forbidden_layer_names" in inspect.signature(get_parameter_names).parameters:
        allowed = set(get_parameter_names(model, layer_types, _patterns(rules)))
    else:  # transformers 4.4x takes no name patterns: the same name test, on each full name
        allowed = {n for n in get_parameter_names(model, layer_types) if hf_name_decays(n, rules)}
    return {n for n, p in model.named_parameters() if p.requires_grad and n in allowed}


def hf_name_decays(hf_name: str, no_decay_rules: Iterable[str] = HF_DEFAULT) -> bool:
    """HF's name rule for one HF parameter name, without the model.

    Equal to `get_parameter_names`' name test (it searches every dotted suffix,
    and each pattern anchors on `^` or `.`, so the full name decides); it
    cannot see the nn.LayerNorm type rule, which Llama never triggers.
    """
    name = hf_name.lower()
    return not any(re.search(p, name) for p in _patterns(no_decay_rules))


def ms_decay_names(ms_param_names: Iterable[str], keymap, ms_config,
                   no_decay_rules: Iterable[str] = HF_DEFAULT, hf_decay: set[str] | None = None) -> set[str]:
    """MindSpore parameter names that decay: those whose HF pair decays.

    `hf_decay` (e.g. the golden run's list) overrides the name rule for HF names.
    A MindSpore weight dropped as tied follows the HF weight it is tied to. A fused
    parameter (`--qkv-concat`'s w_qkv) decays iff all the HF tensors it holds do;
    sources that disagree (a weight fused with a bias) cannot be trained alike.
    """
    return plan_decay_names(ms_param_names, ConversionPlan(keymap, ms_config), no_decay_rules, hf_decay)


def plan_decay_names(ms_param_names: Iterable[str], plan: ConversionPlan,
                     no_decay_rules: Iterable[str] = HF_DEFAULT, hf_decay: set[str] | None = None) -> set[str]:
    """`ms_decay_names` through a resolved conversion plan (the trainer's, resolved once per run)."""
    sources = hf_sources(plan)
    names = list(ms_param_names)
    unpaired = [n for n in names if n not in sources]
    if unpaired:
        raise MigrateError(f"keymap {plan.keymap.name} pairs no HF parameter with MindSpore "
                           f"{', '.join(unpaired[:5])}{' ...' if len(unpaired) > 5 else ''}")
    rules = list(no_decay_rules)

    def decays(name: str) -> bool:
        votes = {hf in hf_decay if hf_decay is not None else hf_name_decays(hf, rules) for hf in sources[name]}
        if len(votes) > 1:
            raise MigrateError(f"MindSpore {name} fuses HF parameters of which only some decay: "
                               f"{', '.join(sources[name])}")
        return votes.pop()

    return {n for n in names if decays(n)}


def hf_sources(plan: ConversionPlan) -> dict[str, tuple[str, ...]]:
    """MindSpore parameter name -> the HF parameter names it is made of (one for a
    rename, several for a fused row; a tied head: the weight it is tied to)."""
    out = dict(plan.sources)
    for pair in plan.tied:
        out.setdefault(pair.dst, (pair.tied_to,))
    return out
