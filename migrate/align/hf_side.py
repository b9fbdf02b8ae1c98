"""The reference side of `migrate diff`: HF's own PyTorch model, of the class its
config.json names (`architectures`: GPT2LMHeadModel, BertModel, BertForMaskedLM, ...).

Intermediate outputs are read with forward hooks on the modules the keymap's
`align` table names, so nothing about HF's module tree is written here.
"""
from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np
import torch

from migrate.checkpoints.dtypes import torch_to_numpy
from migrate.errors import MigrateError
from migrate.probe.sides import load_hf_model

# Model outputs compared after the hidden states, by HF's ModelOutput attribute name
# (the bundled models return them in their `OUTPUTS` order): report name and kind.
OUTPUTS = {
    "logits": ("logits", "logits"),
    "loss": ("loss", "loss"),
    "last_hidden_state": ("last hidden state", "hidden"),
    "pooler_output": ("pooled output", "hidden"),
}


def _as_numpy(t: torch.Tensor) -> np.ndarray:
    """float32 for the compared sides, float64 kept for the twin (the model run in float64 in place)."""
    t = t.detach()
    return t.numpy() if t.dtype == torch.float64 else torch_to_numpy(t.float())


class HFSide:
    def __init__(self, hf_dir: Path, dtype: str, align: dict[str, str], num_layers: int, seed: int):
        self.model = load_hf_model(hf_dir, dtype, seed)  # `probe.sides`: eager attention, dropout off
        self._attach(_hook_points(align, num_layers))

    def _attach(self, points) -> None:
        self.takes_labels = "labels" in inspect.signature(self.model.forward).parameters
        self.can_generate = bool(getattr(self.model, "can_generate", lambda: False)())
        self.points = points
        modules = dict(self.model.named_modules())
        missing = [path for _, _, path in self.points if path not in modules]
        if missing:
            raise MigrateError(f"HF model has no module {missing[0]} (keymap align table)")
        self._captured: dict[str, torch.Tensor] = {}
        for _, _, path in self.points:
            modules[path].register_forward_hook(self._hook(path))

    def _hook(self, path: str):
        def capture(_module, _args, output):
            self._captured[path] = output[0] if isinstance(output, tuple) else output
        return capture

    def _run(self, inputs, labels: bool):
        ids = torch.from_numpy(inputs.ids)
        mask = None if inputs.mask is None else torch.from_numpy(inputs.mask)
        extra = {"labels": torch.from_numpy(inputs.labels)} if labels and self.takes_labels else {}
        return self.model(input_ids=ids, attention_mask=mask, **extra)

    def forward(self, inputs, detail: bool):
        """(hidden states [(block, layer, array)], outputs [(HF output name, array or float)])."""
        self._captured.clear()
        with torch.no_grad():
            out = self._run(inputs, labels=True)
        hidden = [(block, layer, _as_numpy(self._captured[path])) for block, layer, path in self.points
                  if detail or block not in ("attention", "mlp")]
        outputs = []
        for name in OUTPUTS:
            value = getattr(out, name, None)
            if value is not None:
                outputs.append((name, float(value) if name == "loss" else _as_numpy(value)))
        return hidden, outputs

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


def _hook_points(align: dict[str, str], num_layers: int) -> list[tuple[str, int | None, str]]:
    """(block, layer, HF module path) in forward order; "final norm" only where the
    model has one (BertModel's last hidden state is its last layer's output)."""
    if not align:
        raise MigrateError("keymap has no align table: migrate diff cannot pair hidden states")
    points = [("embedding", None, align["embedding"])]
    for i in range(num_layers):
        for block in ("attention", "mlp", "layer output"):
            points.append((block, i, align[block].replace("{layer}", str(i))))
    if "final norm" in align:
        points.append(("final norm", None, align["final norm"]))
    return points
