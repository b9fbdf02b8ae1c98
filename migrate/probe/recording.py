"""What one forward recorded, in the recorded model's own names, framework-free.

A record is one floating-point tensor a module handed out (or received, or a parameter /
gradient): ``key`` ``MODULE/output.I`` (``#N`` after MODULE for its N-th call beyond the
first), ``module`` (the name `named_modules` / `cells_and_names` gives; "" is the model
itself), ``io`` (output, input, param, grad), ``index`` (the tensor's place in a nested
tuple / ModelOutput: "0", "logits", "1.0"), ``call``, ``order`` (completion order: a
module's children finish before it), ``shape`` and the dtype it was computed in.

`Recorder` turns hook calls into records and hands each to a sink as it comes: an
in-memory `MemoryRecording` (a live diff) or a `dump_format.DumpWriter` (a dump folder,
streamed). Both sinks, and `dump_format.Dump` read back, answer `records`, `array(key)`
(None in statistics mode) and `stats(key)`.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from migrate.probe.stats import tensor_stats

ROOT = ""  # the recorded model's own name


def display(module: str) -> str:
    return module or "(model)"


class MemoryRecording:
    """A live side's records, held in memory (tensors or, in statistics mode, summaries)."""

    def __init__(self, statistics: bool = False, valid: np.ndarray | None = None, noise=None):
        self.statistics = statistics
        self.valid = valid
        self.noise_source = noise  # `probe.twin.NoiseSource`: each record's own error vs its float64 twin
        self.records: list[dict] = []
        self._arrays: dict[str, np.ndarray] = {}
        self._stats: dict[str, dict] = {}

    def put(self, record: dict, array: np.ndarray) -> None:
        if self.noise_source is not None:
            figures = self.noise_source.figures(record, array)
            if figures:
                record = {**record, "noise": figures}
        self.records.append(record)
        if self.statistics:
            self._stats[record["key"]] = tensor_stats(valid_rows(array, self.valid))
        else:
            self._arrays[record["key"]] = array

    def array(self, key: str) -> np.ndarray | None:
        return None if self.statistics else self._arrays[key]

    def noise(self, key: str) -> dict | None:
        return next((r.get("noise") for r in self.records if r["key"] == key), None)

    def stats(self, key: str) -> dict:
        if key not in self._stats:
            self._stats[key] = tensor_stats(valid_rows(self._arrays[key], self.valid))
        return self._stats[key]


def valid_rows(array: np.ndarray, valid: np.ndarray | None) -> np.ndarray:
    """The positions compared (padded query rows dropped, as `align.runner` drops them): statistics
    are taken over these only, since pad rows are ill-defined and differ between frameworks."""
    if valid is None or array.shape[:2] != valid.shape:
        return array
    return array[valid]


def flatten(value: Any, is_tensor: Callable[[Any], bool], prefix: str = "") -> list[tuple[str, Any]]:
    """(index, tensor) of every floating tensor in a nested tuple / list / dict / ModelOutput."""
    if is_tensor(value):
        return [(prefix or "0", value)]
    if isinstance(value, (tuple, list)):
        items = enumerate(value)
    elif hasattr(value, "items") and callable(value.items):
        items = value.items()
    else:
        return []  # None, ints, caches and other objects are not activations
    out = []
    for k, v in items:
        out += flatten(v, is_tensor, f"{prefix}.{k}" if prefix else str(k))
    return out


class Recorder:
    """Collects records from hooks and passes each to `sink` at once (nothing kept here)."""

    def __init__(self, sink, is_tensor: Callable[[Any], bool], to_numpy: Callable[[Any], np.ndarray],
                 dtype_of: Callable[[Any], str], *, inputs: bool = False, include: Callable[[str], bool] | None = None):
        self.sink = sink
        self.is_tensor, self.to_numpy, self.dtype_of = is_tensor, to_numpy, dtype_of
        self.inputs = inputs
        self.include = include
        self.calls: dict[str, int] = {}
        self.order = 0

    def wants(self, module: str) -> bool:
        return self.include is None or module == ROOT or self.include(module)

    def add(self, module: str, io: str, value: Any, call: int = 0) -> None:
        for index, tensor in flatten(value, self.is_tensor):
            name = module + (f"#{call}" if call else "")
            record = {"key": f"{name}/{io}.{index}", "module": module, "io": io, "index": index, "call": call,
                      "order": self.order, "shape": [int(d) for d in tensor.shape],
                      "dtype": self.dtype_of(tensor)}
            self.order += 1
            self.sink.put(record, self.to_numpy(tensor))

    def forward_hook(self, module: str):
        def hook(_module, args, output):
            call = self.calls.get(module, 0)
            self.calls[module] = call + 1
            if self.inputs:
                self.add(module, "input", tuple(args), call)
            self.add(module, "output", output, call)
        return hook
