"""`migrate convert`: HF checkpoint folder -> MindSpore checkpoint folder.

Driven entirely by a keymap. Coverage is checked against the bundled model's
own parameters before any data moves, tensors stream one at a time, and the
output folder appears under its final name only when complete.
"""
from __future__ import annotations

import hashlib
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from migrate import __version__
from migrate.checkpoints.atomic import atomic_output_dir
from migrate.checkpoints.dtypes import CLI_DTYPES, COMPUTE_DTYPE, SAFETENSORS_TO_NUMPY, cast, short_name
from migrate.checkpoints.hf_reader import open_hf_checkpoint
from migrate.errors import CoverageError, MigrateError
from migrate.hf_config import load_hf_config, read_raw_config
from migrate.keymap import Keymap
from migrate.models.config import LlamaConfig
from migrate.models.registry import MODEL_CLASS_FIELD, build_model, parameter_shapes
from migrate.sidecar import copy_sidecars

FORMATS = {"ckpt": "model.ckpt", "safetensors": "model.safetensors"}


@dataclass
class ConversionResult:
    out_dir: Path
    checkpoint: Path
    config: LlamaConfig
    tensors: int = 0
    parameters: int = 0
    bytes_written: int = 0
    seconds: float = 0.0
    records: list[dict] = field(default_factory=list)


def convert(
    src_dir: str | Path,
    out_dir: str | Path,
    keymap: str = "hf_llama",
    fmt: str = "ckpt",
    dtype: str = "keep",
    overwrite: bool = False,
    on_tensor: Callable[[str, int, int], None] | None = None,
) -> ConversionResult:
    started = time.perf_counter()
    src, out = Path(src_dir), Path(out_dir)
    if fmt not in FORMATS:
        raise MigrateError(f"unknown format {fmt!r}; choose from {', '.join(FORMATS)}")
    if dtype != "keep" and dtype not in CLI_DTYPES:
        raise MigrateError(f"unknown dtype {dtype!r}; choose from keep, {', '.join(CLI_DTYPES)}")
    if not src.is_dir():
        raise MigrateError(f"model folder not found: {src}")
    if out.resolve() == src.resolve() or src.resolve() in out.resolve().parents:
        raise MigrateError("output folder must not be the model folder or inside it")
    if out.exists() and not overwrite:  # fail before any heavy work
        raise MigrateError(f"output {out} already exists (pass --overwrite to replace it)")

    km = Keymap.load(keymap)
    km.check_source(read_raw_config(src))
    ms_fields = km.hf_to_ms_config(load_hf_config(src))
    ckpt = open_hf_checkpoint(src)

    out_dtype = _choose_dtype(ckpt, dtype)
    ms_fields["compute_dtype"] = COMPUTE_DTYPE[out_dtype]
    ms_fields[MODEL_CLASS_FIELD] = km.target
    config = LlamaConfig.from_dict(ms_fields)
    expected = parameter_shapes(build_model(config))

    pairs, tied = km.pairs(config.to_dict())
    _check_coverage(ckpt, pairs, tied, km.ignored(config.to_dict()), expected)

    result = ConversionResult(out, out / FORMATS[fmt], config)
    with atomic_output_dir(out, overwrite=overwrite) as tmp:
        position = {name: i for i, name in enumerate(expected)}
        ordered = sorted(pairs, key=lambda p: position.get(p.dst, len(position)))
        writer = _open_writer(fmt, tmp / FORMATS[fmt], ordered, ckpt, out_dtype, expected)
        with writer:
            for i, pair in enumerate(ordered):
                array = cast(ckpt.read(pair.src), out_dtype)
                writer.write(pair.dst, array)
                result.tensors += 1
                result.parameters += int(array.size)
                result.bytes_written += int(array.nbytes)
                result.records.append({
                    "source": pair.src, "target": pair.dst, "shape": list(array.shape),
                    "source_dtype": short_name(SAFETENSORS_TO_NUMPY[ckpt.specs[pair.src].dtype]),
                    "dtype": short_name(array.dtype),
                })
                if on_tensor:
                    on_tensor(pair.dst, i + 1, len(ordered))
        tied_records = _check_tied(ckpt, tied)
        config.save(tmp / "model.yaml")
        sidecars = copy_sidecars(src, tmp)
        result.seconds = time.perf_counter() - started
        manifest = {
            "tool": f"migrate {__version__}",
            "keymap": {"name": km.name, "version": km.version, "file": km.path.name},
            "target": km.target,
            "format": fmt,
            "dtype": short_name(out_dtype),
            "sources": [_file_record(p) for p in _source_files(src, ckpt)],
            "tensors": result.records,
            "tied": tied_records,
            "ignored": sorted(n for n in ckpt.specs if n in km.ignored(config.to_dict())),
            "parameters": result.parameters,
            "copied": sidecars,
        }
        (tmp / "conversion.json").write_text(json.dumps(manifest, indent=2))
    ckpt.close()
    result.seconds = time.perf_counter() - started
    return result


