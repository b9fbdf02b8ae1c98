"""`migrate diff` on any pair: two live sides (an HF folder, a converted folder or the user's
`module:factory`), two dump folders from any machines, or one of each. Modules are paired by
`pairing`; every paired tensor is judged by `align`'s metrics, thresholds and report, so the
figures, first divergence, formats and exit codes are `migrate diff`'s own.

Statistics mode (a statistics dump on either side, or ``statistics=True``): each tensor is
compared through its summary (`probe.stats`): ``max abs`` is the lower bound the statistics
and the sketch give, judged against the usual max-abs bound; cosine, top-1 and KL are not measured; in
bf16 / fp16, whose tensors have no max-abs bound, the L2 norms' relative difference is held
to `STATS_L2_REL`. The report says so (``run.extra.statistics``).
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from migrate.dtype_names import PRECISIONS
from migrate.errors import MigrateError
from migrate.judge import fmt_num
from migrate.judge.noise import TWIN
from migrate.judge.report import Report
from migrate.judge.thresholds import Thresholds, fallback_factor
from migrate.probe.dump_format import Dump
from migrate.probe.dumping import hooks, versions
from migrate.probe.inputs import Inputs, seeded_inputs
from migrate.probe.inputs_file import check_vocab, inputs_sha256, read_inputs
from migrate.probe.pairing import load_mapping, pair
from migrate.probe.recording import MemoryRecording
from migrate.probe.sides import call_model, open_side, side_kind
from migrate.probe.stats import stats_metrics
from migrate.probe.twin import twin_recording

STATS_L2_REL = {"fp32": None, "fp16": 5e-3, "bf16": 2e-2}  # None: the max-abs bound judges
STATS_NOTE = ("statistics mode: max abs is a lower bound, from the min/max/mean/L2 statistics and a 64-way "
              "random-sign sketch of each tensor (the difference's RMS ÷ 1.5); cosine, top-1, KL and the "
              "within-shares need full tensors and are not measured")


class _Opened:
    """One side, live or dumped: its recording, block table, label, dtype and inputs."""

    def __init__(self, spec: str, kind: str):
        self.spec, self.kind = spec, kind
        self.dump = Dump(spec) if kind == "dump" else None
        self.side = None
        self.recording = self.dump
        manifest = self.dump.manifest if self.dump else {}
        self.align = manifest.get("align")
        self.dtype = manifest.get("dtype")
        self.versions = manifest.get("versions") or {}
        side = manifest.get("side") or {}
        self.label = (side.get("label") or manifest.get("framework", "dump")) + " dump" if self.dump else None
        self.reference = manifest.get("reference") if isinstance(manifest.get("reference"), dict) else None

    def inputs(self) -> Inputs | None:
        if not self.dump:
            return None
        path = self.dump.inputs_path()
        if path is None:
            raise MigrateError(f"{self.spec}: the dump holds no inputs.npz (recorded without inputs): it cannot be "
                               "paired with another run")
        return read_inputs(path)


def diff_pair(ref: str, got: str, *, dtype: str = "fp32", seed: int = 0, batch: int = 2, seq_len: int = 16,
              padded: bool = False, detail: bool = False, statistics: bool = False,
              mapping: str | Path | None = None, thresholds=None,
              keymap: str | None = None, inputs_file: str | Path | None = None,
              dtype_given: bool = False, reference: str = "fp64", trust: bool = False) -> Report:
    """`reference`: "fp64" runs a live torch side's float64 twin (`probe.twin`); a dump brings the
    noise it recorded. Where neither side has one, the fixed bounds scale for depth and width.
    `trust`: a converted folder's model class may be imported even if migrate does not bundle it."""
    sides = [_Opened(spec, side_kind(spec)) for spec in (ref, got)]
    dumped = [s for s in sides if s.dump]
    dtypes = {s.dtype for s in dumped}
    if len(dtypes) > 1:
        raise MigrateError(f"the dumps ran in different dtypes ({' vs '.join(sorted(map(str, dtypes)))}); "
                           "dump both sides in one dtype")
    if dumped:
        if dtype_given and dtypes != {dtype}:
            raise MigrateError(f"--dtype {dtype} but the dump ran in {next(iter(dtypes))}")
        dtype = next(iter(dtypes)) or dtype
    if dtype not in PRECISIONS:
        raise MigrateError(f"unknown dtype {dtype!r}; choose from {', '.join(PRECISIONS)}")
    statistics = statistics or any(s.dump.statistics for s in dumped)
    inputs = _shared_inputs(sides, inputs_file)
    table = load_mapping(mapping) if mapping else None
    for s in sides:
        if not s.dump:
            s.side = open_side(s.spec, dtype, seed, keymap, trust)
            s.align, s.label, s.dtype = s.side.align, s.side.label, dtype
            s.versions = versions(s.side.framework)
            if inputs is not None:  # from a dump or --inputs FILE: within this model's vocabulary
                check_vocab(inputs, s.side.vocab_size, inputs_file or "the dump's inputs.npz")
    if inputs is None:
        vocab = [s.side.vocab_size for s in sides if s.side and s.side.vocab_size]
        if not vocab:
            raise MigrateError("neither side says its vocabulary size: pass --inputs FILE (from migrate dump)")
        pad = next(s.side.pad_id for s in sides if s.side)
        inputs = seeded_inputs(min(vocab), batch, seq_len, seed, padded, pad_id=pad)
    for s in sides:
        if s.side:
            side = s.side
            noise, s.reference = twin_recording(side, inputs,
                                                lambda m, side=side: call_model(replace(side, model=m), inputs),
                                                reference)
            s.recording = MemoryRecording(statistics, None if inputs.mask is None else inputs.valid, noise=noise)
            with hooks(s.side.model, s.recording):
                call_model(s.side, inputs)
    ref_side, got_side = sides
    points, summary = pair(ref_side.recording.records, got_side.recording.records, ref_align=ref_side.align,
                           got_align=got_side.align, mapping=table, detail=detail)
    noise_of = _noise_lookup(ref_side, got_side)
    thresholds = _thresholds(thresholds, dtype)
    ref_info = _reference_info(sides, any(noise_of(p) for p in points))
    if ref_info["source"] == "fallback":
        ref_info["factor"] = fallback_factor(*_model_size(points, ref_side.recording))
        thresholds = thresholds.scaled(ref_info["factor"])
    # Short strings: report.md and report.html list `extra` in their Run table.
    extra = {"detail": detail, "sides": f"{sides[0].kind} vs {sides[1].kind}", "pairing": summary.lines()[0],
             "paired blocks": "; ".join(f"{b}: {r} ↔ {g} ({c})" for b, r, g, c, _ in summary.paired)}
    if statistics:
        extra["statistics"] = STATS_NOTE
    report = Report(dtype=dtype, inputs=inputs.description, seed=seed, ref_dir=ref, got_dir=got,
                    ref_label=ref_side.label, got_label=got_side.label,
                    versions={"ref": ref_side.versions, "got": got_side.versions},
                    thresholds=thresholds, extra=extra, reference=ref_info)
    for p in points:
        noise = noise_of(p)
        if statistics:
            _add_stats(report, p, ref_side.recording.stats(p.ref_key), got_side.recording.stats(p.got_key), dtype,
                       noise)
            continue
        a, b = ref_side.recording.array(p.ref_key), got_side.recording.array(p.got_key)
        if p.kind == "loss":
            report.add(p.name, np.array(float(a)), np.array(float(b)), kind="loss", noise=noise)
        else:
            report.add(p.name, _valid(a, inputs), _valid(b, inputs), kind=p.kind, layer=p.layer, block=p.block,
                       noise=noise)
    report.pairing = summary  # what was paired, how and how surely (`pairing.Summary`; the CLI prints it)
    return report.finalize()


