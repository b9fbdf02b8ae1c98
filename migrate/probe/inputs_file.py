"""The inputs both sides are fed, as a file: written by the first dump (`--inputs FILE`),
read by the second, so two machines feed identical ids. An .npz of ``ids``, ``labels``,
optionally ``mask``, and ``description``; its sha256 (over the arrays, not the zip) goes
into each dump's manifest, and `migrate diff` refuses two dumps fed different inputs."""
from __future__ import annotations

import hashlib
import io
import zipfile
from pathlib import Path

import numpy as np

from migrate.errors import MigrateError
from migrate.probe.inputs import IGNORE_INDEX, Inputs
from migrate.safeyaml import clip

MAX_BYTES = 256 << 20  # unpacked: ids, labels and mask of a few million tokens


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
    """The inputs file at `path`, checked before use: a zip of at most MAX_BYTES unpacked, whole-number
    ids ≥ 0 and labels ≥ 0 (or the ignore index), a 0/1 mask, all (batch, seq) of one shape, never empty."""
    path = Path(path)
    try:
        with zipfile.ZipFile(path) as archive:
            unpacked = sum(info.file_size for info in archive.infolist())
        if unpacked > MAX_BYTES:
            raise MigrateError(f"{path}: unpacks to {unpacked:,} bytes, more than an inputs file holds "
                               f"({MAX_BYTES:,}); refused")
        with np.load(str(path), allow_pickle=False) as data:
            ids, labels = data["ids"], data["labels"]
            mask = data["mask"] if "mask" in data.files else None
            description = str(data["description"]) if "description" in data.files else f"ids from {path}"
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
        raise MigrateError(f"{path}: not an inputs file written by migrate dump ({_first_line(exc)})") from None
    for name, array in (("ids", ids), ("labels", labels), ("mask", mask)):
        if array is not None and not (np.issubdtype(array.dtype, np.integer) or array.dtype == np.bool_):
            raise MigrateError(f"{path}: {name} must be whole numbers, found {array.dtype} (a float id is never "
                               "rounded to one)")
    if ids.ndim != 2 or ids.shape != labels.shape or (mask is not None and mask.shape != ids.shape):
        raise MigrateError(f"{path}: ids, labels and mask must be (batch, seq) arrays of one shape")
    if ids.size == 0:
        raise MigrateError(f"{path}: ids are empty (shape {list(ids.shape)})")
    if ids.min() < 0:
        raise MigrateError(f"{path}: token ids must be ≥ 0, found {int(ids.min())}")
    bad = labels[(labels < 0) & (labels != IGNORE_INDEX)]
    if bad.size:
        raise MigrateError(f"{path}: labels must be token ids ≥ 0 or {IGNORE_INDEX} (ignored), found {int(bad[0])}")
    if mask is not None and not np.isin(mask, (0, 1)).all():
        raise MigrateError(f"{path}: mask must hold only 0 (pad) and 1 (keep)")
    return Inputs(ids.astype(np.int64), None if mask is None else mask.astype(np.int64),
                  labels.astype(np.int64), clip(description))


def check_vocab(inputs: Inputs, vocab_size: int | None, where) -> None:
    """Refuse inputs read from `where` whose ids or labels lie past a model's vocabulary."""
    for name, array in (("token ids", inputs.ids), ("labels", inputs.labels)):
        if vocab_size is not None and int(array.max()) >= vocab_size:
            raise MigrateError(f"{where}: {name} reach {int(array.max())}, past the model's vocabulary ({vocab_size})")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return clip(text[0]) if text else type(exc).__name__
