"""The dump folder `migrate dump` writes and `migrate diff` reads (format version 1).

    DUMP/
      manifest.json    format "migrate-dump", format_version, created, tool, mode
                       ("tensors" | "statistics"), framework and versions, side (kind, source,
                       model class), model (parameters, sha256 of the weights), dtype, seed,
                       inputs (file, sha256, shape, description), align (the side's block
                       table, when known), records, files
      modules.json     every record in execution order: key, module, io, index, call, order,
                       shape, dtype, file (the safetensors file holding it; null in statistics
                       mode), in statistics mode stats (`probe.stats.tensor_stats`), and for a
                       torch side dumped with its float64 twin (the default) noise: the tensor's
                       own error against the twin (`judge.noise.noise_figures`)
      inputs.npz       the ids / mask / labels fed (`probe.inputs_file`)
      tensors-00001.safetensors, ...   tensors mode: float32, named by record key; a file is
                       closed at about 256 MiB so memory holds one file's worth at most
      .migrate         migrate's output marker

Tensors are stored in float32 whatever the dtype they were computed in (bf16 and fp16 are
exact in it); `dtype` in modules.json keeps the computed dtype.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np

from migrate import __version__
from migrate.checkpoints.input_folder import InputFolder
from migrate.checkpoints.safetensors_file import SafetensorsFile
from migrate.errors import MigrateError
from migrate.jsonsafe import load_json
from migrate.probe.inputs_file import read_inputs
from migrate.probe.recording import valid_rows
from migrate.probe.stats import SKETCH, tensor_stats
from migrate.safeyaml import quote

FORMAT = "migrate-dump"
FORMAT_VERSION = 1
MANIFEST, MODULES, INPUTS = "manifest.json", "modules.json", "inputs.npz"
SHARD_BYTES = 256 << 20


def is_dump(path: str | Path) -> bool:
    manifest = Path(path) / MANIFEST
    if not manifest.is_file():
        return False
    try:
        return load_json(manifest, expect=dict).get("format") == FORMAT
    except (OSError, ValueError):  # ValueError: jsonsafe.JSONError, a file that is no dump's manifest
        return False


class DumpWriter:
    """A sink for `recording.Recorder` that streams records into a dump folder."""

    def __init__(self, folder: Path, statistics: bool, shard_bytes: int = SHARD_BYTES,
                 valid: np.ndarray | None = None, noise=None):
        self.folder = Path(folder)
        self.statistics = statistics
        self.noise_source = noise  # `probe.twin.NoiseSource`: the record's own error vs its float64 twin
        self.valid = valid  # statistics mode: pad query rows left out
        self.shard_bytes = shard_bytes
        self.records: list[dict] = []
        self.files: list[str] = []
        self._pending: dict[str, np.ndarray] = {}
        self._pending_bytes = 0

    def put(self, record: dict, array: np.ndarray) -> None:
        record = dict(record)
        if self.noise_source is not None:
            figures = self.noise_source.figures(record, array)
            if figures:
                record["noise"] = figures
        if self.statistics:
            record["file"] = None
            record["stats"] = tensor_stats(valid_rows(array, self.valid))
        else:
            array = np.ascontiguousarray(array, dtype=np.float32)
            record["file"] = f"tensors-{len(self.files) + 1:05d}.safetensors"
            self._pending[record["key"]] = array
            self._pending_bytes += array.nbytes
            if self._pending_bytes >= self.shard_bytes:
                self._flush()
        self.records.append(record)

    def _flush(self) -> None:
        from safetensors.numpy import save

        if not self._pending:
            return
        name = f"tensors-{len(self.files) + 1:05d}.safetensors"
        # save() and a plain write: save_file would create the file 0600, not 0666 minus the umask.
        (self.folder / name).write_bytes(save(self._pending, metadata={"format": FORMAT}))
        self.files.append(name)
        self._pending, self._pending_bytes = {}, 0

    def close(self, manifest: dict) -> None:
        """Write the last tensors file, modules.json and the manifest (last: it names the rest)."""
        self._flush()
        (self.folder / MODULES).write_text(json.dumps(self.records, indent=0) + "\n")
        manifest = {"format": FORMAT, "format_version": FORMAT_VERSION, "tool": f"migrate {__version__}",
                    "mode": "statistics" if self.statistics else "tensors", **manifest,
                    "records": len(self.records), "files": [MODULES, INPUTS, *self.files]}
        (self.folder / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")


class Dump:
    """A dump folder read back: the manifest, the records in order, tensors on demand.

    Read under the reader rule (`checkpoints.input_folder`): every file a record names lies inside
    the folder and is one the manifest lists; the records are checked field by field, their count
    against the manifest's; a tensors file's header is validated (`SafetensorsFile`) and each
    tensor read must be stored under its key with the record's shape, in float32."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        if not (self.folder / MANIFEST).is_file():
            raise MigrateError(f"{self.folder} is not a dump folder (no {MANIFEST})")
        self._files = InputFolder(self.folder, "dump")
        self.manifest = self._files.json(MANIFEST, expect=dict)
        if self.manifest.get("format") != FORMAT:
            raise MigrateError(f"{self.folder}/{MANIFEST} is not a migrate dump "
                               f"(format {quote(self.manifest.get('format'))})")
        if self.manifest.get("format_version") != FORMAT_VERSION:
            raise MigrateError(f"{self.folder}: dump format version {quote(self.manifest.get('format_version'))} "
                               f"is not supported (this migrate reads {FORMAT_VERSION})")
        _check_manifest(self.manifest, self.folder / MANIFEST)
        self.statistics = self.manifest.get("mode") == "statistics"
        self.records = self._files.json(MODULES, f"{MANIFEST}'s files", expect=list)
        self._by_key = _check_records(self.records, self.folder / MODULES, self.statistics,
                                      set(self.manifest["files"]))
        if self.manifest.get("records") != len(self.records):
            raise MigrateError(f"{self.folder}: {MODULES} holds {len(self.records)} records, {MANIFEST} says "
                               f"{quote(self.manifest.get('records'))}")
        self._open: dict[str, SafetensorsFile] = {}
        if not self.statistics:
            self._check_tensors()

    def _check_tensors(self) -> None:
        """Every tensors file present and inside the dump, its header valid, and every record stored
        under its key with its shape in float32: checked on the headers before any tensor is read."""
        for file in dict.fromkeys(r["file"] for r in self.records):
            self._open[file] = SafetensorsFile(self._files.member(file, MODULES))
        for record in self.records:
            file, key, shape = record["file"], record["key"], tuple(record["shape"])
            entry = self._open[file].entries.get(key)
            if entry is None:
                raise MigrateError(f"{self.folder}: {file} holds no tensor {quote(key)} (named by {MODULES})")
            # safetensors stores a 0-d tensor (a loss) as (1,): the record's shape is the tensor's.
            if entry.dtype != "F32" or (entry.shape != shape and not (shape == () and entry.shape == (1,))):
                raise MigrateError(f"{self.folder}: {file} holds {quote(key)} as {entry.dtype} {list(entry.shape)}, "
                                   f"{MODULES} records float32 {list(shape)}")

    def close(self) -> None:
        for handle in self._open.values():
            handle.close()
        self._open.clear()

    def array(self, key: str) -> np.ndarray | None:
        if self.statistics:
            return None
        record = self._by_key[key]
        return self._open[record["file"]].read(key).reshape(record["shape"])  # headers checked on opening

    def inputs_path(self) -> Path | None:
        """inputs.npz, checked to lie inside the dump; None when the dump was recorded without inputs."""
        if not os.path.lexists(self.folder / INPUTS):
            return None
        return self._files.member(INPUTS, INPUTS)

    def noise(self, key: str) -> dict | None:
        """The recorded tensor's own error against the side's float64 twin, when the dump measured it."""
        noise = self._by_key[key].get("noise")
        return noise if isinstance(noise, dict) else None

    def stats(self, key: str) -> dict:
        record = self._by_key[key]
        if self.statistics:
            return record["stats"]
        inputs = self.manifest.get("inputs") or {}
        valid = None
        if inputs.get("padded"):
            path = self.inputs_path()
            if path is None:
                raise MigrateError(f"{self.folder}: {MANIFEST} says the inputs were padded, but there is no {INPUTS}")
            valid = read_inputs(path).valid
        return tensor_stats(valid_rows(self.array(key), valid))


