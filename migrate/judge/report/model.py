"""`Report`: the judged entries of one `migrate diff` run in order, the first divergence, the
verdict line and report.json's schema.

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

Each entry is judged when added (`judge.checks.tensor_checks` with ``rep.thresholds``).
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
                         ref_token, got_token, judged, passed, reason},
     checks: [{key, label, value, limit, passed, step, noise, detail}]}   (figures that are no
     tensor, e.g. a replay's grad norm, clip factor and lr: part of the verdict)

Non-finite floats are written as the strings "nan", "inf", "-inf", so the
file is strict JSON; `Report.from_dict` turns them back into floats.

NaN / Inf: any non-finite element in any compared tensor, on either side,
fails its entry (`judge.checks`). ``summary.nonfinite`` names the first such
tensor -- forward entries first, in forward order, then backward entries in
backward order -- with each side's NaN / Inf counts and first positions
(``at``: indices into the compared tensor) and how many tensors hold any;
the verdict line, the console, report.md and report.html say it in words.
Each entry's metrics carry ``finite_compared`` (positions finite on both
sides: what max abs / cosine were computed over; with none they are NaN).
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from migrate import __version__
from migrate.dtype_names import canonical_dtype
from migrate.errors import MigrateError
from migrate.jsonsafe import jsonable as _jsonable
from migrate.judge import Check, Verdict, fmt_cosine, fmt_num
from migrate.judge.checks import nonfinite_count, nonfinite_summary, nonfinite_text, tensor_checks
from migrate.judge.jsonfile import dumps
from migrate.judge.metrics import generation_metrics, logits_metrics, tensor_metrics, tensor_metrics_among, token_rows
from migrate.judge.noise import TWIN, error_figures, error_of, error_ratio, noise_figures, noise_of, tie_margin
from migrate.judge.report.entries import DIRECTIONS, STATE_KINDS, Entry, Generation, layer_of
from migrate.judge.thresholds import KINDS, Thresholds

__all__ = ["SCHEMA_VERSION", "Report"]

SCHEMA_VERSION = 1
# report.reference's sources beside the float64 twin and the fallback: a training-state diff's bounds come
# from a noise run (a third state) or are the fixed ones (`migrate.state_diff.noise`); `text` says which
NOISE_RUN, FIXED = "noise run", "fixed"
RESIDUAL_BLOCK = "layer output"   # a layer's output: the residual stream, whose max-abs limit carries on


def _peak(array: Any) -> float:
    """The largest finite magnitude of an array of any float dtype (bf16 included)."""
    a = np.asarray(array).astype(np.float64)
    a = np.abs(a[np.isfinite(a)])
    return float(a.max()) if a.size else 0.0


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).replace(microsecond=0).isoformat()


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
    # where the bounds came from (`judge.noise`): {"source": "float64 twin", "of": label} for a
    # measured noise reference, {"source": "fallback", "factor": f, "why": text} for the scaled
    # fixed bounds, {} for the fixed bounds as they are
    reference: dict = field(default_factory=dict)
    created: str = field(default_factory=_now)
    schema_version: int = SCHEMA_VERSION
    entries: list = field(default_factory=list)
    generation: Generation | None = None
    # judged figures that are no tensor (`migrate replay`'s grad norm, clip factor, lr, accumulation): `Check`s,
    # part of the verdict, rendered as their own table
    checks: list = field(default_factory=list)
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
        self._own_errors: list = []   # (entry, the other side's own error vs the twin)

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
            direction = "backward" if kind in ("grad", "param_after_step", *STATE_KINDS) else "forward"
        if direction not in DIRECTIONS:
            raise ValueError(f"direction must be 'forward' or 'backward', got {direction!r}")
        if block is None:
            block = {"logits": "logits", "loss": "loss", "generation": "generation"}.get(kind, name)
        if layer is None and kind in ("grad", "param_after_step", *STATE_KINDS):
            layer = layer_of(name)
        metrics = dict(metrics)
        if kind == "hidden" and block == RESIDUAL_BLOCK and layer is not None and "carried" not in metrics:
            carried = self._stream_limit(int(layer) - 1)
            if carried is not None:
                metrics["carried"] = carried
        verdict = Verdict(tensor_checks(metrics, kind, self.thresholds))
        entry = Entry(name=name, kind=kind, block=block, direction=direction,
                      layer=None if layer is None else int(layer), metrics=metrics,
                      passed=verdict.passed, reason=verdict.reasons(), checks=verdict.checks,
                      order=self._next_order(direction) if order is None else order)
        self.entries.append(entry)
        self._finalized = False
        return entry

    def _stream_limit(self, layer: int) -> dict | None:
        """The max-abs limit layer `layer`'s output was held to, and where (`bounds.carried_limit`)."""
        for e in reversed(self.entries):
            if e.kind == "hidden" and e.block == RESIDUAL_BLOCK and e.layer == layer:
                limit = next((c.limit for c in e.checks if c.key == "max_abs"), None)
                return None if limit is None else {"max_abs": float(limit), "from": e.location}
        return None

    def add(self, name: str, ref: Any, got: Any, *, kind: str = "hidden",
            layer: int | None = None, block: str | None = None,
            direction: str | None = None, order: float | None = None,
            exact: Any = None, noise: Mapping[str, Any] | None = None) -> Entry:
        """Compare two arrays (`logits_metrics` for logits / generation kinds,
        `tensor_metrics` otherwise), judge and append. Returns the entry.

        The noise reference (`judge.noise`): `exact`, the reference's float64 twin's tensor,
        or `noise`, its figures measured elsewhere (a dump); the bounds then widen to the
        reference's own error, and with `exact` the other side's own error is measured too."""
        if kind not in KINDS:
            raise ValueError(f"unknown entry kind {kind!r}; expected one of {', '.join(KINDS)}")
        logits = kind in ("logits", "generation")
        got_error = None
        if exact is not None and not logits:
            # The three pairs among (twin, reference, other side) in one pass over the three arrays.
            twin_ref, twin_got, metrics = tensor_metrics_among((exact, ref, got), ((0, 1, True), (0, 2, False),
                                                                                   (1, 2, True)))
            noise, got_error = noise_of(twin_ref), error_of(twin_got)
        elif exact is not None:
            noise = noise_figures(ref, exact, logits=logits)
            got_error = error_figures(got, exact)
        if logits:
            margin = tie_margin(noise, self.thresholds.bounds(kind).widens("top1"), self.dtype,
                                _peak(ref)) if noise else None
            metrics = logits_metrics(ref, got, tie_margin=margin)
        elif exact is None:
            metrics = tensor_metrics(ref, got)
        if noise and not noise.get("error"):
            metrics["noise"] = dict(noise)
        entry = self.add_metrics(name, metrics, kind=kind, layer=layer, block=block, direction=direction, order=order)
        if got_error:  # live runs only (a dump keeps no twin): kept beside the judged metrics, which dumps reproduce
            self._own_errors.append((entry, got_error))
        return entry

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

    def finalize(self) -> Report:
        """Compute passed, first divergences and the headline figures."""
        fwd, bwd = self.forward, self.backward
        self.first_divergence = next((e for e in fwd if not e.passed), None)
        self.first_grad_divergence = next((e for e in bwd if not e.passed), None)
        failed = [e for e in self.entries if not e.passed]
        self.passed = self.verdict.passed

        logits = next((e for e in reversed(fwd) if e.kind == "logits"), None)
        loss = next((e for e in reversed(fwd) if e.kind == "loss"), None)
        grads = [e for e in bwd if e.kind == "grad"]
        states = [e for e in bwd if e.kind in STATE_KINDS]
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
            "states": len(states),
            "states_failed": sum(1 for e in states if not e.passed),
        }
        # Encoders without logits (BertModel): their final outputs stand in the headline.
        for key, name in (("last_hidden_max_abs", "last hidden state"), ("pooled_max_abs", "pooled output")):
            entry = next((e for e in fwd if e.name == name), None)
            if entry is not None:
                headline[key] = entry.metrics.get("max_abs")
        if loss is not None and loss.metrics.get("ref_max_abs") is not None:
            headline["loss_ref"] = loss.metrics.get("ref_max_abs")
        headline.update(self._noise_headline(fwd + bwd))
        if self._own_errors:
            self.reference.update(self._own_error_figures())

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

    @staticmethod
    def _noise_headline(entries: list[Entry]) -> dict:
        """The largest difference over the reference's own error, and where: what "within noise"
        means in this run."""
        diff = [(e.noise_ratio, e) for e in entries if e.noise_ratio is not None]
        out: dict[str, Any] = {"noise_entries": len(diff)}
        if diff:
            r, e = max(diff, key=lambda t: t[0])
            out.update(noise_ratio_max=r, noise_ratio_at=e.location)
        return out

    def _own_error_figures(self) -> dict:
        """The other side's own RMS error vs the float64 twin over the reference's (median, worst):
        "MindSpore's error is 1.3x torch's own"."""
        own = [(r, e) for e, got in self._own_errors
               if (r := error_ratio({"noise": e.metrics.get("noise"), "got_error": got})) is not None
               and math.isfinite(r)]
        if not own:
            return {}
        ratios = sorted(r for r, _ in own)
        r, e = max(own, key=lambda t: t[0])
        return {"error_ratio_median": ratios[len(ratios) // 2], "error_ratio_max": r, "error_ratio_at": e.location}

    def reference_line(self) -> str | None:
        """Where the bounds came from, in one line (printed under the verdict)."""
        self._ensure_final()
        ref, h = self.reference or {}, self.summary["headline"]
        if ref.get("source") == "fallback":
            return (f"bounds: the fixed ones × {ref['factor']:.3g} for this depth and width "
                    f"(no float64 reference: {ref.get('why', 'not measured')})")
        if ref.get("source") in (NOISE_RUN, FIXED):
            return ref.get("text")
        if ref.get("source") != TWIN or not h.get("noise_entries"):
            return None
        text = f"noise reference: {ref.get('of', self.ref_label)} in float64 on the same inputs"
        if ref.get("error_ratio_max") is not None:
            text += (f"; {self.got_label}'s own RMS error vs float64 is {ref['error_ratio_median']:.2g}× "
                     f"{self.ref_label}'s (median), at most {ref['error_ratio_max']:.2g}× ({ref['error_ratio_at']})")
        if h.get("noise_ratio_max") is not None:
            text += (f"; largest difference {h['noise_ratio_max']:.2g}× the reference's own error "
                     f"({h['noise_ratio_at']})")
        return text

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

    @property
    def verdict(self) -> Verdict:
        """One check per compared tensor, forward order then backward: the report passes when
        every entry passes, and fails when nothing was compared."""
        checks = [Check(e.kind, e.location, passed=e.passed, detail=e.reason or "")
                  for e in self.forward + self.backward] + list(self.checks)
        return Verdict(checks or [Check("entries", "tensors compared", value=0, limit=1, passed=False,
                                        detail="nothing compared")])

    @property
    def exit_code(self) -> int:
        return self.verdict.exit_code

    def _ensure_final(self) -> None:
        if not getattr(self, "_finalized", False):
            self.finalize()

    def verdict_text(self) -> str:
        """One line: "PASS · logits max abs … · cosine … · top-1 … · KL … · loss rel diff …"."""
        self._ensure_final()
        h = self.summary["headline"]
        parts = []
        nf = self.summary.get("nonfinite")
        if nf:
            parts.append(nonfinite_summary(nf, self.ref_label, self.got_label))
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
        if h.get("states"):
            parts.append(f"training state {h['states'] - h['states_failed']}/{h['states']} ok")
        if self.checks:
            judged = [c for c in self.checks if c.passed is not None]
            parts.append(f"checks {sum(1 for c in judged if c.passed)}/{len(judged)} ok")
        source = (self.reference or {}).get("source")
        if source == TWIN and h.get("noise_entries"):
            parts.append("bounds from the float64 noise reference")
        elif source == NOISE_RUN:
            parts.append("bounds from the noise run")
        elif source == "fallback":
            parts.append(f"no float64 reference: fixed bounds × {self.reference['factor']:.3g} for depth and width")
        if not self.entries:
            parts.append("nothing compared")
        return self.verdict.line(*parts)

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
                "versions": dict(self.versions), "extra": dict(self.extra), "reference": dict(self.reference),
            },
            "thresholds": self.thresholds.to_dict(),
            "summary": self.summary,
            "entries": [e.to_dict(i) for i, e in enumerate(self.entries)],
            "generation": self.generation.to_dict() if self.generation else None,
            "checks": [c.to_dict() for c in self.checks],
        })

    def to_json(self) -> str:
        return dumps(self.to_dict())

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Report:
        version = d.get("schema_version")
        if version != SCHEMA_VERSION:
            raise MigrateError(f"report schema version {version!r} is not supported (expected {SCHEMA_VERSION})")
        run = d.get("run") or {}
        rep = cls(
            dtype=run.get("dtype", "fp32"), inputs=run.get("inputs", ""), seed=run.get("seed"),
            ref_dir=run.get("ref_dir"), got_dir=run.get("got_dir"),
            ref_label=run.get("ref_label", "reference"), got_label=run.get("got_label", "converted"),
            versions=dict(run.get("versions") or {}), extra=dict(run.get("extra") or {}),
            reference=dict(run.get("reference") or {}),
            thresholds=Thresholds.from_dict(d["thresholds"]) if d.get("thresholds") else None,
            created=d.get("created") or _now(),
        )
        rep.entries = [Entry.from_dict(e) for e in d.get("entries") or []]
        if d.get("generation"):
            rep.generation = Generation.from_dict(d["generation"])
        fields = {f.name for f in dataclasses.fields(Check)}
        rep.checks = [Check(**{k: v for k, v in c.items() if k in fields}) for c in d.get("checks") or []
                      if isinstance(c, Mapping)]
        return rep.finalize()
