"""One forward of two live sides, recorded and paired: what `migrate diff` compares on an HF
folder against its converted folder, through the same side protocol (`probe.sides.Side`),
recording hooks (`probe.hooks`) and pairing (`probe.pairing`) as every other pair.

`record_forward` runs a side once under hooks that record only the modules its block table
names (plus the model's own outputs, always), so a live diff costs what the compared tensors
cost. `paired_forward` records both sides -- and the reference's float64 twin, in place, when
asked -- and yields what to judge: one `Compared` per paired block in forward order, then the
model outputs both sides return, by HF's output names.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from migrate.errors import MigrateError
from migrate.judge.twin import float64_in_place
from migrate.probe.hooks import hooks
from migrate.probe.pairing import TABLE_BLOCKS, pair
from migrate.probe.recording import ROOT, MemoryRecording
from migrate.probe.sides import Side, call_model

__all__ = ["OUTPUTS", "Compared", "table_modules", "record_forward", "paired_forward"]

# Model outputs compared after the hidden states, by HF's ModelOutput attribute name (the bundled
# models return them in their `OUTPUTS` order): report name and kind.
OUTPUTS = {
    "logits": ("logits", "logits"),
    "loss": ("loss", "loss"),
    "last_hidden_state": ("last hidden state", "hidden"),
    "pooler_output": ("pooled output", "hidden"),
}


@dataclass
class Compared:
    name: str                 # the report's entry name
    kind: str                 # hidden | logits | loss
    block: str | None         # None for a model output (the report names its block)
    layer: int | None
    ref: Any
    got: Any
    exact: Any = None         # the reference's float64 twin's tensor, when it ran


def table_modules(table: dict, num_layers: int, detail: bool) -> set[str]:
    """The module names a block table places (the sub-blocks only with `detail`)."""
    blocks = [b for b in TABLE_BLOCKS if b in table and (detail or b not in ("attention", "mlp"))]
    names = set()
    for block in blocks:
        template = table[block]
        names |= {template.replace("{layer}", str(i)) for i in range(num_layers)} if "{layer}" in template \
            else {template}
    return names


def record_forward(side: Side, inputs, include: set[str] | None = None, model=None,
                   run: Callable[[Any], Any] | None = None) -> MemoryRecording:
    """One forward of `side` (or of `model` in its place: the float64 twin) under recording hooks;
    `run(model)`, when given, runs in place of the plain forward (a gradient pass: its forward is
    the one recorded)."""
    model = side.model if model is None else model
    recording = MemoryRecording(statistics=False)
    with hooks(model, recording, include=None if include is None else include.__contains__):
        if run is not None:
            run(model)
        else:
            call_model(side if model is side.model else Side(side.label, side.kind, side.source, side.framework,
                                                              model), inputs)
    return recording


def _outputs(side: Side, recording: MemoryRecording) -> dict[str, str]:
    """HF output name -> record key of the model's own outputs: HF's ModelOutput fields by name,
    a bundled model's return values by its `OUTPUTS` order."""
    root = {r["index"]: r["key"] for r in recording.records if r["module"] == ROOT and r["io"] == "output"
            and r["call"] == 0}
    if side.framework == "torch":
        return {name: root[name] for name in OUTPUTS if name in root}
    names = tuple(getattr(type(side.model), "OUTPUTS", ("logits", "loss")))
    return {name: root[str(i)] for i, name in enumerate(names) if str(i) in root}


def paired_forward(ref: Side, got: Side, inputs, *, num_layers: int, detail: bool,
                   twin: bool = False, ref_context=contextlib.nullcontext,
                   runs: Mapping[str, Callable[[Any], Any]] | None = None, restore_ref: bool = True) \
        -> Iterator[Compared]:
    """Record `ref` and `got` on `inputs` (and `ref`'s float64 twin with `twin`), pair them by
    their block tables, and yield every compared tensor in forward order. ref_context: entered
    around `ref`'s own forward only (a training run's autocast), not around its twin's. runs: by
    "ref", "got" or "twin", what runs in place of that plain forward, given the model (`record_forward`):
    `migrate diff --grads` records the forward of each gradient pass instead of running one more.
    restore_ref False: the twin is the last use of `ref`'s model, which stays float64 after it
    (`float64_in_place`)."""
    runs = runs or {}
    wanted = {}
    for which, side in (("ref", ref), ("got", got)):
        if not side.align:
            raise MigrateError(f"{side.label} has no block table: migrate diff cannot pair hidden states")
        wanted[which] = table_modules(side.align, num_layers, detail)
        if side.framework == "torch":
            known = {name for name, _ in side.model.named_modules()}
            missing = sorted(wanted[which] - known)
            if missing:
                raise MigrateError(f"HF model has no module {missing[0]} (keymap align table)")
    with ref_context():
        ref_rec = record_forward(ref, inputs, wanted["ref"], run=runs.get("ref"))
    got_rec = record_forward(got, inputs, wanted["got"], run=runs.get("got"))
    exact_rec = None
    if twin:
        with float64_in_place(ref.model, restore=restore_ref) as model:
            exact_rec = record_forward(ref, inputs, wanted["ref"], model=model, run=runs.get("twin"))
    points, _ = pair(ref_rec.records, got_rec.records, ref_align=ref.align, got_align=got.align, detail=detail)
    for p in points:
        if p.ref_module == ROOT:
            continue   # the model's outputs: by name, below
        yield Compared(p.name, "hidden", p.block, p.layer, ref_rec.array(p.ref_key), got_rec.array(p.got_key),
                       None if exact_rec is None else exact_rec.array(p.ref_key))
    ref_out, got_out = _outputs(ref, ref_rec), _outputs(got, got_rec)
    if set(ref_out) != set(got_out):
        raise MigrateError(f"the models return different outputs: HF {', '.join(ref_out)}, "
                           f"MindSpore {', '.join(got_out)}")
    for key, (name, kind) in OUTPUTS.items():   # logits, loss, last hidden state, pooled output
        if key not in ref_out:
            continue
        a, b = ref_rec.array(ref_out[key]), got_rec.array(got_out[key])
        exact = None if exact_rec is None else exact_rec.array(ref_out[key])
        if kind == "loss":
            a, b = np.array(float(a)), np.array(float(b))
            exact = None if exact is None else np.array(float(exact))
        yield Compared(name, kind, None, None, a, b, exact)   # the report names an output's block
