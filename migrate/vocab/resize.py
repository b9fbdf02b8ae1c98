"""`migrate vocab resize`: grow (or pad, or trim) the embedding and the output head of a
converted model, and of its HF source with the same new rows, so `migrate diff` still pairs.

New rows are computed once, in fp32, from the converted model's own tensors, then cast to each
side's dtype: `mean` makes every new row the mean of the old rows of that tensor (embedding and
head each their own; HF's `resize_token_embeddings(mean_resizing=True)` samples around that mean,
this keeps it exact so both sides agree bit for bit), `normal` draws N(0, std²) from
`numpy.random.default_rng([seed, k])`, k = 0 for the embedding and 1 for the head. Trimming is
allowed down to the tokenizer's size and the largest special id. Tensors stream one at a time;
every other tensor must keep the shape the new model.yaml implies (a family with another
vocabulary-sized tensor is refused by name). Outputs are built under temporary names and
renamed at the end; the resize is appended to conversion.json's `vocab_resize`.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from migrate import __version__
from migrate.checkpoints.atomic import atomic_output_dir
from migrate.checkpoints.hf_reader import open_hf_checkpoint
from migrate.checkpoints.ms_ckpt import CkptWriter
from migrate.checkpoints.ms_reader import open_ms_checkpoint
from migrate.checkpoints.ms_safetensors import SafetensorsWriter
from migrate.checkpoints.output_guard import check_apart, check_output
from migrate.checkpoints.sharding import DEFAULT_MAX_SHARD, ShardedWriter, parse_size, plan_shards
from migrate.errors import MigrateError
from migrate.hf_config import read_raw_config
from migrate.jsonsafe import load_json
from migrate.models.conversion_plan import ConversionPlan
from migrate.models.registry import load_model_config
from migrate.resources import need_memory
from migrate.sidecar import copy_sidecars
from migrate.vocab.facts import SPECIALS, has_tokenizer, ms_plan, ms_vocab_names, read_tokenizer, vocab_rows_of

INITS = ("mean", "normal")


@dataclass
class ResizeResult:
    old: int
    new: int
    init: str
    std: float | None
    seed: int | None
    outputs: list[Path] = field(default_factory=list)
    record: dict = field(default_factory=dict)

    def describe_init(self) -> str:
        if self.new <= self.old:
            return "rows trimmed"
        return "new rows = mean of the old rows" if self.init == "mean" else \
            f"new rows ~ normal(0, {self.std:g}), seed {self.seed}"


def target_rows(old: int, to: int | None, multiple: int | None) -> int:
    if (to is None) == (multiple is None):
        raise MigrateError("give exactly one of --to N and --pad-to-multiple M")
    if multiple is not None:
        if multiple < 1:
            raise MigrateError(f"--pad-to-multiple must be >= 1, got {multiple}")
        return math.ceil(old / multiple) * multiple
    if to < 1:
        raise MigrateError(f"--to must be >= 1, got {to}")
    return to


def resize_vocab(ms_dir, out_dir, to: int | None = None, multiple: int | None = None, init: str = "mean",
                 std: float | None = None, seed: int = 0, hf: tuple | None = None,
                 overwrite: bool = False, *, trust: bool = False) -> ResizeResult:
    """`trust`: the folder's model class may be imported even if migrate does not bundle it
    (`--trust-model-class`)."""
    ms_dir, out_dir = Path(ms_dir), Path(out_dir)
    if init not in INITS:
        raise MigrateError(f"unknown init {init!r}; choose from {', '.join(INITS)}")
    if not ms_dir.is_dir():
        raise MigrateError(f"converted model folder not found: {ms_dir}")
    hf_dir, hf_out = (Path(hf[0]), Path(hf[1])) if hf else (None, None)
    if hf_dir is not None and not hf_dir.is_dir():
        raise MigrateError(f"HF model folder not found: {hf_dir}")
    check_output(out_dir, overwrite=overwrite, source=ms_dir, inputs=(hf_dir,))
    check_apart(out_dir, (hf_dir,))  # nor inside the HF folder it also reads
    if hf_out is not None:
        check_output(hf_out, overwrite=overwrite, source=hf_dir, inputs=(ms_dir,))
        check_apart(hf_out, (ms_dir,))
        if hf_out.resolve() == out_dir.resolve():
            raise MigrateError(f"the two outputs are the same folder: {out_dir}")

    plan, fields = ms_plan(ms_dir, trust)
    emb, head = ms_vocab_names(plan)
    ckpt = open_ms_checkpoint(ms_dir)
    if emb not in ckpt.specs:
        raise MigrateError(f"{ms_dir} has no {emb}")
    old = ckpt.specs[emb][1][0]
    new = target_rows(old, to, multiple)
    if new == old:
        raise MigrateError(f"{ms_dir} already has {old:,} embedding rows: nothing to resize")
    _check_trim(ms_dir, fields, new)
    config = load_model_config(ms_dir, trust)
    new_config = type(config).from_dict({**config.to_dict(), "vocab_size": new})
    if std is None:
        std = float(fields.get("initializer_range") or 0.02)
    if init == "normal" and not (std > 0 and math.isfinite(std)):
        raise MigrateError(f"--std must be a positive number, got {std}")
    roles = {emb: 0, **({head: 1} if head and head in ckpt.specs else {})}
    shapes = _new_shapes(ckpt.specs, roles, new, ConversionPlan(plan.keymap, new_config, trust))
    need_memory(_resize_bytes(ckpt.specs, roles, old, new), f"resizing to {new:,} rows")  # before any row is made

    result = ResizeResult(old, new, init, std if init == "normal" else None, seed if init == "normal" else None)
    reason = f"--to {to}" if to is not None else f"--pad-to-multiple {multiple}"
    result.record = {"from": old, "to": new, "reason": reason,
                     "init": init if new > old else "trimmed", "tensors": list(roles), "tool": f"migrate {__version__}"}
    if init == "normal" and new > old:
        result.record.update(std=std, seed=seed, rng="numpy.random.default_rng([seed, k]) k: 0 embedding, 1 head")
    rows: dict[int, np.ndarray] = {}  # role -> the new rows (fp32), shared by both sides

    def resized(role: int, array: np.ndarray) -> np.ndarray:
        if new < old:
            return array[:new]
        if role not in rows:
            rows[role] = _new_rows(array, new - old, init, std, seed, role)
        return np.concatenate([array, rows[role].astype(array.dtype)])

    with atomic_output_dir(out_dir, overwrite=overwrite, command="vocab resize", source=ms_dir,
                           inputs=(hf_dir,)) as tmp:
        files = _write_ms(ckpt, tmp, shapes, roles, resized)
        new_config.save(tmp / "model.yaml")
        copy_sidecars(ms_dir, tmp)
        (tmp / "conversion.json").write_text(json.dumps(_conversion(ms_dir, files, shapes, result.record), indent=2)
                                             + "\n")
        if hf_dir is not None:
            with atomic_output_dir(hf_out, overwrite=overwrite, command="vocab resize", source=hf_dir,
                                   inputs=(ms_dir,)) as hf_tmp:
                hf_record = _write_hf(hf_dir, hf_tmp, plan, old, new, resized, result.record)
            result.record["hf"] = {**hf_record, "out": str(hf_out)}
            (tmp / "conversion.json").write_text(
                json.dumps(_conversion(ms_dir, files, shapes, result.record), indent=2) + "\n")
    result.outputs = [out_dir] + ([hf_out] if hf_out is not None else [])
    return result


def _check_trim(ms_dir: Path, fields: dict, new: int) -> None:
    """Trimming may not drop a row a token can reach: the tokenizer's, or a special id's."""
    for name in SPECIALS:
        ids = fields.get(f"{name}_token_id")
        for i in ids if isinstance(ids, list) else [ids]:
            if isinstance(i, int) and i >= new:
                raise MigrateError(f"cannot trim to {new:,} rows: model.yaml's {name}_token_id is {i}")
    if has_tokenizer(ms_dir):
        size = read_tokenizer(ms_dir).size
        if new < size:
            raise MigrateError(f"cannot resize to {new:,} rows: the tokenizer in {ms_dir} has {size:,} tokens")


def _new_shapes(specs: dict, roles: dict, new: int, new_plan: ConversionPlan) -> dict[str, tuple]:
    """Every tensor's shape after the resize, checked against the model the new model.yaml describes."""
    written = new_plan.checkpoint_names
    expected = {written.get(n, n): tuple(s) for n, s in new_plan.expected.items()}
    shapes = {}
    for name, (_, shape) in specs.items():
        shape = (new, *shape[1:]) if name in roles else tuple(shape)
        if name in expected and expected[name] != shape:
            raise MigrateError(f"{name} has shape {tuple(specs[name][1])}, and vocab_size {new} needs "
                               f"{expected[name]}: vocab resize changes only the embedding and the output head")
        shapes[name] = shape
    return shapes


