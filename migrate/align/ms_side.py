"""The converted side of `migrate diff`: the bundled MindSpore model (the class
model.yaml names), called with keyword arguments so that every bundled model fits. Its forward
is recorded by probe's hooks (`probe.live`); this side adds the gradients, the AdamW step and
the greedy generation of `--grads` and `--generate`."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import mindspore as ms
import numpy as np

from migrate.infer.batch import make_batch
from migrate.infer.generate import generate
from migrate.infer.runners import CachedRunner
from migrate.infer.sampling import Sampling
from migrate.models.mode import execution_mode
from migrate.probe.sides import load_converted_model
from migrate.train.optim import AdamW, overwrite


def _as_numpy(t) -> np.ndarray:
    """float32 numpy; a float32 tensor's own memory, not a cast's copy (astype copies even to its own dtype)."""
    return (t if t.dtype == ms.float32 else t.astype(ms.float32)).asnumpy()


class MSSide:
    def __init__(self, ms_dir: Path, dtype: str, seed: int, trust: bool = False):
        self.trust = trust  # `--trust-model-class`: a fault that rebuilds the model builds it so too
        self.model, self.config = load_converted_model(ms_dir, dtype, seed, trust)  # as probe opens it
        # What the model returns before its hidden states, by HF output name.
        self.outputs = tuple(getattr(type(self.model), "OUTPUTS", ("logits", "loss")))
        self.has_loss = "loss" in self.outputs

    def _tensors(self, inputs):
        ids = ms.Tensor(inputs.ids.astype(np.int32))
        mask = None if inputs.mask is None else ms.Tensor(inputs.mask.astype(np.int32))
        labels = ms.Tensor(inputs.labels.astype(np.int32))
        return ids, mask, labels

    def _call(self, ids, mask, labels, output_hidden_states=False):
        extra = {"labels": labels} if self.has_loss else {}
        return self.model(ids, attention_mask=mask, output_hidden_states=output_hidden_states, **extra)

    def gradients(self, inputs) -> tuple[float, dict[str, np.ndarray]]:
        ids, mask, labels = self._tensors(inputs)
        params = self.model.trainable_params()

        def loss_fn(ids, mask, labels):
            return self._call(ids, mask, labels)[1]

        loss, grads = ms.value_and_grad(loss_fn, None, params)(ids, mask, labels)
        self._grads = grads
        return float(loss.asnumpy()), {p.name: _as_numpy(g) for p, g in zip(params, grads, strict=True)}

    def parameter_names(self) -> list[str]:
        return [p.name for p in self.model.trainable_params()]

    def adamw_steps(self, names, lr: float, betas, eps: float, weight_decay: float) \
            -> Iterator[tuple[str, np.ndarray, np.ndarray, np.ndarray]]:
        """One AdamW step on fp32 master copies fed the last `gradients` call's gradients (mixed
        precision's recipe, so low-precision runs compare the same thing), by the MindSpore trainer's
        AdamW (`migrate.train.optim`: torch's semantics op for op, what `migrate train` steps with).
        Per name in `names`, in that order: the parameter before the step, its gradient (what
        `align.optimizer_reference` steps torch's AdamW with) and the parameter after, float32.

        One tensor at a time: AdamW is elementwise per tensor and every tensor here is in one group
        with the same hyperparameters, so a tensor stepped alone takes the very step it takes among
        the others, and only a master and moments per shape are held instead of the whole model's.
        `mindspore.experimental.optim.AdamW` compiled a graph over every tensor first: 40 s of a
        254 M model's 110 s `diff --grads` (bench/diff.py). Tensors of one shape share one master and
        one optimizer, restarted for each (moments zeroed, step count 0): a Parameter, an optimizer
        and moments made per tensor wrote into fresh memory every time. The arrays
        yielded for a tensor are valid until the next tensor of its shape."""
        pairs = {p.name: (p, g) for p, g in zip(self.model.trainable_params(), self._grads, strict=True)}
        steppers: dict[tuple[int, ...], tuple[ms.Parameter, AdamW]] = {}
        for name in names:
            param, grad = pairs.pop(name)
            before = _as_numpy(param)
            # In PyNative whatever --mode says: a graph per tensor would compile once per tensor.
            with execution_mode("pynative"):
                if before.shape in steppers:
                    master, opt = steppers[before.shape]
                    overwrite(master, before)  # into the master's own memory: `before` stays as read
                    opt.restart()
                else:
                    # From numpy (CPU has no bf16 Identity kernel to copy a bf16 parameter); the Parameter
                    # holds memory of its own, which the step writes in place.
                    master = ms.Parameter(ms.from_numpy(before), name=f"master{len(steppers)}")
                    opt = AdamW([{"params": [master], "weight_decay": weight_decay}], lr=lr, betas=betas, eps=eps)
                    opt.zero_moments()
                    steppers[before.shape] = master, opt
                opt.step([grad if grad.dtype == ms.float32 else grad.astype(ms.float32)])
            yield name, before, _as_numpy(grad), _as_numpy(master)

    def generate(self, prompt: np.ndarray, steps: int) -> list[int]:
        """Greedy decoding through the model's KV cache (`migrate.infer`), no stop token."""
        batch = make_batch([prompt.tolist()], 0, self.config.vocab_size)
        runner = CachedRunner(self.model, 1, batch.prompt_len, batch.prompt_len + steps)
        return generate(runner, batch, steps, Sampling()).tokens[0].tolist()
