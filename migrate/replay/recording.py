"""What one side's optimizer step computed, as its own step code reports it at its seams.

Both trainers call the same three methods (golden/train_torch.py `optimizer_step`'s `observe`,
`migrate.train.step.optimizer.SplitSteps`'s): ``micro`` after each micro-batch's backward (the
MindSpore side also hands the gradient that micro-batch added, `MicroStep.tap`; torch adds into
.grad out of sight), ``clipped`` after clipping, ``stepped`` after AdamW. Arrays are numpy, by each side's own
parameter names; the pairing is `judging`'s.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np


@dataclass
class StepRecording:
    losses: list = field(default_factory=list)      # per micro-batch
    grads: list = field(default_factory=list)       # per micro-batch: name -> accumulated gradient so far
    added: list = field(default_factory=list)       # per micro-batch: name -> the gradient it added (None: not seen)
    grad_norm: float | None = None                  # before clipping (unscaled)
    clipped_norm: float | None = None               # measured on the clipped gradients
    clipped_grads: dict | None = None               # name -> the gradient AdamW was handed (clipped, unscaled)
    lr: float | None = None                         # the lr AdamW stepped with
    moments: dict = field(default_factory=dict)     # "exp_avg" | "exp_avg_sq" -> name -> array, after the step
    params: dict = field(default_factory=dict)      # name -> array, after the step
    params_before: dict = field(default_factory=dict)  # name -> array, before it (set by the replay)
    skipped: bool = False
    forward: list = field(default_factory=list)     # `probe.live.Compared` of micro-batch 0's forward (set by judging)
    ranks: list = field(default_factory=list)       # a dp replay: per rank, (grads, added) of its micro-batches

    # ---- the seams
    def micro(self, index: int, loss: float, grads: dict, added: dict | None = None) -> None:
        self.losses.append(float(loss))
        self.grads.append(grads)
        self.added.append(added)

    def clipped(self, grad_norm: float, clipped_norm: float, grads: dict | None) -> None:
        self.grad_norm, self.clipped_norm, self.clipped_grads = float(grad_norm), float(clipped_norm), grads

    def stepped(self, lr: float, moments: dict, params: dict, skipped: bool) -> None:
        self.lr, self.moments, self.params, self.skipped = float(lr), moments, params, bool(skipped)

    # ---- derived
    def over_ranks(self, dp: int, reduced: dict) -> StepRecording:
        """A dp step replayed on one process (`ranks.RanksInOneProcess`: its seams saw rank 0's micro-batches,
        then rank 1's, ...) as the global batch's step: each micro-batch's loss and accumulated gradients the
        mean over the ranks (the loss as `mean_over_ranks` forms it, the gradients as the reducer: fp32 sum in
        rank order x 1/dp), the last micro-batch's gradients the ones the reduction returned (`reduced`,
        by name); each rank's own accumulation kept in `ranks` for the accumulation stage."""
        accum = len(self.losses) // dp
        cut = [slice(r * accum, (r + 1) * accum) for r in range(dp)]
        inv = np.float32(1.0 / dp)
        losses, grads = [], []
        for m in range(accum):
            total = np.float32(0.0)
            for r in range(dp):
                total = np.float32(total + np.float32(self.losses[r * accum + m]))
            losses.append(float(total) / dp)
            mean = {}
            for name in self.grads[m]:
                acc = self.grads[m][name].astype(np.float32)
                for r in range(1, dp):
                    acc = acc + self.grads[r * accum + m][name].astype(np.float32)
                mean[name] = acc * inv
            grads.append(mean)
        grads[-1] = reduced
        return dataclasses.replace(self, losses=losses, grads=grads, added=[None] * accum,
                                   ranks=[(self.grads[c], self.added[c]) for c in cut])

    def clip_factor(self, inv_scale: float = 1.0) -> float | None:
        """The factor the step multiplied its gradients by when clipping, measured on them: the least-squares
        ratio of the gradients AdamW was handed to the accumulated ones (unscaled by `inv_scale`), in float64.
        Each element rounds on its own, so over many elements this is the factor itself to a few 1e-9."""
        if self.clipped_grads is None or not self.grads:
            return None
        num = den = 0.0
        for name, g in self.grads[-1].items():
            g = g.astype(np.float64) * inv_scale
            num += float(np.dot(self.clipped_grads[name].astype(np.float64).ravel(), g.ravel()))
            den += float(np.dot(g.ravel(), g.ravel()))
        return num / den if den > 0 else None