def _resize_bytes(specs: dict, roles: dict, old: int, new: int) -> int:
    """What the resize holds at once: the new fp32 rows of every resized tensor (kept for the HF
    side), and the largest resized tensor whole (old rows and new, concatenated)."""
    def width(name):
        return math.prod(specs[name][1][1:])
    kept = sum(max(new - old, 0) * width(n) * 4 for n in roles)
    return kept + max(new * width(n) * np.dtype(specs[n][0]).itemsize for n in roles)


def _new_rows(array: np.ndarray, count: int, init: str, std: float, seed: int, role: int) -> np.ndarray:
    if init == "mean":
        mean = array.astype(np.float32).mean(axis=0, dtype=np.float64).astype(np.float32)
        return np.broadcast_to(mean, (count, *array.shape[1:])).copy()
    rng = np.random.default_rng([seed, role])
    return rng.normal(0.0, std, size=(count, *array.shape[1:])).astype(np.float32)


def _write_ms(ckpt, tmp: Path, shapes: dict, roles: dict, resized) -> list[str]:
    fmt = ckpt.format
    sizes = [(n, math.prod(shapes[n]) * np.dtype(d).itemsize) for n, (d, _) in ckpt.specs.items()]
    max_shard = DEFAULT_MAX_SHARD[fmt]
    shards = plan_shards(sizes, parse_size(max_shard) if max_shard is not None else None)
    metadata = {"format": "ms", "producer": f"migrate {__version__}"}

    def open_writer(path, names):
        if fmt == "ckpt":
            return CkptWriter(path)
        return SafetensorsWriter(path, [(n, ckpt.specs[n][0], shapes[n]) for n in names], metadata=metadata)

    with ShardedWriter(tmp, fmt, shards, open_writer, {"producer": f"migrate {__version__}"}) as writer:
        for name, array in ckpt.tensors():
            if name in roles:
                array = resized(roles[name], array)
            _put(writer, name, array)
    return writer.files


