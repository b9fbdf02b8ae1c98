"""`migrate dump` as a library call, and `record`, the three-line API for the user's own
script. Both stream records into a dump folder built under a temporary name
(`checkpoints.atomic`): nothing half-written stays under the final name."""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import re
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from migrate import __version__
from migrate.checkpoints.atomic import atomic_output_dir, atomic_write_bytes
from migrate.errors import MigrateError
from migrate.probe.dump_format import INPUTS, DumpWriter
from migrate.probe.hooks import framework_of, hooks
from migrate.probe.inputs import Inputs, seeded_inputs
from migrate.probe.inputs_file import check_vocab, inputs_bytes, inputs_sha256, read_inputs
from migrate.probe.sides import Side, call_model, open_side, side_kind
from migrate.probe.twin import twin_recording


@dataclass
class DumpResult:
    out_dir: Path
    records: int
    bytes: int
    mode: str
    inputs_written: bool


def versions(framework: str) -> dict:
    out = {"migrate": __version__}
    if framework == "torch":
        import torch

        out["torch"] = torch.__version__
        try:
            import transformers

            out["transformers"] = transformers.__version__
        except ImportError:
            pass
    else:
        import mindspore

        out["mindspore"] = mindspore.__version__
    return out


def model_identity(model, framework: str) -> dict:
    """Class, parameter count and the sha256 of the weights (name, shape, float32 bytes; one
    parameter at a time, fp32 ones hashed in place: no copy of the model's largest tensor)."""
    import numpy as np

    digest, count = hashlib.sha256(), 0
    if framework == "torch":
        named = ((n, p.detach().float().cpu().numpy()) for n, p in model.named_parameters())
    else:
        import mindspore as ms

        named = ((p.name, p.asnumpy() if p.dtype == ms.float32 else p.astype(ms.float32).asnumpy())
                 for p in model.get_parameters())
    for name, array in named:
        digest.update(f"{name}{list(array.shape)}".encode())
        digest.update(memoryview(np.ascontiguousarray(array)).cast("B"))
        count += int(array.size)
        del array
    cls = type(model)
    return {"class": f"{cls.__module__}.{cls.__qualname__}", "parameters": count,
            "weights_sha256": digest.hexdigest()}


@contextmanager
def record(model, out: str | Path, *, statistics: bool = False, inputs: Inputs | None = None,
           overwrite: bool = False, record_inputs: bool = False, params: bool = False, grads: bool = False,
           dtype: str | None = None, seed: int | None = None, extra: dict | None = None,
           inputs_paths: tuple = (), include=None, noise=None):
    """Record every module's outputs while the block runs, into the dump folder `out`::

        from migrate.probe import record
        with record(model, "dumps/mine"):
            model(ids)
    """
    framework = framework_of(model)
    with atomic_output_dir(out, overwrite, command="dump", inputs=inputs_paths) as tmp:
        writer = DumpWriter(tmp, statistics, valid=None if inputs is None or inputs.mask is None else inputs.valid,
                            noise=noise)
        with hooks(model, writer, inputs=record_inputs, params=params, grads=grads, include=include) as rec:
            yield rec
        manifest = {"created": _dt.datetime.now(_dt.UTC).replace(microsecond=0).isoformat(),
                    "framework": framework, "versions": versions(framework), "model": model_identity(model, framework),
                    "dtype": dtype, "seed": seed, **(extra or {})}
        if inputs is not None:
            (tmp / INPUTS).write_bytes(inputs_bytes(inputs))
            manifest["inputs"] = {"file": INPUTS, "sha256": inputs_sha256(inputs), "shape": list(inputs.ids.shape),
                                  "padded": inputs.mask is not None, "description": inputs.description}
        writer.close(manifest)


def side_inputs(side: Side, inputs_file: str | Path | None, *, batch: int, seq_len: int, seed: int,
                padded: bool) -> tuple[Inputs, bool]:
    """(inputs, written): read `inputs_file` when it exists, else seeded ids, written to it."""
    if inputs_file is not None and os.path.lexists(inputs_file) and not Path(inputs_file).is_file():
        # a folder ended in a rename error naming a temporary file; a FIFO was replaced by the seeded ids
        kind = "a folder" if Path(inputs_file).is_dir() else "not a regular file"
        raise MigrateError(f"--inputs {inputs_file} is {kind}; name an inputs file (.npz) to read, or a new one "
                           "to write")
    if inputs_file is not None and Path(inputs_file).is_file():
        inputs = read_inputs(inputs_file)
        check_vocab(inputs, side.vocab_size, inputs_file)
        return inputs, False
    if side.vocab_size is None:
        raise MigrateError(f"{side.source}: vocabulary size unknown (the model has no config.vocab_size); "
                           "pass --inputs FILE written by a dump of the other side")
    inputs = seeded_inputs(side.vocab_size, batch, seq_len, seed, padded, pad_id=side.pad_id)
    if inputs_file is not None:
        atomic_write_bytes(inputs_file, inputs_bytes(inputs))
    return inputs, inputs_file is not None


def dump(spec: str, out: str | Path, *, dtype: str = "fp32", seed: int = 0, inputs_file: str | Path | None = None,
         batch: int = 2, seq_len: int = 16, padded: bool = False, statistics: bool = False,
         keymap: str | None = None, overwrite: bool = False, record_inputs: bool = False,
         params: bool = False, scope: str | None = None, reference: str = "fp64",
         trust: bool = False) -> DumpResult:
    """Run one side once on the shared inputs and write its dump folder; with `scope` (a regular
    expression) only the modules whose name it finds, and the model's own outputs. A torch side
    also runs its float64 twin first (`probe.twin`; `reference="none"` skips it) and each record
    keeps its own error against it: the noise reference `migrate diff` judges the dumps with.
    `trust`: a converted folder's model class may be imported even if migrate does not bundle it."""
    include = None
    if scope is not None:
        try:
            include = re.compile(scope).search
        except re.error as exc:
            raise MigrateError(f"--scope {scope!r} is not a regular expression: {exc}") from None
    if side_kind(spec) == "dump":
        raise MigrateError(f"{spec} is a dump already; dump a model folder or module:factory")
    side = open_side(spec, dtype, seed, keymap, trust)
    inputs, written = side_inputs(side, inputs_file, batch=batch, seq_len=seq_len, seed=seed, padded=padded)
    noise, ref_entry = twin_recording(side, inputs, lambda model: call_model(replace(side, model=model), inputs),
                                      reference)
    extra = {"side": {"kind": side.kind, "source": side.source, "label": side.label}, "align": side.align,
             "reference": ref_entry}
    with record(side.model, out, statistics=statistics, inputs=inputs, overwrite=overwrite,
                record_inputs=record_inputs, params=params, dtype=dtype, seed=seed, extra=extra, include=include,
                inputs_paths=(spec if side.kind != "user" else None, inputs_file), noise=noise):
        call_model(side, inputs)
    out = Path(out)
    size = sum(f.stat().st_size for f in out.iterdir() if f.is_file())
    records = len(json.loads((out / "modules.json").read_text()))
    return DumpResult(out, records, size, "statistics" if statistics else "tensors", written)