def _choose_dtype(ckpt, dtype: str) -> np.dtype:
    if dtype != "keep":
        return CLI_DTYPES[dtype]
    floats = Counter(
        SAFETENSORS_TO_NUMPY[s.dtype] for s in ckpt.specs.values()
        if SAFETENSORS_TO_NUMPY.get(s.dtype) in COMPUTE_DTYPE
    )
    if not floats:
        raise MigrateError("checkpoint holds no fp32/fp16/bf16 tensors")
    if len(floats) > 1:
        raise MigrateError(
            "checkpoint mixes float dtypes ("
            + ", ".join(short_name(d) for d in floats)
            + "); pass --dtype to choose one"
        )
    return next(iter(floats))


def _check_coverage(ckpt, pairs, tied, ignored, expected) -> None:
    sources = set(ckpt.specs)
    consumed = {p.src for p in pairs} | {t.src for t in tied} | (ignored & sources)
    missing = [f"{p.src} (-> {p.dst})" for p in pairs if p.src not in sources]
    unexpected = sorted(sources - consumed)
    targets = {p.dst for p in pairs}
    missing += [f"{name} (model parameter no keymap entry fills)" for name in expected if name not in targets]
    unexpected += [f"{p.dst} (keymap target the model lacks)" for p in pairs if p.dst not in expected]
    misshaped = [
        f"{p.src} {list(ckpt.specs[p.src].shape)} vs model {p.dst} {list(expected[p.dst])}"
        for p in pairs
        if p.src in sources and p.dst in expected and tuple(ckpt.specs[p.src].shape) != expected[p.dst]
    ]
    if missing or unexpected or misshaped:
        raise CoverageError(missing, unexpected, misshaped)


def _check_tied(ckpt, tied) -> list[dict]:
    """A tied weight present in the file must equal the weight it is tied to."""
    records = []
    for pair in tied:
        record = {"source": pair.src, "tied_to": pair.tied_to, "present_in_source": pair.src in ckpt.specs}
        if pair.src in ckpt.specs:
            if not np.array_equal(ckpt.read(pair.src).view(np.uint8), ckpt.read(pair.tied_to).view(np.uint8)):
                raise MigrateError(
                    f"config ties {pair.src} to {pair.tied_to} but the checkpoint holds different values; "
                    "set tie_word_embeddings to false in config.json"
                )
        records.append(record)
    return records


def _open_writer(fmt, path, ordered, ckpt, out_dtype, expected):
    if fmt == "ckpt":
        from migrate.checkpoints.ms_ckpt import CkptWriter

        return CkptWriter(path)
    from migrate.checkpoints.ms_safetensors import SafetensorsWriter

    specs = []
    for pair in ordered:
        src_dtype = SAFETENSORS_TO_NUMPY[ckpt.specs[pair.src].dtype]
        dtype = out_dtype if src_dtype in COMPUTE_DTYPE else src_dtype
        specs.append((pair.dst, dtype, expected[pair.dst]))
    return SafetensorsWriter(path, specs, metadata={"format": "ms", "producer": f"migrate {__version__}"})


def _source_files(src: Path, ckpt) -> list[Path]:
    extra = [src / n for n in ("config.json", "model.safetensors.index.json", "pytorch_model.bin.index.json")]
    return [p for p in extra if p.is_file()] + list(ckpt.files)


def _file_record(path: Path) -> dict:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            digest.update(chunk)
    return {"file": path.name, "bytes": path.stat().st_size, "sha256": digest.hexdigest()}
