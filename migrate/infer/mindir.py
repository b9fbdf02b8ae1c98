"""MindIR export of a converted model as two static-shape graphs, and a runner over the files alone.

    migrate export --format mindir out/ms_model out/mindir --batch 1 --prefill-len 64 --cache-len 320
    migrate generate --mindir out/mindir --prompt "..."

`export_mindir` writes, atomically, `prefill.mindir` and `decode.mindir` (`mindspore.export` of
`CachedStep` at the prefill and the one-token shapes; each holds its own copy of the weights),
`mindir.json` (every input and output with name, dtype and shape, the static shapes, the stop
and pad ids, the tokenizer files, the source model's config and checkpoint sha256, and the sha256 of
the weights inside the graphs: `migrate.infer.mindir_weights`), the tokenizer files and a
`manifest.json`. `MindIRRunner` runs them through `mindspore.load` + `nn.GraphCell`: no model code
and no checkpoint, only this folder.

MindSpore Lite takes the same files: its cloud-inference runtime loads a `.mindir` directly
(`mindspore_lite.Model().build_from_file(path, ModelType.MINDIR, context)`, then `predict` with
the inputs in the order `mindir.json` lists), and `converter_lite --fmk=MINDIR
--modelFile=prefill.mindir --outputFile=prefill` (per graph; `--optimize=ascend_oriented` for
Ascend) optimizes them. Not run here: no mindspore-lite wheel installs on this machine (PyPI's
newest is 2.0.0; the 2.x wheels for MindSpore 2.10 come from mindspore.cn).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import mindspore as ms
import numpy as np
from mindspore import nn

from migrate.checkpoints.atomic import atomic_output_dir, atomic_write_text
from migrate.checkpoints.input_folder import InputFolder
from migrate.checkpoints.manifest import sha256_files, verify_manifest, write_manifest
from migrate.checkpoints.ms_reader import checkpoint_files
from migrate.dtype_names import PRECISIONS, canonical_dtype
from migrate.errors import MigrateError
from migrate.infer.mindir_weights import graph_weights_sha256
from migrate.infer.runners import learned_positions
from migrate.infer.sizes import cache_bytes
from migrate.infer.special_ids import stop_and_pad
from migrate.models.kv_cache import CachedStep, cache_shape
from migrate.models.loading import load_model
from migrate.models.mode import execution_mode
from migrate.models.registry import load_model_config
from migrate.resources import need_memory
from migrate.safeyaml import quote
from migrate.sidecar import copy_sidecars

FORMAT, VERSION = "migrate-mindir", 2  # 2: source.graph_weights_sha256 (migrate.infer.mindir_weights)
SPEC_FILE = "mindir.json"
GRAPHS = ("prefill", "decode")
_NP = {"int32": np.int32, "float32": np.float32, "float16": np.float16}


def _dtype_name(dtype) -> str:
    return str(dtype).lower()  # ms.float32 -> "float32", ms.bfloat16 -> "bfloat16"


def cache_names(num_layers: int) -> list[str]:
    """The cache inputs (and outputs) in call order: k_cache.0, v_cache.0, k_cache.1, ..."""
    return [f"{kind}_cache.{i}" for i in range(num_layers) for kind in ("k", "v")]


def graph_specs(config, batch: int, prefill_len: int, cache_len: int, cache_dtype: str) -> dict:
    """Inputs and outputs of both graphs: name, dtype, shape, in call order."""
    kv = list(cache_shape(config, batch, cache_len))
    caches = [{"name": name, "dtype": cache_dtype, "shape": kv} for name in cache_names(config.num_layers)]
    out = {}
    for graph, s in (("prefill", prefill_len), ("decode", 1)):
        out[graph] = {
            "file": f"{graph}.mindir",
            "inputs": [
                {"name": "input_ids", "dtype": "int32", "shape": [batch, s]},
                {"name": "positions", "dtype": "int32", "shape": [batch, s]},
                {"name": "start", "dtype": "int32", "shape": []},
                {"name": "key_mask", "dtype": "int32", "shape": [batch, cache_len]},
                *caches,
            ],
            "outputs": [{"name": "logits", "dtype": "float32", "shape": [batch, config.vocab_size]}, *caches],
        }
    return out


def weights_digest(ms_dir: Path) -> dict[str, str]:
    """sha256 of each checkpoint file of a converted folder (what says which model a MindIR came from)."""
    _, files = checkpoint_files(ms_dir)
    digests = sha256_files(ms_dir, [f.relative_to(ms_dir).as_posix() for f in files])
    return dict(sorted(digests.items()))


def export_mindir(ms_dir, out, *, batch: int, prefill_len: int, cache_len: int, compute_dtype: str | None = None,
                  overwrite: bool = False, trust: bool = False) -> dict:
    """Export `ms_dir`'s model as prefill and decode MindIR graphs into `out`; returns mindir.json's record.
    `trust`: the folder's model class may be imported even if migrate does not bundle it (`--trust-model-class`)."""
    ms_dir = Path(ms_dir)
    if not ms_dir.is_dir():
        raise MigrateError(f"MindSpore model folder not found: {ms_dir}")
    for name, value in (("--batch", batch), ("--prefill-len", prefill_len), ("--cache-len", cache_len)):
        if value < 1:
            raise MigrateError(f"{name} must be positive, got {value}")
    if prefill_len >= cache_len:
        raise MigrateError(f"--prefill-len ({prefill_len}) must be shorter than --cache-len ({cache_len})")
    # The cache is built (and handed to mindspore.export as zeros) at its full size: refuse one that cannot fit
    fields = load_model_config(ms_dir, trust).to_dict()
    itemsize = PRECISIONS[canonical_dtype(compute_dtype or fields.get("compute_dtype") or "float32")].bytes
    need_memory(cache_bytes(fields, batch, cache_len, itemsize),
                f"the KV cache for --cache-len {cache_len:,} (batch {batch})")
    with execution_mode("graph"):  # mindspore.export compiles the graph; the caller's mode is put back after
        return _export(ms_dir, out, batch, prefill_len, cache_len, compute_dtype, overwrite, trust)


