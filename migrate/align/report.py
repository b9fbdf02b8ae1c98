"""The alignment report: judged entries in order, the first divergence, output files.

The runner feeds a `Report` in the order it computes things::

    rep = Report(dtype="bf16", inputs="2 x 16 random tokens", seed=0,
                 ref_dir=hf_dir, got_dir=ms_dir,
                 versions={"torch": "2.13.0", "mindspore": "2.10.0"})
    rep.add("embed", ref, got, kind="hidden", block="embedding")
    for i in range(n_layers):
        rep.add(f"layers.{i}.attn", a, b, kind="hidden", layer=i, block="attention")
        rep.add(f"layers.{i}.mlp", a, b, kind="hidden", layer=i, block="mlp")
        rep.add(f"layers.{i}", a, b, kind="hidden", layer=i, block="layer output")
    rep.add("norm", a, b, kind="hidden", block="final norm")
    rep.add("logits", a, b, kind="logits")
    rep.add("loss", a, b, kind="loss")
    for name in reversed(param_names):          # backward order: lm_head first
        rep.add(name, ga, gb, kind="grad")
    for name in reversed(param_names):
        rep.add(name, pa, pb, kind="param_after_step")
    rep.set_generation(ref_tokens, got_tokens)
    rep.finalize()
    print_table(rep); write_report(rep, out_dir)

Each entry is judged when added (`metrics.judge` with ``rep.thresholds``).
Forward entries are ranked in the order added; backward entries (gradients,
parameters after the step) too, so add them in backward order -- or pass
``order=`` explicitly, smaller first.

JSON schema (``schema_version`` 1), written by `write_report` as report.json::

    {schema_version, tool, tool_version, created,
     run: {dtype, inputs, seed, ref_dir, got_dir, ref_label, got_label, versions, extra},
     thresholds: {dtype, hidden: {max_abs, max_abs_rel, cosine, top1, kl, match}, logits, ...},
     summary: {passed, entries, failed, forward_failed, backward_failed,
               first_divergence: null | {index, name, kind, layer, block, direction,
                                         location, reason, text},
               first_grad_divergence: same,
               nonfinite: null | {index, name, kind, layer, block, direction, location,
                                  tensors, numel, ref: {nan, inf, at}, got: {nan, inf, at}, text},
               headline: {logits_max_abs, logits_cosine, logits_finite, logits_numel,
                          top1, kl, loss_rel_diff, grad_min_cosine, grads, grads_failed}},
     entries: [{index, name, kind, layer, block, direction, order, location,
                metrics: {...}, passed, reason}],
     generation: null | {ref_tokens, got_tokens, ref_text, got_text, prompt,
                         steps, first_diff_step, matching_prefix, match_share,
                         ref_token, got_token, judged, passed, reason}}

Non-finite floats are written as the strings "nan", "inf", "-inf", so the
file is strict JSON; `Report.from_dict` turns them back into floats.

NaN / Inf: any non-finite element in any compared tensor, on either side,
fails its entry (`metrics.judge`). ``summary.nonfinite`` names the first such
tensor -- forward entries first, in forward order, then backward entries in
backward order -- with each side's NaN / Inf counts and first positions
(``at``: indices into the compared tensor) and how many tensors hold any;
the verdict line, the console, report.md and report.html say it in words.
Each entry's metrics carry ``finite_compared`` (positions finite on both
sides: what max abs / cosine were computed over; with none they are NaN).
"""
from __future__ import annotations

import base64
import datetime as _dt
import html
import io
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from migrate.checkpoints.atomic import atomic_write_bytes, atomic_write_text
from migrate.jsonsafe import jsonable as _jsonable
from migrate.align.metrics import (
    KINDS,
    Thresholds,
    canonical_dtype,
    fmt_cosine,
    fmt_num,
    generation_metrics,
    judge,
    logits_metrics,
    nonfinite_count,
    nonfinite_side,
    nonfinite_text,
    tensor_metrics,
    token_rows,
)
from migrate.errors import MigrateError

__all__ = [
    "SCHEMA_VERSION",
    "BLOCKS",
    "DIRECTIONS",
    "Entry",
    "Generation",
    "Report",
    "layer_of",
    "print_table",
    "write_report",
    "read_report",
    "REPORT_FILES",
]

SCHEMA_VERSION = 1
BLOCKS = ("embedding", "attention", "mlp", "layer output", "final norm", "logits", "loss")
DIRECTIONS = ("forward", "backward")
REPORT_FILES = ("report.json", "report.md", "per_layer_error.png", "report.html")

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