# ---------- what a dump's files must hold (the reader rule's "what the manifest says") ----------
_IO = ("output", "input", "param", "grad")
_NUMBER = (int, float)


def _check_manifest(manifest: dict, where: Path) -> None:
    """The manifest fields `migrate diff` uses, of the types the writer gives them."""
    fields = {"mode": (str,), "files": (list,), "dtype": (str, type(None)), "framework": (str,),
              "side": (dict,), "align": (dict, type(None)), "reference": (dict, type(None)),
              "versions": (dict,), "inputs": (dict, type(None))}
    for name, kinds in fields.items():
        if name in manifest and not isinstance(manifest[name], kinds):
            raise MigrateError(f"{where}: {name} is {quote(manifest[name])}, not what migrate dump writes")
    if manifest.get("mode") not in ("tensors", "statistics"):
        raise MigrateError(f"{where}: mode {quote(manifest.get('mode'))} is neither 'tensors' nor 'statistics'")
    if not isinstance(manifest.get("files"), list) or not all(isinstance(f, str) for f in manifest["files"]):
        raise MigrateError(f"{where}: files must list the dump's file names")
    if MODULES not in manifest["files"]:
        raise MigrateError(f"{where}: files does not list {MODULES}")
    if not all(isinstance(manifest.get("side", {}).get(k, ""), str) for k in ("kind", "source", "label")):
        raise MigrateError(f"{where}: side must name its kind, source and label as text")
    align = manifest.get("align") or {}
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in align.items()):
        raise MigrateError(f"{where}: align must map block names to module names")
    inputs = manifest.get("inputs") or {}
    if not isinstance(inputs.get("padded", False), bool):
        raise MigrateError(f"{where}: inputs.padded must be true or false")


