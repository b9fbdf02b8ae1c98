"""`migrate compare`'s cross-check of the two runs' effective hyperparameters.

Both sides write effective_hparams.json beside metrics.jsonl, read back from
their live objects (golden/train_torch.py and `migrate train`). A loss curve
alone cannot always tell a one-sided knob (weight decay 0 against 0.1 moves
the fp32 loss by 2e-5 in 40 steps); the files say it outright. So whenever
both files are there -- or named with ``--hparams GOLDEN MS`` for logs from
elsewhere -- every knob both record with the same meaning is compared, and
any difference fails the comparison, named with both values.

Only knobs with one meaning on both sides are compared (`KNOBS`); fields one
side alone records (MindSpore's loss divisor, measured peak
FLOPs, the parallel section but its global batch, class names, paths,
versions) are not, nor how a batch is split into ranks and micro-batches
(the loss and gradient depend on the global batch alone). A knob
absent from either file is listed as not compared. Values are compared
exactly, floats to 1e-12 relative (they are configuration, not results),
dtype spellings through `migrate.dtype_names` (``bfloat16`` = ``bf16``).
"""
from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from migrate.checkpoints.input_folder import InputFolder
from migrate.dtype_names import spelled
from migrate.errors import MigrateError
from migrate.jsonsafe import load_json
from migrate.judge import short

FILE = "effective_hparams.json"
REL = 1e-12
_ABSENT = object()


# ---------- reading knobs out of one file ----------
def _get(data: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(data, dict) or key not in data:
            return _ABSENT
        data = data[key]
    return data


def _dtype(value: Any) -> Any:
    """One spelling for dtypes ('bfloat16', 'mindspore.bfloat16', 'bf16' -> 'bf16'), inside lists too."""
    if isinstance(value, str):
        return spelled(value) or value
    if isinstance(value, list):
        return [_dtype(v) for v in value]
    if isinstance(value, dict):
        return {k: _dtype(v) for k, v in value.items()}
    return value


def _groups(data: dict) -> list[dict] | Any:
    groups = _get(data, "optimizer", "groups")
    return groups if isinstance(groups, list) and all(isinstance(g, dict) for g in groups) else _ABSENT


def _group_value(key: str) -> Callable[[dict], Any]:
    """The groups' common value of a knob (a list when the groups disagree among themselves)."""
    def read(data: dict) -> Any:
        groups = _groups(data)
        if groups is _ABSENT or not groups or any(key not in g for g in groups):
            return _ABSENT
        values = []
        for g in groups:
            if g[key] not in values:
                values.append(g[key])
        return values[0] if len(values) == 1 else values
    return read


def _weight_decay(data: dict) -> Any:
    groups = _groups(data)
    if groups is _ABSENT or any("weight_decay" not in g for g in groups):
        return _ABSENT
    decayed = sorted({float(g["weight_decay"]) for g in groups if g["weight_decay"]})
    return decayed[0] if len(decayed) == 1 else (decayed or 0.0)


def _decayed_numel(data: dict) -> Any:
    """Elements in the decayed groups: layout-free (fused q/k/v count alike) and name-free. Only
    where the run decays at all: with weight decay 0 the split means nothing, and the
    weight_decay row already names that difference."""
    groups = _groups(data)
    if groups is _ABSENT or any("numel" not in g or "weight_decay" not in g for g in groups):
        return _ABSENT
    decayed = [int(g["numel"]) for g in groups if g["weight_decay"]]
    return sum(decayed) if decayed else _ABSENT


def _global_batch(data: dict) -> Any:
    """Sequences per optimizer step: the parallel section's global batch where a run has one (its
    micro batch is per rank), else micro batch x accumulation. How a batch is split into ranks and
    micro-batches does not change the loss or the gradient, so only the total is a knob."""
    recorded = _get(data, "parallel", "global_batch")
    if isinstance(recorded, int) and not isinstance(recorded, bool):
        return recorded
    micro, accum = _get(data, "accumulation", "micro_batch_size"), _get(data, "accumulation", "grad_accum_steps")
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (micro, accum)):
        return _ABSENT
    return micro * accum