# --------------------------------------------------------------------------- JSON helpers

_NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def _unjson_metrics(m: Mapping[str, Any]) -> dict:
    return {k: (_NONFINITE[v] if isinstance(v, str) and v in _NONFINITE else v) for k, v in m.items()}


# --------------------------------------------------------------------------- entries

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
        text = _BLOCK_TEXT.get(self.block, self.block)
        if self.layer is not None:
            return f"layer {self.layer} · {text}"
        if self.block == "layer output":
            return "layer output"
        return text

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
            text += " — first gradient divergence" if backward else " — first divergence"
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
    def from_dict(cls, d: Mapping[str, Any]) -> "Entry":
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
    def from_dict(cls, d: Mapping[str, Any]) -> "Generation":
        keys = ("steps", "rows", "first_diff_step", "matching_prefix", "match_share",
                "diff_row", "ref_token", "got_token")
        metrics = {k: d.get(k) for k in keys if k in d}
        metrics["judged"] = bool(d.get("judged"))
        return cls(ref_tokens=d.get("ref_tokens") or [], got_tokens=d.get("got_tokens") or [],
                   metrics=metrics, passed=bool(d.get("passed")), judged=bool(d.get("judged")),
                   reason=d.get("reason"), ref_text=d.get("ref_text"), got_text=d.get("got_text"),
                   prompt=d.get("prompt"))


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()


# --------------------------------------------------------------------------- report

