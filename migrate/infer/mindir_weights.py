"""What model a MindIR graph holds: a sha256 over the weights stored inside the graph file itself.

The manifest says the export's files are the ones it lists, but a manifest can be written again
over graphs copied from another export of a model with the same shapes; those graphs run and their
outputs have the shapes mindir.json lists. The weights are in the graph (`mindspore.export` stores
every parameter in the file's protobuf), so the exporter records their fingerprint in mindir.json
and the reader recomputes it from each graph: a graph holding other weights is refused, whatever the
manifest says. (Both mindir.json and the graphs rewritten by hand is a forgery this cannot see;
naming the converted folder, `generate MS_DIR --mindir EXPORT`, checks against its checkpoint.)

Only the model's weights count (the cache buffers `CachedStep` keeps are zeros sized by the export's
shapes), so two exports of one model at different shapes share a fingerprint.
"""
from __future__ import annotations

import hashlib
from pathlib import PurePosixPath

from migrate.checkpoints.input_folder import InputFolder
from migrate.errors import MigrateError

__all__ = ["graph_weights_sha256"]

_NOT_WEIGHTS = "kv_cache."  # CachedStep's cache buffers and write position


def graph_weights_sha256(folder: InputFolder, name: str) -> str:
    """sha256 of the weights graph file `name` of export `folder` holds: each parameter's name (without
    the graph's own prefix), dtype, shape and bytes, in name order. Weights a large export keeps beside
    the graph (`external_data`) are read from the file it names, under the reader rule."""
    from mindspore.train import mind_ir_pb2

    path = folder.member(name, name)
    model = mind_ir_pb2.ModelProto()
    try:
        model.ParseFromString(path.read_bytes())
    except Exception as exc:  # protobuf's DecodeError, or a foreign file
        raise MigrateError(f"{path} is not a MindIR graph: {str(exc).strip()[:200] or type(exc).__name__}") from None
    params = sorted(((p.name.split(":", 1)[-1], p) for p in model.graph.parameter), key=lambda item: item[0])
    digest = hashlib.sha256()
    for key, param in params:
        if key.startswith(_NOT_WEIGHTS):
            continue
        digest.update(f"{key}\0{param.data_type}\0{list(param.dims)}\0".encode())
        digest.update(_bytes(folder, name, param))
    return digest.hexdigest()


def _bytes(folder: InputFolder, name: str, param) -> bytes:
    if not param.HasField("external_data") or not param.external_data.location:
        return param.raw_data
    ext = param.external_data
    where = str(PurePosixPath(name).parent / ext.location)  # beside the graph; an absolute or ../ name is refused
    file = folder.member(where, f"{name}'s parameter {param.name}")
    with open(file, "rb") as fh:
        fh.seek(ext.offset)
        data = fh.read(ext.length)
    if len(data) != ext.length:
        raise MigrateError(f"{file} ends before {name}'s parameter {param.name} (truncated)")
    return data