def _recompute(data: dict) -> Any:
    # The golden's HF flag and the trainer's per-layer recompute mean the same: activations recomputed.
    for path in (("model", "gradient_checkpointing"), ("model", "recompute")):
        value = _get(data, *path)
        if value is not _ABSENT:
            return bool(value)
    return _ABSENT


def _lora(data: dict) -> Any:
    """A LoRA run's adapter knobs, read from its live adapters (None: a side's file of full training)."""
    lora = data.get("lora")
    if lora is None:
        return None if data.get("side") in ("golden", "mindspore") else _ABSENT
    return {k: v for k, v in lora.items() if k != "base_sha256"} if isinstance(lora, dict) else _ABSENT


def _lora_base(data: dict) -> Any:
    """The fingerprint of the base weights a LoRA run's adapters add to (None: full training)."""
    lora = _lora(data)
    return data["lora"].get("base_sha256", _ABSENT) if isinstance(lora, dict) else lora


def _path(*path: str, dtype: bool = False) -> Callable[[dict], Any]:
    def read(data: dict) -> Any:
        value = _get(data, *path)
        return _dtype(value) if dtype and value is not _ABSENT else value
    return read


# knob -> (reader, what it means). Names follow `migrate hparams` where it has the knob.
KNOBS: dict[str, tuple[Callable[[dict], Any], str]] = {
    "dtype": (_path("config", "dtype", dtype=True), "run precision"),
    "seq_length": (_path("config", "seq_length"), "tokens per row"),
    "total_steps": (_path("config", "total_steps"), "optimizer steps"),
    "global_batch": (_global_batch, "sequences per optimizer step, over all ranks and micro-batches"),
    "seed": (_path("seed"), "init / dropout seed"),
    "data_order_seed": (_path("data", "shuffle_seed"), "seed of the sample order (null: file order)"),
    "betas": (_group_value("betas"), "AdamW betas"),
    "eps": (_group_value("eps"), "AdamW eps"),
    "weight_decay": (_weight_decay, "weight decay of the decayed groups"),
    "decayed_parameters": (_decayed_numel, "elements with weight decay (where both runs decay)"),
    "schedule": (_path("scheduler", "hf_name"), "transformers.get_scheduler name"),
    "num_warmup_steps": (_path("scheduler", "num_warmup_steps"), "warmup steps"),
    "num_training_steps": (_path("scheduler", "num_training_steps"), "schedule length"),
    "schedule_kwargs": (_path("scheduler", "kwargs"), "scheduler_specific_kwargs"),
    "lr": (_path("scheduler", "lr"), "lr of every optimizer step"),
    "clip_max_norm": (_path("clipping", "max_grad_norm"), "clip_grad_norm_ max_norm (null: no clipping)"),
    "clip_eps": (_path("clipping", "eps"), "epsilon of the clip coefficient max_norm / (norm + eps)"),
    "grad_accum_dtype": (_path("accumulation", "grad_dtype", dtype=True),
                         "dtype each micro-batch's gradient is accumulated in"),
    "loss_scale": (_path("loss_scale"), "fp16 dynamic loss scale"),
    "weights_dtype": (_path("model", "weights_dtype", dtype=True), "master weights"),
    "autocast": (_path("model", "autocast", dtype=True), "autocast dtype (null: none)"),
    "recompute": (_recompute, "activation recompute"),
    "tie_word_embeddings": (_path("model", "tie_word_embeddings"), "lm_head tied to the embedding"),
    "dropout": (_path("model", "dropout"), "dropout probabilities"),
    "live.parameter_dtypes": (_path("live_shared", "parameter_dtypes", dtype=True), "parameter dtypes, live"),
    "live.linear_compute_dtypes": (_path("live_shared", "linear_compute_dtypes", dtype=True),
                                   "dtype each layer's linear layers compute in, live"),
    "live.recompute_layers": (_path("live_shared", "recompute_layers"), "layers that recompute, live"),
    "lora": (_lora, "LoRA: rank, alpha, scaling, dropout, rsLoRA, adapted modules, trainable set (null: full)"),
    "lora.base": (_lora_base, "sha256 of the base weights the adapters add to"),
    "health": (_path("health"), "health watch: policy and every threshold"),
}
_LOSS_SCALE_KEYS = ("init_scale", "growth_factor", "backoff_factor", "growth_interval")


