"""The `lora:` section of run.yaml: one adapter, in PEFT's terms.

    lora:
      rank: 8                          # PEFT `r`
      alpha: 16                        # PEFT `lora_alpha`
      dropout: 0.05                    # PEFT `lora_dropout`, on the adapted layer's input
      target_modules: [q_proj, v_proj] # HF module names (suffix match, as PEFT), or all-linear
      use_rslora: false                # scaling alpha / sqrt(rank) instead of alpha / rank
      use_dora: false                  # refused: DoRA's magnitude vector has no MindSpore side here

Defaults are PEFT's `LoraConfig` defaults (r 8, lora_alpha 8, dropout 0) with its default
targets for the Llama family (q_proj, v_proj). `problems()` lists every bad field as
(key, message) for the run config to report in one line.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

ALL_LINEAR = "all-linear"  # PEFT's shorthand: every linear layer but the output head
_MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*")


@dataclass
class LoraSpec:
    rank: int = 8
    alpha: float = 8.0
    dropout: float = 0.0
    target_modules: Any = field(default_factory=lambda: ["q_proj", "v_proj"])
    use_rslora: bool = False
    use_dora: bool = False

    @property
    def scaling(self) -> float:
        """What PEFT multiplies B·A·x by: alpha / rank, or alpha / sqrt(rank) with rsLoRA."""
        return self.alpha / (math.sqrt(self.rank) if self.use_rslora else self.rank)

    @property
    def all_linear(self) -> bool:
        return self.target_modules == ALL_LINEAR or self.target_modules == [ALL_LINEAR]

    @property
    def target_list(self) -> list[str]:
        return [ALL_LINEAR] if self.all_linear else list(self.target_modules)

    def problems(self) -> list[tuple[str, str]]:
        out = []
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank <= 0:
            out.append(("rank", f"must be an integer >= 1, got {self.rank!r}"))
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, (int, float)) or not self.alpha > 0 \
                or not math.isfinite(self.alpha):
            out.append(("alpha", f"must be a number > 0, got {self.alpha!r}"))
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, (int, float)) \
                or not 0.0 <= self.dropout < 1.0:
            out.append(("dropout", f"must be in [0, 1), got {self.dropout!r}"))
        targets = self.target_modules
        if isinstance(targets, str):
            if targets != ALL_LINEAR:
                out.append(("target_modules", f"must be a list of module names or {ALL_LINEAR!r}, got {targets!r}"))
        elif not isinstance(targets, list) or not targets:
            out.append(("target_modules", f"must be a non-empty list of module names or {ALL_LINEAR!r}, "
                                          f"got {targets!r}"))
        else:
            bad = [t for t in targets if not isinstance(t, str) or not _MODULE_NAME.fullmatch(t)]
            if bad:
                out.append(("target_modules", f"not a module name: {bad[0]!r}"))
            elif ALL_LINEAR in targets and len(targets) > 1:
                out.append(("target_modules", f"{ALL_LINEAR!r} stands alone"))
        for key in ("use_rslora", "use_dora"):
            if not isinstance(getattr(self, key), bool):
                out.append((key, f"must be true or false, got {getattr(self, key)!r}"))
        if self.use_dora is True:
            out.append(("use_dora", "DoRA is not supported (its magnitude vector has no MindSpore side here); "
                                    "set use_dora: false"))
        return out

    def normalised(self) -> LoraSpec:
        """The spec with all-linear spelled one way and alpha a float."""
        targets = ALL_LINEAR if self.all_linear else list(self.target_modules)
        return LoraSpec(self.rank, float(self.alpha), float(self.dropout), targets, self.use_rslora, self.use_dora)

    def record(self) -> dict:
        """The spec's knobs as effective_hparams.json records them (both sides, same keys)."""
        return {"rank": self.rank, "alpha": float(self.alpha), "scaling": self.scaling,
                "dropout": float(self.dropout), "use_rslora": self.use_rslora, "use_dora": self.use_dora}