def _check_records(records: list, where: Path, statistics: bool, files: set[str]) -> dict[str, dict]:
    """Key -> record, each record checked: the fields pairing and judging read, of their types."""
    by_key: dict[str, dict] = {}
    for i, record in enumerate(records):
        problem = _record_problem(record, statistics, files)
        if problem:
            raise MigrateError(f"{where}: record {i}: {problem}")
        if record["key"] in by_key:
            raise MigrateError(f"{where}: record {i}: key {quote(record['key'])} appears twice")
        by_key[record["key"]] = record
    return by_key


def _record_problem(r, statistics: bool, files: set[str]) -> str | None:
    if not isinstance(r, dict):
        return f"{quote(r)} is not an object"
    for name in ("key", "module", "index", "dtype"):
        if not isinstance(r.get(name), str):
            return f"{name} must be text, found {quote(r.get(name))}"
    if r.get("io") not in _IO:
        return f"io must be one of {', '.join(_IO)}, found {quote(r.get('io'))}"
    for name in ("call", "order"):
        if not _count(r.get(name)):
            return f"{name} must be a whole number ≥ 0, found {quote(r.get(name))}"
    shape = r.get("shape")
    if not isinstance(shape, list) or not all(_count(n) for n in shape):
        return f"shape must list whole numbers ≥ 0, found {quote(shape)}"
    noise = r.get("noise")
    if noise is not None and (not isinstance(noise, dict)
                              or not all(v is None or isinstance(v, (*_NUMBER, str)) for v in noise.values())):
        return f"noise must map names to numbers, found {quote(noise)}"
    if statistics:
        return _stats_problem(r.get("stats"), shape)
    file = r.get("file")
    if not isinstance(file, str):
        return f"file must name the tensors file holding it, found {quote(file)}"
    if file not in files:
        return f"file {quote(file)} is not one of the files {MANIFEST} lists"
    return None


def _stats_problem(stats, shape: list) -> str | None:
    if not isinstance(stats, dict):
        return f"stats must be an object, found {quote(stats)}"
    # Over the valid rows only where the inputs were padded: never more elements than the record's shape.
    seen = stats.get("shape")
    if (not isinstance(seen, list) or not all(_count(n) for n in seen) or stats.get("numel") != math.prod(seen)
            or math.prod(seen) > math.prod(shape)):
        return f"stats describe shape {quote(seen)} of {quote(stats.get('numel'))} elements, " \
               f"the record's shape is {shape}"
    for name in ("min", "max", "mean", "l2"):
        if not _real(stats.get(name)):
            return f"stats.{name} must be a number, found {quote(stats.get(name))}"
    for name in ("nan", "inf"):
        if not _count(stats.get(name)):
            return f"stats.{name} must be a whole number ≥ 0, found {quote(stats.get(name))}"
    sketch = stats.get("sketch")
    if not isinstance(sketch, list) or len(sketch) != SKETCH or not all(_real(v) for v in sketch):
        return f"stats.sketch must list {SKETCH} numbers"
    if not isinstance(stats.get("checksum"), str):
        return "stats.checksum must be text"
    return None


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _real(value) -> bool:
    return isinstance(value, _NUMBER) and not isinstance(value, bool)