# ---------- comparing ----------
@dataclass
class KnobRow:
    knob: str
    golden: Any
    mindspore: Any
    same: bool
    detail: str = ""

    def text(self) -> str:
        return f"{self.knob} (golden {short(self.golden)}, MindSpore {short(self.mindspore)})" + (
            f" [{self.detail}]" if self.detail else "")


@dataclass
class HparamsCheck:
    """The cross-check's outcome; ``skipped`` says why nothing was compared."""

    golden_file: Path | None
    ms_file: Path | None
    rows: list[KnobRow] = field(default_factory=list)
    not_compared: list[str] = field(default_factory=list)   # knobs one file lacks
    skipped: str | None = None
    golden_max_norm: float | None = None   # the golden's clipping.max_grad_norm, for the clip rule
    from_step: int | None = None           # the MindSpore file's live_from_step: its objects were rebuilt there

    @property
    def differing(self) -> list[KnobRow]:
        return [r for r in self.rows if not r.same]

    @property
    def passed(self) -> bool | None:
        return None if self.skipped else not self.differing

    def reason(self) -> str:
        if self.skipped:
            return self.skipped
        if self.differing:
            return "effective hyperparameters differ: " + ", ".join(r.text() for r in self.differing)
        return f"{len(self.rows)} knobs agree"

    def to_dict(self) -> dict:
        return {
            "golden": None if self.golden_file is None else str(self.golden_file),
            "ms": None if self.ms_file is None else str(self.ms_file),
            "skipped": self.skipped,
            "passed": self.passed,
            "differing": [r.knob for r in self.differing],
            "knobs": [{"knob": r.knob, "golden": r.golden, "mindspore": r.mindspore, "same": r.same,
                       "detail": r.detail} for r in self.rows],
            "not_compared": self.not_compared,
        }


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b or (isinstance(a, bool) and isinstance(b, bool) and a == b)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return a == b or abs(a - b) <= REL * max(abs(a), abs(b))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    return a == b


def _row(knob: str, g: Any, m: Any) -> KnobRow:
    if knob == "lr" and isinstance(g, list) and isinstance(m, list):
        if len(g) != len(m):
            return KnobRow(knob, f"{len(g)} steps", f"{len(m)} steps", False, "schedules of different length")
        for i, (a, b) in enumerate(zip(g, m, strict=True)):
            if not _equal(a, b):
                return KnobRow(knob, a, b, False, f"first differs at optimizer step {i + 1}")
        return KnobRow(knob, f"{len(g)} steps", f"{len(m)} steps", True)
    if knob == "loss_scale" and isinstance(g, dict) and isinstance(m, dict):
        g = {k: g.get(k) for k in _LOSS_SCALE_KEYS}   # the "on_overflow" prose is not a knob
        m = {k: m.get(k) for k in _LOSS_SCALE_KEYS}
    if knob == "dropout" and isinstance(g, dict) and isinstance(m, dict):
        shared = sorted(set(g) & set(m))   # each side lists the dropout fields its model has
        g, m = {k: g[k] for k in shared}, {k: m[k] for k in shared}
    if knob == "decayed_parameters":
        return KnobRow(knob, g, m, _equal(g, m), "elements")
    if knob == "lora" and isinstance(g, dict) and isinstance(m, dict):
        keys = sorted(k for k in set(g) | set(m) if not _equal(g.get(k), m.get(k)))
        return KnobRow(knob, g, m, not keys, f"differs in {', '.join(keys)}" if keys else "")
    return KnobRow(knob, g, m, _equal(g, m))