def _export(ms_dir: Path, out, batch: int, prefill_len: int, cache_len: int, compute_dtype, overwrite: bool,
            trust: bool = False) -> dict:
    model, config = load_model(ms_dir, compute_dtype=compute_dtype, trust=trust)
    limit = learned_positions(model)
    if limit is not None and cache_len > limit:
        raise MigrateError(f"--cache-len ({cache_len}) exceeds the model's {limit} learned positions")
    step = CachedStep(model, batch, cache_len)
    step.set_train(False)
    act = model.precision.act
    cache_dtype = _dtype_name(act)
    specs = graph_specs(config, batch, prefill_len, cache_len, cache_dtype)
    eos, pad = stop_and_pad(ms_dir, config)
    with atomic_output_dir(out, overwrite, command="export", source=ms_dir) as tmp:
        for graph in GRAPHS:
            inputs = [ms.Tensor(np.zeros(s["shape"], _NP[s["dtype"]])) if s["dtype"] in _NP
                      else ms.ops.zeros(tuple(s["shape"]), act) for s in specs[graph]["inputs"]]
            ms.export(step, *inputs, file_name=str(tmp / graph), file_format="MINDIR")
            _usual_mode(tmp / f"{graph}.mindir")  # mindspore.export writes them read-only (0o400)
        exported = InputFolder(tmp, "MindIR export")
        held = {graph_weights_sha256(exported, specs[g]["file"]) for g in GRAPHS}
        if len(held) != 1:  # one model's weights in both: mindspore.export stored what the step holds
            raise MigrateError(f"the exported graphs hold different weights ({sorted(held)})")
        record = {
            "format": FORMAT, "version": VERSION,
            "batch": batch, "prefill_len": prefill_len, "cache_len": cache_len,
            "vocab_size": config.vocab_size, "max_positions": limit,
            "stop_ids": eos, "pad_id": pad,
            "graphs": specs,
            "tokenizer": copy_sidecars(ms_dir, tmp) or None,
            "source": {"folder": str(ms_dir), "model_class": config.to_dict().get("model_class"),
                       "config": config.to_dict(), "weights_sha256": weights_digest(ms_dir),
                       "graph_weights_sha256": held.pop()},
        }
        atomic_write_text(tmp / SPEC_FILE, json.dumps(record, indent=1, default=str) + "\n")
        write_manifest(tmp)
    return record


def _first_line(exc: BaseException) -> str:
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    return lines[0][:200] if lines else type(exc).__name__


def _usual_mode(path: Path) -> None:
    umask = os.umask(0)
    os.umask(umask)
    path.chmod(0o666 & ~umask)


