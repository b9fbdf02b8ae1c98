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

from pathlib import Path

import numpy as np

from migrate.align.inputs import Inputs, seeded_inputs
from migrate.align.report import Report
from migrate.align.thresholds import Thresholds
from migrate.dtype_names import PRECISIONS
from migrate.errors import MigrateError
from migrate.judge import fmt_num
from migrate.probe.dump_format import Dump
from migrate.probe.dumping import hooks, versions
from migrate.probe.inputs_file import inputs_sha256, read_inputs
from migrate.probe.pairing import load_mapping, pair
from migrate.probe.recording import MemoryRecording
from migrate.probe.sides import call_model, open_side, side_kind
from migrate.probe.stats import stats_metrics

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

    def inputs(self) -> Inputs | None:
        if not self.dump:
            return None
        path = self.dump.folder / "inputs.npz"
        if not path.is_file():
            raise MigrateError(f"{self.spec}: the dump holds no inputs.npz (recorded without inputs): it cannot be "
                               "paired with another run")
        return read_inputs(path)


def compare_any(ref: str, got: str, *, dtype: str = "fp32", seed: int = 0, batch: int = 2, seq_len: int = 16,
                padded: bool = False, detail: bool = False, statistics: bool = False,
                mapping: str | Path | None = None, thresholds=None,
                keymap: str | None = None, inputs_file: str | Path | None = None,
                dtype_given: bool = False) -> Report:
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
            s.side = open_side(s.spec, dtype, seed, keymap)
            s.align, s.label, s.dtype = s.side.align, s.side.label, dtype
            s.versions = versions(s.side.framework)
    if inputs is None:
        vocab = [s.side.vocab_size for s in sides if s.side and s.side.vocab_size]
        if not vocab:
            raise MigrateError("neither side says its vocabulary size: pass --inputs FILE (from migrate dump)")
        pad = next(s.side.pad_id for s in sides if s.side)
        inputs = seeded_inputs(min(vocab), batch, seq_len, seed, padded, pad_id=pad)
    for s in sides:
        if s.side:
            s.recording = MemoryRecording(statistics, None if inputs.mask is None else inputs.valid)
            with hooks(s.side.model, s.recording):
                call_model(s.side, inputs)
    ref_side, got_side = sides
    points, summary = pair(ref_side.recording.records, got_side.recording.records, ref_align=ref_side.align,
                           got_align=got_side.align, mapping=table, detail=detail)
    # Short strings: report.md and report.html list `extra` in their Run table.
    extra = {"detail": detail, "sides": f"{sides[0].kind} vs {sides[1].kind}", "pairing": summary.lines()[0],
             "paired blocks": "; ".join(f"{b}: {r} ↔ {g} ({c})" for b, r, g, c, _ in summary.paired)}
    if statistics:
        extra["statistics"] = STATS_NOTE
    report = Report(dtype=dtype, inputs=inputs.description, seed=seed, ref_dir=ref, got_dir=got,
                    ref_label=ref_side.label, got_label=got_side.label,
                    versions={"ref": ref_side.versions, "got": got_side.versions},
                    thresholds=_thresholds(thresholds, dtype), extra=extra)
    for p in points:
        if statistics:
            _add_stats(report, p, ref_side.recording.stats(p.ref_key), got_side.recording.stats(p.got_key), dtype)
            continue
        a, b = ref_side.recording.array(p.ref_key), got_side.recording.array(p.got_key)
        if p.kind == "loss":
            report.add(p.name, np.array(float(a)), np.array(float(b)), kind="loss")
        else:
            report.add(p.name, _valid(a, inputs), _valid(b, inputs), kind=p.kind, layer=p.layer, block=p.block)
    report.pairing = summary  # what was paired, how and how surely (`pairing.Summary`; the CLI prints it)
    return report.finalize()


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


def _add_stats(report: Report, p, ref: dict, got: dict, dtype: str) -> None:
    metrics = stats_metrics(ref, got)
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
