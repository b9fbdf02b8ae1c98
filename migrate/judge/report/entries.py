"""What a report holds: one `Entry` per compared tensor, and the greedy `Generation`.

An entry is judged when the `Report` adds it (`judge.checks.tensor_checks`); it knows where it
sits in the model (`location`, `short_label`) and the one figure that matters (`headline`).
"""
from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from migrate.jsonsafe import jsonable as _jsonable
from migrate.judge import Check, fmt_cosine, fmt_num

__all__ = ["BLOCKS", "DIRECTIONS", "STATE_KINDS", "Entry", "Generation", "layer_of"]

STATE_KINDS = ("state", "counter")   # two training states compared (`migrate.state_diff`): named as they are
BLOCKS = ("embedding", "attention", "mlp", "layer output", "final norm", "logits", "loss")
DIRECTIONS = ("forward", "backward")

_BLOCK_TEXT = {
    "embedding": "embedding output",
    "attention": "attention output",
    "mlp": "mlp output",
    "layer output": "output",
    "final norm": "final norm output",
    "logits": "logits",
    "loss": "loss",
    "generation": "greedy generation",
}
_SHORT_BLOCK = {
    "embedding": "emb",
    "attention": "attn",
    "mlp": "mlp",
    "layer output": "out",
    "final norm": "norm",
    "logits": "logits",
    "loss": "loss",
}
_LAYER_RE = re.compile(r"(?:^|\.)(?:layers|layer|h|blocks|block)\.(\d+)(?:\.|$)")


def layer_of(name: str) -> int | None:
    """Decoder-layer index in a parameter / module name ("model.layers.3.mlp.up_proj.weight" -> 3)."""
    m = _LAYER_RE.search(name)
    return int(m.group(1)) if m else None


def first_words(entry: Entry, backward: bool) -> str:
    """What the first failing entry of its direction is called."""
    if entry.kind in STATE_KINDS:
        return "first state divergence"
    return "first gradient divergence" if backward else "first divergence"


_NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def _unjson_metrics(m: Mapping[str, Any]) -> dict:
    """Metrics read back from report.json: "nan" / "inf" strings as floats again, nested figures too
    (the noise reference's)."""
    def value(v):
        if isinstance(v, Mapping):
            return _unjson_metrics(v)
        return _NONFINITE[v] if isinstance(v, str) and v in _NONFINITE else v

    return {k: value(v) for k, v in m.items()}


