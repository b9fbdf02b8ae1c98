"""`migrate keymap check`: which names of each side a keymap leaves unmapped,
found from headers and the model's own parameter list, before any data moves."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from migrate.checkpoints.hf_reader import open_hf_checkpoint
from migrate.hf_config import load_hf_config, read_raw_config
from migrate.keymap import Keymap, resolve
from migrate.models.registry import MODEL_CLASS_FIELD, model_class, parameter_shapes


@dataclass
class KeymapCheck:
    keymap: Keymap
    target: str
    pairs: int = 0
    unmapped_source: list[str] = field(default_factory=list)   # HF tensors no rule consumes
    absent_source: list[str] = field(default_factory=list)     # rules whose HF tensor is not in the file
    unfilled_target: list[str] = field(default_factory=list)   # model parameters no rule fills
    unknown_target: list[str] = field(default_factory=list)    # rule targets the model lacks
    misshaped: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return not (self.unmapped_source or self.absent_source or self.unfilled_target
                    or self.unknown_target or self.misshaped)


def check_keymap(keymap: str | Path, hf_dir: str | Path, ms_model: str | None = None) -> KeymapCheck:
    hf_dir = Path(hf_dir)
    raw = read_raw_config(hf_dir)
    km = resolve(str(keymap), raw)
    km.check_source(raw)
    target = ms_model or km.target
    cls = model_class(target)
    config_cls = getattr(cls, "config_class", None)
    if config_cls is None:
        from migrate.models.config import LlamaConfig as config_cls
    fields = {**km.hf_to_ms_config(load_hf_config(hf_dir)), MODEL_CLASS_FIELD: target}
    config = config_cls.from_dict(fields)
    expected = parameter_shapes(cls(config))
    ckpt = open_hf_checkpoint(hf_dir)
    pairs, tied = km.pairs(config.to_dict())
    consumed = {p.src for p in pairs} | {t.src for t in tied} | km.ignored(config.to_dict())
    targets = {p.dst for p in pairs}
    result = KeymapCheck(km, target, pairs=len(pairs))
    result.unmapped_source = sorted(n for n in ckpt.specs if n not in consumed)
    result.absent_source = [p.src for p in pairs if p.src not in ckpt.specs]
    result.unfilled_target = [n for n in expected if n not in targets]
    result.unknown_target = [p.dst for p in pairs if p.dst not in expected]
    result.misshaped = [
        f"{p.src} {list(ckpt.specs[p.src].shape)} vs {p.dst} {list(expected[p.dst])}"
        for p in pairs if p.src in ckpt.specs and p.dst in expected
        and tuple(ckpt.specs[p.src].shape) != expected[p.dst]
    ]
    return result