@dataclass
class Report:
    """Everything one `migrate diff` run found. Build with `add` / `add_metrics` /
    `set_generation`, then `finalize()` (idempotent; also run by `to_dict`)."""

    dtype: str | None = None   # None: the thresholds' dtype, else fp32
    inputs: str = ""
    seed: int | None = None
    ref_dir: str | None = None
    got_dir: str | None = None
    ref_label: str = "reference"
    got_label: str = "converted"
    versions: dict = field(default_factory=dict)
    thresholds: Thresholds | None = None
    extra: dict = field(default_factory=dict)
    created: str = field(default_factory=_now)
    schema_version: int = SCHEMA_VERSION
    entries: list = field(default_factory=list)
    generation: Generation | None = None
    # filled by finalize()
    passed: bool | None = None
    first_divergence: Entry | None = None
    first_grad_divergence: Entry | None = None
    summary: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.thresholds is None:
            self.thresholds = Thresholds(self.dtype or "fp32")
        dtype = canonical_dtype(self.dtype) if self.dtype is not None else self.thresholds.dtype
        if dtype != self.thresholds.dtype:
            raise ValueError(f"report dtype {dtype} does not match thresholds dtype {self.thresholds.dtype}")
        self.dtype = dtype
        if self.ref_dir is not None:
            self.ref_dir = str(self.ref_dir)
        if self.got_dir is not None:
            self.got_dir = str(self.got_dir)
        self._finalized = False

    # ---- building

    def _next_order(self, direction: str) -> int:
        return sum(1 for e in self.entries if e.direction == direction)

    def add_metrics(self, name: str, metrics: Mapping[str, Any], *, kind: str = "hidden",
                    layer: int | None = None, block: str | None = None,
                    direction: str | None = None, order: float | None = None) -> Entry:
        """Append an entry from an already computed metrics dict; judged here."""
        if kind not in KINDS:
            raise ValueError(f"unknown entry kind {kind!r}; expected one of {', '.join(KINDS)}")
        if direction is None:
            direction = "backward" if kind in ("grad", "param_after_step") else "forward"
        if direction not in DIRECTIONS:
            raise ValueError(f"direction must be 'forward' or 'backward', got {direction!r}")
        if block is None:
            block = {"logits": "logits", "loss": "loss", "generation": "generation"}.get(kind, name)
        if layer is None and kind in ("grad", "param_after_step"):
            layer = layer_of(name)
        metrics = dict(metrics)
        passed, reason = judge(metrics, kind, self.thresholds)
        entry = Entry(name=name, kind=kind, block=block, direction=direction,
                      layer=None if layer is None else int(layer), metrics=metrics,
                      passed=passed, reason=reason,
                      order=self._next_order(direction) if order is None else order)
        self.entries.append(entry)
        self._finalized = False
        return entry

    def add(self, name: str, ref: Any, got: Any, *, kind: str = "hidden",
            layer: int | None = None, block: str | None = None,
            direction: str | None = None, order: float | None = None) -> Entry:
        """Compare two arrays (`logits_metrics` for logits / generation kinds,
        `tensor_metrics` otherwise), judge and append. Returns the entry."""
        if kind in ("logits", "generation"):
            metrics = logits_metrics(ref, got)
        else:
            metrics = tensor_metrics(ref, got)
        return self.add_metrics(name, metrics, kind=kind, layer=layer, block=block,
                                direction=direction, order=order)

    def set_generation(self, ref_tokens: Any, got_tokens: Any, *, ref_text: Any = None,
                       got_text: Any = None, prompt: str | None = None) -> Entry:
        """Record greedy generation from both sides (1-d or (batch, steps) token ids).

        Adds a forward entry of kind "generation" (judged with the generation
        ``match`` bound; when the dtype's bound is None it is reported, not
        judged) and fills the generation section. Replaces an earlier call."""
        self.entries = [e for e in self.entries if not (e.kind == "generation" and e.block == "generation")]
        metrics = generation_metrics(ref_tokens, got_tokens)
        judged = self.thresholds.bounds("generation").match is not None
        metrics["judged"] = judged
        entry = self.add_metrics("generation", metrics, kind="generation", block="generation")

        def texts(t):
            if t is None:
                return None
            return [t] if isinstance(t, str) else [str(s) for s in t]

        self.generation = Generation(
            ref_tokens=token_rows(ref_tokens), got_tokens=token_rows(got_tokens), metrics=dict(metrics),
            passed=entry.passed, judged=judged, reason=entry.reason,
            ref_text=texts(ref_text), got_text=texts(got_text), prompt=prompt,
        )
        return entry

    # ---- views

    @property
    def forward(self) -> list[Entry]:
        return sorted((e for e in self.entries if e.direction == "forward"), key=lambda e: e.order)

    @property
    def backward(self) -> list[Entry]:
        return sorted((e for e in self.entries if e.direction == "backward"), key=lambda e: e.order)

    def index_of(self, entry: Entry | None) -> int | None:
        if entry is None:
            return None
        for i, e in enumerate(self.entries):
            if e is entry:
                return i
        return None

    def finalize(self) -> "Report":
        """Compute passed, first divergences and the headline figures."""
        fwd, bwd = self.forward, self.backward
        self.first_divergence = next((e for e in fwd if not e.passed), None)
        self.first_grad_divergence = next((e for e in bwd if not e.passed), None)
        failed = [e for e in self.entries if not e.passed]
        self.passed = bool(self.entries) and not failed

        logits = next((e for e in reversed(fwd) if e.kind == "logits"), None)
        loss = next((e for e in reversed(fwd) if e.kind == "loss"), None)
        grads = [e for e in bwd if e.kind == "grad"]
        grad_cos = [e.metrics.get("cosine") for e in grads if e.metrics.get("cosine") is not None]
        lm = logits.metrics if logits else {}
        headline = {
            "logits_max_abs": lm.get("max_abs"),
            "logits_cosine": lm.get("cosine"),
            "logits_finite": lm.get("finite_compared"),
            "logits_numel": lm.get("numel"),
            "top1": lm.get("top1"),
            "kl": lm.get("kl"),
            "loss_rel_diff": loss.metrics.get("max_rel") if loss else None,
            "loss_ref": None,
            "grads": len(grads),
            "grads_failed": sum(1 for e in grads if not e.passed),
            "grad_min_cosine": min(grad_cos) if grad_cos else None,
        }
        # Encoders without logits (BertModel): their final outputs stand in the headline.
        for key, name in (("last_hidden_max_abs", "last hidden state"), ("pooled_max_abs", "pooled output")):
            entry = next((e for e in fwd if e.name == name), None)
            if entry is not None:
                headline[key] = entry.metrics.get("max_abs")
        if loss is not None and loss.metrics.get("ref_max_abs") is not None:
            headline["loss_ref"] = loss.metrics.get("ref_max_abs")

        def point(e: Entry | None, backward: bool) -> dict | None:
            if e is None:
                return None
            return {
                "index": self.index_of(e), "name": e.name, "kind": e.kind, "layer": e.layer,
                "block": e.block, "direction": e.direction, "location": e.location,
                "reason": e.reason, "text": e.describe(first=True, backward=backward),
            }

        self.summary = {
            "passed": self.passed,
            "entries": len(self.entries),
            "failed": len(failed),
            "forward_failed": sum(1 for e in fwd if not e.passed),
            "backward_failed": sum(1 for e in bwd if not e.passed),
            "first_divergence": point(self.first_divergence, False),
            "first_grad_divergence": point(self.first_grad_divergence, True),
            "nonfinite": self._nonfinite_point(fwd + bwd),
            "headline": headline,
        }
        self._finalized = True
        return self

    def _nonfinite_point(self, ordered: list[Entry]) -> dict | None:
        """The first entry holding NaN / Inf on either side (forward, then backward order)."""
        hit = [e for e in ordered if nonfinite_count(e.metrics)]
        if not hit:
            return None
        e, m = hit[0], hit[0].metrics

        def side(s: str) -> dict:
            return {"nan": int(m.get(f"nan_{s}") or 0), "inf": int(m.get(f"inf_{s}") or 0),
                    "at": list(m.get(f"nonfinite_{s}_at") or [])}

        return {
            "index": self.index_of(e), "name": e.name, "kind": e.kind, "layer": e.layer, "block": e.block,
            "direction": e.direction, "location": e.location, "tensors": len(hit), "numel": m.get("numel"),
            "ref": side("ref"), "got": side("got"),
            "text": f"{e.location}: " + nonfinite_text(m, self.ref_label, self.got_label),
        }

    def nonfinite_entries(self) -> list[Entry]:
        """Every entry holding NaN / Inf, forward order then backward order."""
        return [e for e in self.forward + self.backward if nonfinite_count(e.metrics)]

    def nonfinite_line(self) -> str | None:
        """"NaN/Inf first in layer 0 · mlp output: … · 9 of 12 compared tensors hold NaN/Inf", or None."""
        self._ensure_final()
        nf = self.summary.get("nonfinite")
        if not nf:
            return None
        return (f"NaN/Inf first in {nf['text']} · {nf['tensors']} of {len(self.entries)} compared "
                f"tensors hold NaN/Inf")

    def _nonfinite_verdict(self) -> str | None:
        """"NaN in MindSpore from layer 0 · mlp output (3072 NaN of 3072 at [0, 0, 0], …)"."""
        nf = self.summary.get("nonfinite")
        if not nf:
            return None
        parts, kinds = [], set()
        for s, label in (("ref", self.ref_label), ("got", self.got_label)):
            d = nf[s]
            if not (d["nan"] or d["inf"]):
                continue
            kinds |= {k for k in ("nan", "inf") if d[k]}
            counts = ", ".join(t for t in (d["nan"] and f"{d['nan']} NaN", d["inf"] and f"{d['inf']} Inf") if t)
            if nf.get("numel") is not None:
                counts += f" of {nf['numel']}"
            at = [list(i) for i in d["at"] if i]   # [] is the position of a scalar
            where = ", ".join(str(i) for i in at[:3]) + (", …" if at and d["nan"] + d["inf"] > min(3, len(at)) else "")
            parts.append((label, f"{label}: {counts}" + (f" at {where}" if where else "")))
        word = "NaN/Inf" if kinds == {"nan", "inf"} else ("NaN" if kinds == {"nan"} else "Inf")
        labels = " and ".join(label for label, _ in parts)
        return f"{word} in {labels} from {nf['location']} ({' | '.join(t for _, t in parts)})"

    def _ensure_final(self) -> None:
        if not getattr(self, "_finalized", False):
            self.finalize()

    def verdict_text(self) -> str:
        """One line: "PASS · logits max abs … · cosine … · top-1 … · KL … · loss rel diff …"."""
        self._ensure_final()
        h = self.summary["headline"]
        parts = ["PASS" if self.passed else "FAIL"]
        nonfinite = self._nonfinite_verdict()
        if nonfinite:
            parts.append(nonfinite)
        if h["logits_max_abs"] is not None:
            text = f"logits max abs {fmt_num(h['logits_max_abs'])}"
            finite, numel = h.get("logits_finite"), h.get("logits_numel")
            if finite is not None and numel is not None and 0 < finite < numel:
                text += f" (over the {finite} of {numel} positions finite on both sides)"
            parts.append(text)
        if h["logits_cosine"] is not None:
            parts.append(f"cosine {fmt_cosine(h['logits_cosine'])}")
        if h["top1"] is not None:
            parts.append(f"top-1 {h['top1']:.2%}")
        if h["kl"] is not None:
            parts.append(f"KL {fmt_num(h['kl'])}")
        if h["loss_rel_diff"] is not None:
            parts.append(f"loss rel diff {fmt_num(h['loss_rel_diff'])}")
        if h.get("last_hidden_max_abs") is not None:
            parts.append(f"last hidden state max abs {fmt_num(h['last_hidden_max_abs'])}")
        if h.get("pooled_max_abs") is not None:
            parts.append(f"pooled output max abs {fmt_num(h['pooled_max_abs'])}")
        if h["grads"]:
            parts.append(f"grads {h['grads'] - h['grads_failed']}/{h['grads']} ok")
        if not self.entries:
            parts.append("nothing compared")
        return " · ".join(parts)

    def divergence_lines(self) -> list[str]:
        self._ensure_final()
        lines = []
        if self.nonfinite_line():
            lines.append(self.nonfinite_line())
        if self.first_divergence is not None:
            lines.append(self.first_divergence.describe(first=True))
        if self.first_grad_divergence is not None:
            lines.append(self.first_grad_divergence.describe(first=True, backward=True))
        return lines

    # ---- (de)serialisation

    def to_dict(self) -> dict:
        from migrate import __version__

        self._ensure_final()
        return _jsonable({
            "schema_version": self.schema_version,
            "tool": "migrate diff",
            "tool_version": __version__,
            "created": self.created,
            "run": {
                "dtype": self.dtype, "inputs": self.inputs, "seed": self.seed,
                "ref_dir": self.ref_dir, "got_dir": self.got_dir,
                "ref_label": self.ref_label, "got_label": self.got_label,
                "versions": dict(self.versions), "extra": dict(self.extra),
            },
            "thresholds": self.thresholds.to_dict(),
            "summary": self.summary,
            "entries": [e.to_dict(i) for i, e in enumerate(self.entries)],
            "generation": self.generation.to_dict() if self.generation else None,
        })

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, ensure_ascii=False, allow_nan=False) + "\n"

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Report":
        version = d.get("schema_version")
        if version != SCHEMA_VERSION:
            raise MigrateError(f"report schema version {version!r} is not supported (expected {SCHEMA_VERSION})")
        run = d.get("run") or {}
        rep = cls(
            dtype=run.get("dtype", "fp32"), inputs=run.get("inputs", ""), seed=run.get("seed"),
            ref_dir=run.get("ref_dir"), got_dir=run.get("got_dir"),
            ref_label=run.get("ref_label", "reference"), got_label=run.get("got_label", "converted"),
            versions=dict(run.get("versions") or {}), extra=dict(run.get("extra") or {}),
            thresholds=Thresholds.from_dict(d["thresholds"]) if d.get("thresholds") else None,
            created=d.get("created") or _now(),
        )
        rep.entries = [Entry.from_dict(e) for e in d.get("entries") or []]
        if d.get("generation"):
            rep.generation = Generation.from_dict(d["generation"])
        return rep.finalize()