def read_spec(folder) -> dict:
    """mindir.json of an export folder, read under the reader rule (`checkpoints.input_folder`): bounded
    JSON, every field of the type and the shapes the exporter writes, the graph files inside the folder;
    then its files checked against the manifest (one line, exit 2, otherwise)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise MigrateError(f"MindIR folder not found: {folder}")
    path = folder / SPEC_FILE
    if not path.is_file():
        raise MigrateError(f"{folder} is not a MindIR export of migrate (no {SPEC_FILE})")
    files = InputFolder(folder, "MindIR export")
    spec = files.json(SPEC_FILE, expect=dict)
    needed = ("batch", "prefill_len", "cache_len", "vocab_size", "stop_ids", "pad_id", "graphs", "source")
    if spec.get("format") != FORMAT or any(k not in spec for k in needed):
        raise MigrateError(f"{path} is not a {FORMAT} description")
    if spec.get("version") != VERSION:
        raise MigrateError(f"{path} is version {quote(spec.get('version'))}; this migrate reads version {VERSION}")
    problem = _spec_problem(spec)
    if problem:
        raise MigrateError(f"{path}: {problem}")
    verify_manifest(folder)  # a missing, changed or extra file is named here
    for graph in GRAPHS:  # the manifest lists what is there; the rule, where the spec may point
        files.member(spec["graphs"][graph]["file"], f"{SPEC_FILE}'s {graph} graph")
    recorded = spec["source"]["graph_weights_sha256"]
    for graph in GRAPHS:  # a manifest re-hashed over another model's graphs of the same shapes: the weights tell
        name = spec["graphs"][graph]["file"]
        held = graph_weights_sha256(files, name)
        if held != recorded:
            raise MigrateError(f"{folder / name} holds the weights of another model than {SPEC_FILE} records "
                               f"(weights sha256 {held[:12]}…, recorded {recorded[:12]}…); export it again")
    return spec


def _spec_problem(spec: dict) -> str | None:
    """What in mindir.json the exporter would not have written: the sizes, the ids, and each graph's
    inputs and outputs against the static shapes the record states."""
    for key in ("batch", "prefill_len", "cache_len", "vocab_size"):
        if not _whole(spec[key]) or spec[key] < 1:
            return f"{key} must be a whole number ≥ 1, found {quote(spec[key])}"
    if spec["prefill_len"] >= spec["cache_len"]:
        return f"prefill_len {spec['prefill_len']} must be shorter than cache_len {spec['cache_len']}"
    if spec.get("max_positions") is not None and not _whole(spec["max_positions"]):
        return f"max_positions must be a whole number, found {quote(spec['max_positions'])}"
    vocab = spec["vocab_size"]
    ids = spec["stop_ids"]
    if not isinstance(ids, list) or not all(_whole(i) and 0 <= i < vocab for i in ids):
        return f"stop_ids must list token ids below vocab_size {vocab}, found {quote(ids)}"
    if spec["pad_id"] is not None and not (_whole(spec["pad_id"]) and 0 <= spec["pad_id"] < vocab):
        return f"pad_id must be a token id below vocab_size {vocab}, found {quote(spec['pad_id'])}"
    source = spec["source"]
    if not isinstance(source, dict) or not isinstance(source.get("config"), dict):
        return "source must hold the exported model's config"
    fingerprint = source.get("graph_weights_sha256")
    if not isinstance(fingerprint, str) or len(fingerprint) != 64:
        return f"source.graph_weights_sha256 must be the sha256 of the graphs' weights, found {quote(fingerprint)}"
    if source["config"].get("vocab_size") != vocab:
        return f"source config's vocab_size {quote(source['config'].get('vocab_size'))} is not vocab_size {vocab}"
    graphs = spec["graphs"]
    if not isinstance(graphs, dict) or any(not isinstance(graphs.get(g), dict) for g in GRAPHS):
        return f"graphs must describe {' and '.join(GRAPHS)}"
    batch, cache = spec["batch"], spec["cache_len"]
    for graph, length in (("prefill", spec["prefill_len"]), ("decode", 1)):
        entry = graphs[graph]
        inputs, outputs = entry.get("inputs"), entry.get("outputs")
        if not isinstance(entry.get("file"), str) or not _tensor_list(inputs) or not _tensor_list(outputs):
            return f"graphs.{graph} must name its file and list its inputs and outputs (name, dtype, shape)"
        head = [(i["name"], i["dtype"], i["shape"]) for i in inputs[:4]]
        want = [("input_ids", "int32", [batch, length]), ("positions", "int32", [batch, length]),
                ("start", "int32", []), ("key_mask", "int32", [batch, cache])]
        caches = inputs[4:]
        if head != want or not caches or len(caches) % 2:
            return f"graphs.{graph} inputs are not those of a batch {batch}, length {length}, cache {cache} step"
        if any(c["shape"] != caches[0]["shape"] or c["dtype"] != caches[0]["dtype"] for c in caches):
            return f"graphs.{graph} cache inputs differ in shape or dtype"
        if ([(o["name"], o["shape"]) for o in outputs[:1]] != [("logits", [batch, vocab])]
                or outputs[1:] != caches):
            return f"graphs.{graph} outputs must be logits [{batch}, {vocab}] and the caches it takes"
    if graphs["prefill"]["inputs"][4:] != graphs["decode"]["inputs"][4:]:
        return "the prefill and decode graphs take different caches"
    return None


def _tensor_list(value) -> bool:
    return isinstance(value, list) and all(
        isinstance(t, dict) and isinstance(t.get("name"), str) and isinstance(t.get("dtype"), str)
        and isinstance(t.get("shape"), list) and all(_whole(n) and n >= 0 for n in t["shape"]) for t in value)


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_same_model(spec: dict, ms_dir, folder) -> None:
    """Refuse a MindIR folder exported from another model than the converted folder `ms_dir`."""
    source = spec["source"]
    ours = weights_digest(Path(ms_dir))
    if ours != source.get("weights_sha256"):
        raise MigrateError(f"{folder} was exported from another model ({source.get('folder')}): its checkpoint "
                           f"sha256 differs from {ms_dir}'s")


class MindIRRunner:
    """The two exported graphs as a step runner (`migrate.infer.generate`), from the files alone.
    A GraphCell runs in GRAPH_MODE only: each load and each step holds it (`execution_mode`) and puts
    the caller's mode back, so the runner works whatever mode its user is in, and leaves it as it was."""

    def __init__(self, folder, spec: dict | None = None):
        self.folder = Path(folder)
        self.spec = spec or read_spec(self.folder)
        self.batch, self.prefill_len = self.spec["batch"], self.spec["prefill_len"]
        self.cache_len, self.max_positions = self.spec["cache_len"], self.spec.get("max_positions")
        self.cells = {}
        for graph in GRAPHS:
            file = self.folder / self.spec["graphs"][graph]["file"]
            try:
                with execution_mode("graph"):
                    self.cells[graph] = nn.GraphCell(ms.load(str(file)))
            except Exception as exc:  # a damaged or foreign file mindspore cannot parse
                raise MigrateError(f"mindspore cannot load {file}: {str(exc).strip().splitlines()[0]}") from None
        caches = self.spec["graphs"]["prefill"]["inputs"][4:]
        if not caches or any(c.get("dtype") not in ("float32", "float16", "bfloat16") for c in caches):
            raise MigrateError(f"{self.folder / SPEC_FILE} lists no cache inputs of a float dtype")
        self.cache_specs = [(tuple(c["shape"]), getattr(ms, c["dtype"])) for c in caches]
        self.caches = ()
        self._key_mask = None

    def _run(self, graph, ids, positions, start, caches) -> np.ndarray:
        """One graph call, its outputs checked against mindir.json: a graph file from another export (the
        manifest re-hashed over it) fails here in one line, not deep in MindSpore or later in sampling."""
        file = self.folder / self.spec["graphs"][graph]["file"]
        try:
            with execution_mode("graph"):
                logits, *caches = self.cells[graph](ms.Tensor(ids), ms.Tensor(positions),
                                                    ms.Tensor(start, ms.int32), self._key_mask, *caches)
        except (RuntimeError, ValueError, TypeError) as exc:
            raise MigrateError(f"{file} does not run on the inputs {SPEC_FILE} lists (exported from another "
                               f"model?): {_first_line(exc)}") from None
        outputs = self.spec["graphs"][graph]["outputs"]
        got = [list(logits.shape), *(list(c.shape) for c in caches)]
        if got != [o["shape"] for o in outputs]:
            raise MigrateError(f"{file} returns shapes {quote(got)}, {SPEC_FILE} lists "
                               f"{quote([o['shape'] for o in outputs])} (exported from another model?)")
        self.caches = tuple(caches)
        return logits.asnumpy()

    def prefill(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        self._key_mask = ms.Tensor(inputs["key_mask"])
        zeros = tuple(ms.ops.zeros(shape, dtype) for shape, dtype in self.cache_specs)
        return self._run("prefill", inputs["input_ids"], inputs["positions"], 0, zeros)

    def decode(self, tokens, positions, start: int, key_mask) -> np.ndarray:
        return self._run("decode", tokens, positions, start, self.caches)
