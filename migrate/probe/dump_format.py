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
from pathlib import Path

import numpy as np

from migrate import __version__
from migrate.errors import MigrateError
from migrate.probe.inputs_file import read_inputs
from migrate.probe.recording import valid_rows
from migrate.probe.stats import tensor_stats

FORMAT = "migrate-dump"
FORMAT_VERSION = 1
MANIFEST, MODULES, INPUTS = "manifest.json", "modules.json", "inputs.npz"
SHARD_BYTES = 256 << 20


def is_dump(path: str | Path) -> bool:
    manifest = Path(path) / MANIFEST
    if not manifest.is_file():
        return False
    try:
        return json.loads(manifest.read_text()).get("format") == FORMAT
    except (OSError, ValueError, AttributeError):
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
    """A dump folder read back: the manifest, the records in order, tensors on demand."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        if not (self.folder / MANIFEST).is_file():
            raise MigrateError(f"{self.folder} is not a dump folder (no {MANIFEST})")
        try:
            self.manifest = json.loads((self.folder / MANIFEST).read_text())
            self.records = json.loads((self.folder / MODULES).read_text())
        except (OSError, ValueError) as exc:
            raise MigrateError(f"{self.folder}: unreadable dump ({exc})") from None
        if self.manifest.get("format") != FORMAT:
            raise MigrateError(f"{self.folder}/{MANIFEST} is not a migrate dump "
                               f"(format {self.manifest.get('format')!r})")
        if self.manifest.get("format_version") != FORMAT_VERSION:
            raise MigrateError(f"{self.folder}: dump format version {self.manifest.get('format_version')!r} is not "
                               f"supported (this migrate reads {FORMAT_VERSION})")
        self.statistics = self.manifest.get("mode") == "statistics"
        self._by_key = {r["key"]: r for r in self.records}
        self._open: dict[str, object] = {}

    def array(self, key: str) -> np.ndarray | None:
        if self.statistics:
            return None
        from safetensors import safe_open

        file = self._by_key[key]["file"]
        if file not in self._open:
            path = self.folder / file
            if not path.is_file():
                raise MigrateError(f"{self.folder}: {file} missing (named by {MODULES})")
            self._open[file] = safe_open(str(path), framework="numpy")
        # safe_open hands a 0-d tensor (a loss) back as (1,): the record's shape is the tensor's.
        return self._open[file].get_tensor(key).reshape(self._by_key[key]["shape"])

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
            valid = read_inputs(self.folder / INPUTS).valid
        return tensor_stats(valid_rows(self.array(key), valid))
