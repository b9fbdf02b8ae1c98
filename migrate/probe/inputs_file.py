"""The inputs both sides are fed, as a file: written by the first dump (`--inputs FILE`),
read by the second, so two machines feed identical ids. An .npz of ``ids``, ``labels``,
optionally ``mask``, and ``description``; its sha256 (over the arrays, not the zip) goes
into each dump's manifest, and `migrate diff` refuses two dumps fed different inputs."""
from __future__ import annotations

import hashlib
import io
from pathlib import Path

import numpy as np

from migrate.errors import MigrateError
from migrate.probe.inputs import Inputs


def inputs_sha256(inputs: Inputs) -> str:
    digest = hashlib.sha256()
    for name, array in (("ids", inputs.ids), ("mask", inputs.mask), ("labels", inputs.labels)):
        digest.update(name.encode())
        if array is not None:
            array = np.ascontiguousarray(array, dtype=np.int64)
            digest.update(str(array.shape).encode() + array.tobytes())
    return digest.hexdigest()


def inputs_bytes(inputs: Inputs) -> bytes:
    arrays = {"ids": inputs.ids.astype(np.int64), "labels": inputs.labels.astype(np.int64),
              "description": np.array(inputs.description)}
    if inputs.mask is not None:
        arrays["mask"] = inputs.mask.astype(np.int64)
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def read_inputs(path: str | Path) -> Inputs:
    try:
        with np.load(str(path), allow_pickle=False) as data:
            ids, labels = data["ids"], data["labels"]
            mask = data["mask"] if "mask" in data.files else None
            description = str(data["description"]) if "description" in data.files else f"ids from {path}"
    except (OSError, ValueError, KeyError) as exc:
        raise MigrateError(f"{path}: not an inputs file written by migrate dump ({exc})") from None
    if ids.ndim != 2 or ids.shape != labels.shape or (mask is not None and mask.shape != ids.shape):
        raise MigrateError(f"{path}: ids, labels and mask must be (batch, seq) arrays of one shape")
    return Inputs(ids.astype(np.int64), None if mask is None else mask.astype(np.int64),
                  labels.astype(np.int64), description)
