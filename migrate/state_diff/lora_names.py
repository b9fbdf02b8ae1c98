"""A LoRA run's state under one naming on both sides: ``<HF module>.lora_A.weight`` / ``.lora_B.weight``
(PEFT's names without its ``base_model.model.`` prefix and adapter name), so the golden's PEFT adapter and
`migrate train`'s adapter.ckpt meet without the keymap (lora.json records each adapter's HF module)."""
from __future__ import annotations

from migrate.errors import MigrateError
from migrate.lora.targets import PEFT_PREFIX


def hf_lora_name(module: str, which: str) -> str:
    return f"{module}.lora_{which}.weight"


def from_peft(name: str) -> str:
    """PEFT's live parameter name ("base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight")
    -> "model.layers.0.self_attn.q_proj.lora_A.weight"."""
    if not name.startswith(PEFT_PREFIX):
        raise MigrateError(f"optimizer parameter {name} is no PEFT adapter weight")
    return name[len(PEFT_PREFIX):].replace(".default.", ".")


def from_record(record: dict) -> dict[str, str]:
    """MindSpore adapter name -> its HF name, from lora.json's targets."""
    out = {}
    for target in record.get("targets") or []:
        try:
            module, (name_a, name_b) = target["hf_module"], target["ms"]
        except (KeyError, TypeError, ValueError):
            raise MigrateError(f"lora.json: a target without its hf_module and MindSpore names: {target!r}"[:200]) \
                from None
        out[name_a], out[name_b] = hf_lora_name(module, "A"), hf_lora_name(module, "B")
    return out
