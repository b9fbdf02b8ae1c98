"""The float64 twin of a torch side, recorded: the noise reference of dumps and live diffs on
any pair (`migrate.judge.noise`).

`twin_recording` runs the model in float64 -- the very weights the side computes with, upcast in
place and cast back after (exact) -- on the same inputs under the same recording hooks and keeps
every tensor in float64.
A `NoiseSource` then gives, for each record key of the side itself, how far the side's tensor
is from its twin's (`reference.noise_figures`); `DumpWriter` stores that beside the record, and
a live `MemoryRecording` keeps it, so a diff judges against the reference's own error whether
the reference side is a dump from another machine or live.
"""
from __future__ import annotations

import numpy as np

from migrate.judge.noise import TWIN, noise_figures
from migrate.judge.twin import float64_in_place, twin_refused
from migrate.probe.hooks import hooks
from migrate.probe.recording import ROOT, MemoryRecording, valid_rows


class NoiseSource:
    """Per record key: the side's own error against its float64 twin (`put` computes it)."""

    def __init__(self, twin: MemoryRecording, vocab_size: int | None, valid: np.ndarray | None):
        self.twin, self.vocab_size, self.valid = twin, vocab_size, valid
        self.keys = {r["key"] for r in twin.records}

    def figures(self, record: dict, array: np.ndarray) -> dict | None:
        if record["key"] not in self.keys:
            return None
        exact = self.twin.array(record["key"])
        if exact.shape != array.shape:
            return None
        logits = (record["module"] == ROOT and array.ndim >= 2 and self.vocab_size is not None
                  and array.shape[-1] == self.vocab_size)
        return noise_figures(valid_rows(array, self.valid), valid_rows(exact, self.valid), logits=logits)


def twin_recording(side, inputs, run, reference: str = "fp64") -> tuple[NoiseSource | None, dict]:
    """(the noise source, the manifest's "reference" entry): the twin run with `run(model)` under
    recording hooks, or None and why not (a MindSpore side, --reference none, not enough memory)."""
    if side.framework != "torch":
        return None, {"refused": "a MindSpore side has no float64 twin"}
    why = twin_refused(side.model, reference, in_place=True)
    if why:
        return None, {"refused": why}
    recording = MemoryRecording(statistics=False)
    try:
        with float64_in_place(side.model) as model, hooks(model, recording):
            run(model)
    except Exception as exc:  # user code may pin float32 somewhere (a softmax dtype=): no twin then, said so
        return None, {"refused": f"its float64 twin failed: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}"}
    valid = None if inputs.mask is None else inputs.valid
    return NoiseSource(recording, side.vocab_size, valid), {"source": TWIN, "of": side.label}
