"""The cells one training step runs: the loss on pre-shifted targets, one micro-batch's
loss and accumulated gradients, and the micro-step over a pipeline-parallel network.

The trainer (`migrate.train.trainer`), evaluation and the parallel wiring
(`migrate.train.parallel_setup`) all build on these; they hold no loop.
"""
from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import Parameter, ParameterTuple, nn, ops
from mindspore.common.initializer import initializer

from migrate.models.common import masked_lm_loss
from migrate.parallel.layout import Layout

IGNORE_INDEX = -100  # HF's ignore_index; the data pipeline never emits it, padding would


def causal_lm_loss(logits, targets, vocab_size: int):
    """HF ForCausalLMLoss with pre-shifted labels: mean cross-entropy of fp32 logits."""
    return masked_lm_loss(logits, targets, vocab_size, IGNORE_INDEX)


_accumulate = ops.MultitypeFuncGraph("migrate_accumulate")


@_accumulate.register("Tensor", "Tensor")
def _accumulate_one(acc, grad):
    return ops.assign_add(acc, grad)


_accumulate_bf16 = ops.MultitypeFuncGraph("migrate_accumulate_bf16")


@_accumulate_bf16.register("Tensor", "Tensor")
def _accumulate_bf16_one(acc, grad):
    """acc = bf16(bf16(acc) + bf16(grad)), held in the fp32 buffer (fault bf16_accum). The sum of two
    bf16 values is exact in fp32 (their exponents lie within 24 bits here), so rounding it once is
    bf16 addition; the casts keep it off bf16 kernels MindSpore's CPU backend lacks."""
    rounded = ops.cast(ops.cast(grad, ms.bfloat16), ms.float32)
    return ops.assign(acc, ops.cast(ops.cast(acc + rounded, ms.bfloat16), ms.float32))


_copy = ops.MultitypeFuncGraph("migrate_copy")


@_copy.register("Tensor", "Tensor")
def _copy_one(tap, grad):
    return ops.assign(tap, grad)


class MicroStep(nn.Cell):
    """One micro-batch: returns its loss and adds d(loss / loss_divisor * scale)/d params into
    `grads`, fp32 Parameters zeroed after each optimizer step (`optimizer_step.ClipAndStep`).
    In place: a tuple of gradients returned per micro-batch costs a graph output per parameter.
    grad_factors (fault injection only, `knob_faults`): each gradient times its factor as the
    backward hands it over (`adjust`); None, as every real run has it, adds nothing to the graph.
    accum_dtype: "float32" (torch's: p.grad in the fp32 master weights' dtype) or "bfloat16" (fault
    bf16_accum: every add rounded to bf16). `tap()` (a replay only, before the first call) makes each
    call also copy the gradient it adds into `taps`, so the accumulation itself can be judged."""

    def __init__(self, model, params, loss_divisor: int, grad_factors=None, accum_dtype: str = "float32"):
        super().__init__(auto_prefix=False)
        self.grad_factors = None if grad_factors is None else tuple(
            ms.Tensor(np.float32(f)) for f in grad_factors)
        if accum_dtype not in ("float32", "bfloat16"):
            raise ValueError(f"accumulation dtype float32 or bfloat16, got {accum_dtype!r}")
        self.accum_dtype = accum_dtype
        self.taps = None
        self.model = model
        self.vocab_size = model.vocab_size
        self.loss_divisor = loss_divisor
        self.weights = ParameterTuple(params)
        self.grads = ParameterTuple([Parameter(initializer("zeros", p.shape, ms.float32), name="grad_acc." + p.name,
                                               requires_grad=False) for p in params])
        self.grad_fn = ops.value_and_grad(self.forward, None, self.weights, has_aux=True)
        self.hyper_map = ops.HyperMap()

    def forward(self, input_ids, targets, scale):
        logits, _, _ = self.model(input_ids)
        loss = causal_lm_loss(logits, targets, self.vocab_size)
        return loss / self.loss_divisor * scale, loss

    def adjust(self, grads):
        """The backward seam: the gradients as the step goes on with them (the fault's factors applied)."""
        if self.grad_factors is None:
            return grads
        return self.hyper_map(ops.mul, grads, self.grad_factors)

    def tap(self) -> None:
        """Copy each micro-batch's gradient, as it is added, into `taps` (a replay's recording seam)."""
        if self.taps is None:
            self.taps = ParameterTuple([Parameter(initializer("zeros", p.shape, ms.float32), name="micro_tap." + p.name,
                                                  requires_grad=False) for p in self.weights])

    def construct(self, input_ids, targets, scale):
        (_, loss), grads = self.grad_fn(input_ids, targets, scale)
        grads = self.adjust(grads)
        if self.taps is not None:
            loss = ops.depend(loss, self.hyper_map(_copy, self.taps, grads))
        if self.accum_dtype == "bfloat16":
            return ops.depend(loss, self.hyper_map(_accumulate_bf16, self.grads, grads))
        return ops.depend(loss, self.hyper_map(_accumulate, self.grads, grads))


class PreShiftedLMLoss(nn.Cell):
    """loss = net(input_ids, targets), targets already shifted: evaluation, and the loss
    network MindSpore's Pipeline wraps."""

    def __init__(self, model):
        super().__init__(auto_prefix=False)
        self.model = model
        self.vocab_size = model.vocab_size

    def construct(self, input_ids, targets):
        logits, _, _ = self.model(input_ids)
        return causal_lm_loss(logits, targets, self.vocab_size)


def pipeline_micro_step(training, layout: Layout, network):
    """The trainer's MicroStep over a Pipeline network: it sums micro_batches losses, so the
    divisor grows by micro_batches and the logged loss is their mean."""
    class PipelineMicroStep(MicroStep):
        def __init__(self):
            super().__init__(training.model, list(training.optimizer.parameters),
                             training.micro.loss_divisor * layout.micro_batches)
            self.network = network
            self.parts = layout.micro_batches

        def forward(self, input_ids, targets, scale):
            total = self.network(input_ids, targets)
            return total / self.loss_divisor * scale, total / self.parts

    return PipelineMicroStep()