def compare_files(golden_file: Path, ms_file: Path) -> HparamsCheck:
    golden, ms = _load(golden_file, "golden"), _load(ms_file, "mindspore")
    check = HparamsCheck(golden_file, ms_file)
    max_norm = _get(golden, "clipping", "max_grad_norm")
    if isinstance(max_norm, (int, float)) and not isinstance(max_norm, bool) and max_norm > 0:
        check.golden_max_norm = float(max_norm)
    since = ms.get("live_from_step")  # a fault started at that step (`migrate train --fault NAME@K`)
    if isinstance(since, int) and not isinstance(since, bool) and since >= 1:
        check.from_step = since
    for knob, (read, _) in KNOBS.items():
        g, m = read(golden), read(ms)
        if g is _ABSENT or m is _ABSENT:
            check.not_compared.append(knob)
            continue
        check.rows.append(_row(knob, g, m))
    if not check.rows:
        check.skipped = (f"hyperparameters not cross-checked: {golden_file} and {ms_file} share no knob "
                         "(not effective_hparams.json files of migrate's sides?)")
    return check


def recorded_dtype(check: HparamsCheck) -> str | None:
    """The run precision the files record: the golden's where both have it (a mismatch fails the
    cross-check itself), else the one file's that does; None where neither records one."""
    row = next((r for r in check.rows if r.knob == "dtype"), None)
    if row is not None:
        return row.golden if isinstance(row.golden, str) else None
    for path, side in ((check.golden_file, "golden"), (check.ms_file, "mindspore")):
        if path is not None and check.skipped:
            try:
                value = KNOBS["dtype"][0](_load(path, side))
            except MigrateError:
                continue  # the cross-check was skipped: a file it never read does not stop the comparison
            if isinstance(value, str):
                return value
    return None


def _load(path: Path, side: str) -> dict:
    try:
        data = load_json(Path(path))
    except FileNotFoundError:
        raise MigrateError(f"{path}: no such file ({side} effective hyperparameters)") from None
    except (OSError, UnicodeDecodeError) as e:
        raise MigrateError(f"{path}: cannot read ({getattr(e, 'strerror', None) or e})") from None
    except json.JSONDecodeError as e:
        raise MigrateError(f"{path}: not JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(data, dict):
        raise MigrateError(f"{path}: expected a JSON object of hyperparameters")
    recorded = data.get("side")
    if isinstance(recorded, str) and recorded != side:
        raise MigrateError(f"{path} is the {recorded} side's effective hyperparameters, given as the {side} side's "
                           "(--hparams takes the golden's file first)")
    return data


def cross_check(golden_metrics: Path, ms_metrics: Path, files: tuple[Any, Any] | None = None) -> HparamsCheck:
    """Compare the runs' effective_hparams.json: `files` if given, else the ones beside each metrics.jsonl.

    Named files that are missing or unreadable are a `MigrateError`; files that are merely absent
    beside a log skip the check, saying so."""
    if files is not None:
        golden_file, ms_file = (Path(f) for f in files)
        return compare_files(golden_file, ms_file)
    golden_file, ms_file = Path(golden_metrics).parent / FILE, Path(ms_metrics).parent / FILE
    for f in (golden_file, ms_file):  # the reader rule: a folder, FIFO or link out of the run is refused, not skipped
        InputFolder(f.parent, "run folder").optional(FILE)
    missing = [str(f) for f in (golden_file, ms_file) if not f.is_file()]
    if missing:
        return HparamsCheck(golden_file if golden_file.is_file() else None,
                            ms_file if ms_file.is_file() else None,
                            skipped=f"hyperparameters not cross-checked: {' and '.join(missing)} not found "
                                    "(pass --hparams GOLDEN MS to name the files)")
    return compare_files(golden_file, ms_file)