def read_report(path: str | Path) -> Report:
    """Load a report.json (or the folder holding one)."""
    p = Path(path)
    if p.is_dir():
        p = p / "report.json"
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise MigrateError(f"no report at {p}") from None
    except json.JSONDecodeError as exc:
        raise MigrateError(f"{p} is not valid JSON: {exc}") from None
    return Report.from_dict(data)


# --------------------------------------------------------------------------- table rows

_COLUMNS = ("#", "location", "kind", "max abs", "max rel", "mean abs", "cosine",
            "≤1e-3", "top-1", "KL", "status")


def _pct(x: Any) -> str:
    if x is None:
        return "—"
    if isinstance(x, float) and math.isnan(x):
        return "nan"
    return f"{float(x):.2%}"


def _row(e: Entry, i: int, first: bool, backward: bool = False) -> list[str]:
    m = e.metrics
    if e.kind == "generation" and "steps" in m:
        cells = ["—"] * 7
        status_ok = e.headline()
    else:
        cells = [
            fmt_num(m.get("max_abs")), fmt_num(m.get("max_rel")), fmt_num(m.get("mean_abs")),
            fmt_cosine(m.get("cosine")) if e.kind != "loss" else "—",
            _pct(m.get("within_1e-3")), _pct(m.get("top1")), fmt_num(m.get("kl")),
        ]
        status_ok = "ok"
    if e.passed:
        status = status_ok
    else:
        status = f"FAIL: {e.reason}"
    if first:
        status = ("◀ first gradient divergence · " if backward else "◀ first divergence · ") + status
    return [str(i), e.location, e.kind, *cells, status]