def _put(writer, name: str, array: np.ndarray) -> None:
    with writer.open_tensor(name, array.dtype, array.shape) as stream:
        stream.write(np.ascontiguousarray(array).reshape(-1).view(np.uint8))


def _conversion(ms_dir: Path, files: list[str], shapes: dict, record: dict) -> dict:
    path = ms_dir / "conversion.json"
    data = load_json(path) if path.is_file() else {}  # bounded: one line naming the file otherwise
    data = data if isinstance(data, dict) else {}
    for entry in data.get("tensors") or []:
        if isinstance(entry, dict) and entry.get("target") in shapes:
            entry["shape"] = list(shapes[entry["target"]])
    data["files"] = files
    data["parameters"] = int(sum(math.prod(s) for s in shapes.values()))
    data["vocab_resize"] = [*(data.get("vocab_resize") or []), record]
    return data


def _write_hf(hf_dir: Path, tmp: Path, plan: ConversionPlan, old: int, new: int, resized, record: dict) -> dict:
    """The HF folder with the same new rows: one model.safetensors, config.json's vocab_size changed."""
    emb, head = vocab_rows_of(plan.keymap)
    raw = read_raw_config(hf_dir)
    with open_hf_checkpoint(hf_dir).add_prefix_if_absent(plan.keymap.base_prefix) as ckpt:
        if emb not in ckpt.specs or ckpt.specs[emb].shape[0] != old:
            have = ckpt.specs[emb].shape[0] if emb in ckpt.specs else "no"
            raise MigrateError(f"{hf_dir}: {emb} has {have} rows, the converted model {old}: not its source")
        roles = {emb: 0, **({head: 1} if head in ckpt.specs else {})}
        specs = [(n, s.numpy_dtype, (new, *s.shape[1:]) if n in roles else tuple(s.shape))
                 for n, s in ckpt.specs.items()]
        with SafetensorsWriter(tmp / "model.safetensors", specs, metadata={"format": "pt"}) as writer:
            for name, _, _ in specs:
                array = ckpt.read(name)
                if name in roles:
                    array = resized(roles[name], array)
                _put(writer, name, array)
    raw["vocab_size"] = new
    (tmp / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
    copy_sidecars(hf_dir, tmp)
    hf_record = {**record, "tensors": list(roles), "source": str(hf_dir)}
    (tmp / "vocab_resize.json").write_text(json.dumps(hf_record, indent=2) + "\n")
    return {"tensors": list(roles), "source": str(hf_dir)}