@dataclass
class Entry:
    """One compared tensor (or the generation check), already judged.

    ``block`` is one of `BLOCKS` for forward activations, or the parameter
    name for ``grad`` / ``param_after_step`` entries, or "generation".
    ``order`` ranks the entry within its direction (smaller = earlier).
    """

    name: str
    kind: str
    block: str
    direction: str = "forward"
    layer: int | None = None
    metrics: dict = field(default_factory=dict)
    passed: bool = False
    reason: str | None = None
    order: float = 0
    # the judge's checks behind passed / reason (in memory only: report.json keeps the verdict)
    checks: list[Check] = field(default_factory=list, repr=False, compare=False)

    @property
    def is_param(self) -> bool:
        return self.kind in ("grad", "param_after_step")

    @property
    def location(self) -> str:
        """Human location: "layer 3 · mlp output", "embedding output", "grad lm_head.weight"."""
        if self.kind == "grad":
            return f"grad {self.block}"
        if self.kind == "param_after_step":
            return f"param after step {self.block}"
        if self.kind in STATE_KINDS:
            return self.name   # "exp_avg_sq model.layers.1.mlp.down_proj.weight", "optimizer step"
        text = _BLOCK_TEXT.get(self.block, self.block)
        if self.layer is not None:
            return f"layer {self.layer} · {text}"
        if self.block == "layer output":
            return "layer output"
        return text

    @property
    def noise_ratio(self) -> float | None:
        """Max abs difference over the reference's own max abs error vs its float64 twin."""
        own = (self.metrics.get("noise") or {}).get("max_abs")
        mab = self.metrics.get("max_abs")
        if own is None or mab is None or not (math.isfinite(own) and math.isfinite(mab)) or own == 0:
            return None  # a reference exact here (a lookup, a lucky scalar): the fixed floor judges
        return mab / own

    @property
    def short_label(self) -> str:
        """Compact axis label for plots: "L3 mlp", "emb", "logits"."""
        text = _SHORT_BLOCK.get(self.block, self.block if len(self.block) <= 12 else self.block[-12:])
        if self.layer is not None:
            return f"L{self.layer}" if self.block == "layer output" else f"L{self.layer} {text}"
        return text

    def headline(self) -> str:
        """The figure that matters: the first failing check (the most fundamental of
        ``reason``), or cosine / max abs when passed."""
        if not self.passed and self.reason:
            return self.reason.split("; ")[0]
        m = self.metrics
        if self.kind == "generation" and "steps" in m:
            if m.get("first_diff_step") is None:
                return f"{m['steps']} steps identical"
            text = f"differs at step {m['first_diff_step']} of {m['steps']}"
            return text if m.get("judged", True) else text + " (not judged)"
        if self.kind == "counter" and m.get("ref_text") is not None:
            return f"{m['ref_text']} on both sides"
        parts = []
        if m.get("cosine") is not None and self.kind != "loss":
            parts.append(f"cosine {fmt_cosine(m['cosine'])}")
        if m.get("max_abs") is not None:
            parts.append(f"max_abs {fmt_num(m['max_abs'])}")
        if self.kind == "loss" and m.get("max_rel") is not None:
            parts.append(f"rel diff {fmt_num(m['max_rel'])}")
        return ", ".join(parts)

    def describe(self, first: bool = False, backward: bool = False) -> str:
        """"layer 3 · mlp output · cosine 0.93 < 0.99999 — first divergence".

        The full list of failing checks stays in ``reason`` (and in the tables)."""
        text = f"{self.location} · {self.headline()}"
        if first:
            text += f" — {first_words(self, backward)}"
        return text

    def to_dict(self, index: int | None = None) -> dict:
        d = {
            "index": index,
            "name": self.name,
            "kind": self.kind,
            "layer": self.layer,
            "block": self.block,
            "direction": self.direction,
            "order": self.order,
            "location": self.location,
            "metrics": _jsonable(self.metrics),
            "passed": bool(self.passed),
            "reason": self.reason,
        }
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Entry:
        return cls(
            name=d["name"], kind=d["kind"], block=d["block"], direction=d.get("direction", "forward"),
            layer=d.get("layer"), metrics=_unjson_metrics(d.get("metrics") or {}),
            passed=bool(d.get("passed")), reason=d.get("reason"), order=d.get("order", 0),
        )


@dataclass
class Generation:
    """Greedy generation from both sides; tokens are rows (batch) of ids."""

    ref_tokens: list
    got_tokens: list
    metrics: dict
    passed: bool
    judged: bool
    reason: str | None = None
    ref_text: list | None = None
    got_text: list | None = None
    prompt: str | None = None

    @property
    def first_diff_step(self) -> int | None:
        return self.metrics.get("first_diff_step")

    def summary_text(self) -> str:
        m = self.metrics
        if m.get("first_diff_step") is None:
            text = f"generation: {m.get('steps', 0)} steps identical"
        else:
            text = (f"generation: first differs at step {m['first_diff_step']} of {m['steps']} "
                    f"(ref {m.get('ref_token')} vs got {m.get('got_token')})")
        if not self.judged:
            text += " — reported, not judged at this dtype"
        return text

    def to_dict(self) -> dict:
        return _jsonable({
            "ref_tokens": self.ref_tokens,
            "got_tokens": self.got_tokens,
            "ref_text": self.ref_text,
            "got_text": self.got_text,
            "prompt": self.prompt,
            **self.metrics,
            "judged": self.judged,
            "passed": self.passed,
            "reason": self.reason,
        })

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Generation:
        keys = ("steps", "rows", "first_diff_step", "matching_prefix", "match_share",
                "diff_row", "ref_token", "got_token")
        metrics = {k: d.get(k) for k in keys if k in d}
        metrics["judged"] = bool(d.get("judged"))
        return cls(ref_tokens=d.get("ref_tokens") or [], got_tokens=d.get("got_tokens") or [],
                   metrics=metrics, passed=bool(d.get("passed")), judged=bool(d.get("judged")),
                   reason=d.get("reason"), ref_text=d.get("ref_text"), got_text=d.get("got_text"),
                   prompt=d.get("prompt"))