def _sections(report: Report) -> list[tuple[str, list[Entry], bool]]:
    out = []
    if report.forward:
        out.append(("Forward", report.forward, False))
    if report.backward:
        out.append(("Backward (gradients and parameters after one step, backward order)",
                    report.backward, True))
    return out


# --------------------------------------------------------------------------- console

def print_table(report: Report, console: Any = None) -> None:
    """Print the entries (one line each; failures red, first divergence marked)
    and a PASS/FAIL summary line with the headline figures, using rich."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    report._ensure_final()
    console = console or Console()
    console.print(Text(f"{report.ref_label} vs {report.got_label} · {report.dtype} · "
                       f"{report.inputs or 'inputs not described'}"
                       + (f" · seed {report.seed}" if report.seed is not None else ""), style="bold"))
    for title, entries, backward in _sections(report):
        table = Table(title=title, title_justify="left", show_lines=False, pad_edge=False)
        for col in _COLUMNS:
            table.add_column(col, justify="left" if col in ("location", "kind", "status") else "right",
                             overflow="fold", no_wrap=col not in ("location", "status"))
        first = report.first_grad_divergence if backward else report.first_divergence
        for e in entries:
            is_first = e is first
            cells = _row(e, report.index_of(e), is_first, backward)
            if is_first:
                style = "bold white on red"
            elif not e.passed:
                style = "red"
            else:
                style = None
            table.add_row(*[Text(c) for c in cells], style=style)
        console.print(table)
    if report.generation is not None:
        g = report.generation
        style = "red" if not g.passed else ("yellow" if g.first_diff_step is not None else "green")
        console.print(Text(g.summary_text(), style=style))
    for line in report.divergence_lines():
        console.print(Text(line, style="bold red"))
    console.print(Text(report.verdict_text(), style="bold green" if report.passed else "bold red"))


# --------------------------------------------------------------------------- plot

_PLOT_FLOOR = 1e-17


def render_plot(report: Report) -> bytes:
    """per_layer_error.png: max abs and 1 - cosine per forward entry, log scale."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    report._ensure_final()
    pts = [e for e in report.forward if e.kind != "generation" and e.metrics.get("max_abs") is not None]
    n = len(pts)
    width = min(max(6.0, 0.28 * n + 2.5), 32.0)
    fig = Figure(figsize=(width, 6.0), dpi=100)
    FigureCanvasAgg(fig)
    ax1, ax2 = fig.subplots(2, 1, sharex=True)
    verdict = "PASS" if report.passed else "FAIL"
    title = f"Per-layer error, forward order · {report.dtype} · {verdict}"
    nf = report.summary.get("nonfinite")
    if nf:
        title += f"\nNaN/Inf from {nf['location']} ({nf['tensors']} tensors; plotted as gaps)"
    fig.suptitle(title)
    if not n:
        ax1.text(0.5, 0.5, "no forward entries", ha="center", va="center", transform=ax1.transAxes)
    else:
        xs = np.arange(n)

        def val(v):
            v = float(v) if v is not None else math.nan
            return max(v, _PLOT_FLOOR) if not math.isnan(v) else math.nan

        mabs = [val(e.metrics.get("max_abs")) for e in pts]
        omc = [val(1.0 - e.metrics["cosine"]) if e.metrics.get("cosine") is not None and e.kind != "loss"
               else math.nan for e in pts]
        ok = np.array([e.passed for e in pts])
        for ax, ys, label in ((ax1, mabs, "max |ref − got|"), (ax2, omc, "1 − cosine")):
            ys = np.array(ys, dtype=float)
            ax.plot(xs, ys, "-", color="#4a78b5", lw=1, alpha=0.6)
            ax.plot(xs[ok], ys[ok], "o", color="#4a78b5", ms=4, label="pass")
            if (~ok).any():
                ax.plot(xs[~ok], ys[~ok], "x", color="#d62728", ms=7, mew=2, label="fail")
            ax.set_yscale("log")
            ax.set_ylabel(label)
            ax.grid(True, which="major", alpha=0.3)
        hb = report.thresholds.bounds("hidden")
        if hb.max_abs is not None:
            ax1.axhline(hb.max_abs, color="#999999", ls=":", lw=1, label=f"hidden bound {hb.max_abs:g} (unit scale)")
        if hb.cosine is not None and hb.cosine < 1:
            ax2.axhline(1 - hb.cosine, color="#999999", ls=":", lw=1, label=f"hidden bound 1 − {hb.cosine:g}")
        if report.first_divergence is not None and report.first_divergence in pts:
            k = pts.index(report.first_divergence)
            for ax in (ax1, ax2):
                ax.axvline(k, color="#d62728", ls="--", lw=1.2)
            ax1.annotate("first divergence", xy=(k, 0.04), xycoords=("data", "axes fraction"),
                         xytext=(4, 0), textcoords="offset points", color="#d62728", fontsize=9,
                         bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "none", "alpha": 0.8})
        if any(v == _PLOT_FLOOR for v in mabs + omc):
            fig.text(0.99, 0.005, f"exact zeros plotted at {_PLOT_FLOOR:g}", ha="right", va="bottom",
                     fontsize=7, color="#666666")
        ax2.set_xticks(xs)
        ax2.set_xticklabels([e.short_label for e in pts], rotation=90, fontsize=7 if n > 30 else 8)
        ax1.legend(loc="upper left", fontsize=8)
        ax2.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