def _noise_lookup(ref_side: _Opened, got_side: _Opened):
    """A paired point's noise figures: the reference side's own error vs its float64 twin, or the
    other side's where only that one was measured (the bound is symmetric in the two sides)."""
    def noise_of(p) -> dict | None:
        return ref_side.recording.noise(p.ref_key) or got_side.recording.noise(p.got_key)
    return noise_of


def _reference_info(sides, measured: bool) -> dict:
    """report.reference: the side whose twin measured the noise, or the fallback and why."""
    if measured:
        side = next(s for s in sides if (s.reference or {}).get("source") == TWIN)
        return {"source": TWIN, "of": side.reference.get("of") or side.label}
    reasons = [f"{s.label}: {(s.reference or {}).get('refused') or 'dumped without one'}" for s in sides]
    return {"source": "fallback", "why": "; ".join(reasons)}


def _model_size(points, recording) -> tuple[int | None, int | None]:
    """(decoder layers, hidden width) from what was paired: the fallback bounds scale with both."""
    layers = [p.layer for p in points if p.layer is not None]
    shapes = {r["key"]: r.get("shape") for r in recording.records}
    hidden = next((shapes.get(p.ref_key) for p in points if p.kind == "hidden" and shapes.get(p.ref_key)), None)
    return (max(layers) + 1 if layers else None), (int(hidden[-1]) if hidden else None)


def _thresholds(given, dtype: str) -> Thresholds:
    """`given`: Thresholds, a function of the dtype (the dumps' own dtype is known late), or None."""
    if given is None:
        return Thresholds.for_dtype(dtype)
    return given(dtype) if callable(given) else given


def _valid(array: np.ndarray, inputs: Inputs) -> np.ndarray:
    """As `align.runner`: padded query rows are not compared."""
    if inputs.mask is None or array.shape[:2] != inputs.ids.shape:
        return array
    return array[inputs.valid]


def _add_stats(report: Report, p, ref: dict, got: dict, dtype: str, noise: dict | None = None) -> None:
    metrics = stats_metrics(ref, got)
    if noise and not metrics.get("error"):
        metrics["noise"] = dict(noise)
    entry = report.add_metrics(p.name, metrics, kind=p.kind, layer=p.layer, block=p.block)
    bound = STATS_L2_REL.get(dtype)
    rel = metrics.get("rel_l2")
    if bound is not None and rel is not None and not rel <= bound and not metrics.get("error"):
        text = f"L2 norm rel diff {fmt_num(rel)} > {fmt_num(bound)} (statistics)"
        entry.passed = False
        entry.reason = f"{entry.reason}; {text}" if entry.reason else text


def _shared_inputs(sides, inputs_file) -> Inputs | None:
    found = [(s.spec, s.inputs()) for s in sides if s.dump]
    if inputs_file is not None and Path(inputs_file).is_file():
        found.append((str(inputs_file), read_inputs(inputs_file)))
    if not found:
        return None
    digests = {spec: inputs_sha256(x) for spec, x in found}
    if len(set(digests.values())) > 1:
        raise MigrateError("the sides were fed different inputs (sha256 "
                           + ", ".join(f"{spec}: {d[:12]}" for spec, d in digests.items())
                           + "); dump the second side with --inputs FILE from the first")
    return found[0][1]
