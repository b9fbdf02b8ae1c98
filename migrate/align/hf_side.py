"""The reference side of `migrate diff`: HF's own PyTorch model, of the class its
config.json names (`architectures`: GPT2LMHeadModel, BertModel, BertForMaskedLM, ...).

Its forward is recorded by probe's hooks on the modules the keymap's `align` table names
(`probe.live`), so nothing about HF's module tree is written here; this side adds the
gradients and the greedy generation of `--grads` and `--generate`.
"""
from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np
import torch

from migrate.checkpoints.dtypes import torch_to_numpy
from migrate.errors import MigrateError
from migrate.probe.sides import load_hf_model


def _as_numpy(t: torch.Tensor) -> np.ndarray:
    """float32 for the compared sides, float64 kept for the twin (the model run in float64 in place)."""
    t = t.detach()
    return t.numpy() if t.dtype == torch.float64 else torch_to_numpy(t.float())


class HFSide:
    """HF's model (`probe.sides.load_hf_model`) for what only the HF-vs-converted diff does: the
    gradients, the greedy generation. Its forward is recorded by `probe.live` like any side's."""

    def __init__(self, hf_dir: Path, dtype: str, align: dict[str, str], seed: int):
        if not align:
            raise MigrateError("keymap has no align table: migrate diff cannot pair hidden states")
        self.model = load_hf_model(hf_dir, dtype, seed)  # eager attention, dropout off
        self.takes_labels = "labels" in inspect.signature(self.model.forward).parameters
        self.can_generate = bool(getattr(self.model, "can_generate", lambda: False)())

    def _run(self, inputs, labels: bool):
        ids = torch.from_numpy(inputs.ids)
        mask = None if inputs.mask is None else torch.from_numpy(inputs.mask)
        extra = {"labels": torch.from_numpy(inputs.labels)} if labels and self.takes_labels else {}
        return self.model(input_ids=ids, attention_mask=mask, **extra)

    def gradients(self, inputs) -> tuple[float, dict[str, np.ndarray]]:
        self.model.zero_grad(set_to_none=True)
        out = self._run(inputs, labels=True)
        out.loss.backward()
        return float(out.loss.detach()), {n: _as_numpy(p.grad) for n, p in self.model.named_parameters()
                                 if p.grad is not None}

    def parameter_names(self) -> list[str]:
        return [n for n, _ in self.model.named_parameters()]

    def generate(self, prompt: np.ndarray, steps: int) -> list[int]:
        """HF `generate`, greedy with its KV cache and no stop token, like the other side."""
        ids = torch.from_numpy(prompt[None, :].copy())
        with torch.no_grad():
            out = self.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=steps,
                                      min_new_tokens=0, do_sample=False, num_beams=1, eos_token_id=None,
                                      pad_token_id=0, repetition_penalty=1.0)
        return out[0, ids.shape[1]:].tolist()