# --------------------------------------------------------------------------- markdown / html

def _md_cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _run_rows(report: Report) -> list[tuple[str, str]]:
    rows = [
        ("dtype", report.dtype),
        ("inputs", report.inputs or "—"),
        ("seed", "—" if report.seed is None else str(report.seed)),
        (f"{report.ref_label} model", report.ref_dir or "—"),
        (f"{report.got_label} model", report.got_dir or "—"),
    ]
    rows += [(f"{k} version", str(v)) for k, v in sorted(report.versions.items())]
    rows += [(str(k), str(v)) for k, v in report.extra.items()]
    rows.append(("created", report.created))
    return rows


def _nonfinite_rows(report: Report) -> list[list[str]]:
    """One row per entry holding NaN / Inf: index, location, each side's counts and first positions."""
    return [[str(report.index_of(e)), e.location, nonfinite_side(e.metrics, "ref", 5),
             nonfinite_side(e.metrics, "got", 5)] for e in report.nonfinite_entries()]


def render_markdown(report: Report, image_name: str = "per_layer_error.png") -> str:
    report._ensure_final()
    out = [f"# Alignment report: {'PASS' if report.passed else 'FAIL'}", "",
           f"**{_md_cell(report.verdict_text())}**", ""]
    for line in report.divergence_lines():
        out.append(f"- {_md_cell(line)}")
    if report.divergence_lines():
        out.append("")
    nonfinite = _nonfinite_rows(report)
    if nonfinite:
        out += ["## NaN / Inf", "", "Any NaN or Inf in a compared tensor fails the comparison by itself.", "",
                f"| # | location | {_md_cell(report.ref_label)} | {_md_cell(report.got_label)} |",
                "|---|---|---|---|"]
        out += ["| " + " | ".join(f"**{_md_cell(c)}**" for c in row) + " |" for row in nonfinite]
        out.append("")
    out += ["## Run", "", "| | |", "|---|---|"]
    out += [f"| {_md_cell(k)} | {_md_cell(v)} |" for k, v in _run_rows(report)]
    out += ["", f"![per-layer error]({image_name})", ""]
    for title, entries, backward in _sections(report):
        first = report.first_grad_divergence if backward else report.first_divergence
        out += [f"## {title}", "", "| " + " | ".join(_COLUMNS) + " |",
                "|" + "|".join("---" for _ in _COLUMNS) + "|"]
        for e in entries:
            cells = _row(e, report.index_of(e), e is first, backward)
            if not e.passed:
                cells = [f"**{_md_cell(c)}**" for c in cells]
            else:
                cells = [_md_cell(c) for c in cells]
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
    if report.generation is not None:
        g = report.generation
        out += ["## Generation", "", _md_cell(g.summary_text()), ""]
        for label, toks in ((report.ref_label, g.ref_tokens), (report.got_label, g.got_tokens)):
            for r, row in enumerate(toks):
                out.append(f"- {label} row {r}: `{' '.join(str(t) for t in row)}`")
        out.append("")
    out += ["## Thresholds", "", f"dtype {report.thresholds.dtype}; None = not checked.", "",
            "| kind | max_abs | max_abs_rel | cosine | top1 | kl | match |",
            "|---|---|---|---|---|---|---|"]
    for kind in KINDS:
        b = report.thresholds.bounds(kind)
        out.append(f"| {kind} | " + " | ".join(
            "—" if v is None else f"{v:g}" for v in (b.max_abs, b.max_abs_rel, b.cosine, b.top1, b.kl, b.match)
        ) + " |")
    out.append("")
    return "\n".join(out)


_CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:2em;color:#222}
h1.pass{color:#1a7f37}h1.fail{color:#cf222e}
table{border-collapse:collapse;margin:1em 0;font-size:13px}
th,td{border:1px solid #d0d7de;padding:3px 8px;text-align:right;white-space:nowrap}
td.l,th.l{text-align:left}td.status{text-align:left;white-space:normal}
tr.fail td{background:#ffebe9;color:#a40e26}
tr.first td{background:#cf222e;color:#fff;font-weight:bold}
.verdict{font-weight:bold;font-size:15px}.div{color:#cf222e;font-weight:bold}
img{max-width:100%;border:1px solid #d0d7de}code{font-size:12px;word-break:break-all}
"""


def render_html(report: Report, png: bytes) -> str:
    report._ensure_final()
    esc = html.escape
    verdict = "PASS" if report.passed else "FAIL"
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>Alignment report: {verdict}</title><style>{_CSS}</style></head><body>",
        f'<h1 class="{verdict.lower()}">Alignment report: {verdict}</h1>',
        f'<p class="verdict">{esc(report.verdict_text())}</p>',
    ]
    for line in report.divergence_lines():
        parts.append(f'<p class="div">{esc(line)}</p>')
    nonfinite = _nonfinite_rows(report)
    if nonfinite:
        parts.append("<h2>NaN / Inf</h2><p>Any NaN or Inf in a compared tensor fails the comparison by "
                     f'itself.</p><table><tr><th>#</th><th class="l">location</th><th class="l">'
                     f'{esc(report.ref_label)}</th><th class="l">{esc(report.got_label)}</th></tr>')
        for row in nonfinite:
            parts.append('<tr class="fail">' + "".join(
                f'<td class="{"l" if i else ""}">{esc(c)}</td>' for i, c in enumerate(row)) + "</tr>")
        parts.append("</table>")
    parts.append("<h2>Run</h2><table>")
    for k, v in _run_rows(report):
        parts.append(f'<tr><th class="l">{esc(k)}</th><td class="l">{esc(v)}</td></tr>')
    parts.append("</table>")
    b64 = base64.b64encode(png).decode("ascii")
    parts.append(f'<h2>Per-layer error</h2><img alt="per-layer error" src="data:image/png;base64,{b64}">')
    for title, entries, backward in _sections(report):
        first = report.first_grad_divergence if backward else report.first_divergence
        parts.append(f"<h2>{esc(title)}</h2><table><tr>")
        parts += [f'<th class="{"l" if c in ("location", "kind", "status") else ""}">{esc(c)}</th>'
                  for c in _COLUMNS]
        parts.append("</tr>")
        for e in entries:
            cells = _row(e, report.index_of(e), e is first, backward)
            cls = "first" if e is first else ("fail" if not e.passed else "")
            parts.append(f'<tr class="{cls}">')
            for c, text in zip(_COLUMNS, cells):
                klass = "status" if c == "status" else ("l" if c in ("location", "kind") else "")
                parts.append(f'<td class="{klass}">{esc(text)}</td>')
            parts.append("</tr>")
        parts.append("</table>")
    if report.generation is not None:
        g = report.generation
        parts.append(f"<h2>Generation</h2><p>{esc(g.summary_text())}</p><ul>")
        for label, toks in ((report.ref_label, g.ref_tokens), (report.got_label, g.got_tokens)):
            for r, row in enumerate(toks):
                parts.append(f"<li>{esc(label)} row {r}: <code>{esc(' '.join(str(t) for t in row))}</code></li>")
        parts.append("</ul>")
    parts.append(f"<h2>Thresholds ({esc(report.thresholds.dtype)})</h2><table><tr>")
    heads = ("kind", "max_abs", "max_abs_rel", "cosine", "top1", "kl", "match")
    parts += [f'<th class="{"l" if h == "kind" else ""}">{h}</th>' for h in heads]
    parts.append("</tr>")
    for kind in KINDS:
        b = report.thresholds.bounds(kind)
        vals = ["—" if v is None else f"{v:g}" for v in (b.max_abs, b.max_abs_rel, b.cosine, b.top1, b.kl, b.match)]
        parts.append(f'<tr><td class="l">{kind}</td>' + "".join(f"<td>{v}</td>" for v in vals) + "</tr>")
    parts.append("</table></body></html>\n")
    return "\n".join(parts)


# --------------------------------------------------------------------------- files

def write_report(report: Report, out_dir: str | Path) -> dict[str, Path]:
    """Write report.json, report.md, per_layer_error.png and report.html into
    out_dir (created if missing), each atomically. Returns {"json", "md", "png",
    "html"} -> paths. An unwritable out_dir is a MigrateError."""
    out = Path(out_dir)
    report.finalize()
    if out.exists() and not out.is_dir():
        raise MigrateError(f"cannot write report: {out} exists and is not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
        paths = {"json": atomic_write_text(out / "report.json", report.to_json())}
        png = render_plot(report)
        paths.update({
            "png": atomic_write_bytes(out / "per_layer_error.png", png),
            "md": atomic_write_text(out / "report.md", render_markdown(report)),
            "html": atomic_write_text(out / "report.html", render_html(report, png)),
        })
    except OSError as exc:
        raise MigrateError(f"cannot write report to {out}: {exc.strerror or exc}") from None
    return paths
