"""Kernel cells: the swappable math inside the bundled models' cells.

A kernel is a seam: a cell that computes one op from the tensors it is handed
and has no precision of its own (the cell that owns it rounds around it, so a
swapped kernel keeps the model's precision policy). The defaults call
MindSpore's functional API and hold nothing; `migrate.parallel.strategy` swaps
in kernels built from primitives that carry shard strategies; a LoRA adapter
would wrap `Linear.kernel` (its result plus the low-rank update x·Aᵀ·Bᵀ).

    seam                    default                           computes
    Linear.kernel           LinearKernel                      x·Wᵀ + b (torch.nn.Linear)
    LinearInOut.kernel      MatMulKernel()                    x·W (HF Conv1D; the bias is added by the owner)
    TiedHead.kernel         MatMulKernel(transpose_b=True)    h·Eᵀ
    attention.scores        MatMulKernel(transpose_b=True)    q·kᵀ
    attention.softmax       SoftmaxKernel                     softmax over the last axis (the trainer's:
                                                              FusedSoftmaxKernel, its gradient one kernel)
    attention.mix           MatMulKernel()                    probs·v
    Embedding.lookup        LookupKernel                      table[ids]
"""
from __future__ import annotations

from mindspore import mint, nn, ops


class Kernel(nn.Cell):
    """Base of kernel cells: a seam, not a layer (no precision of its own, no name in op paths)."""


class LinearKernel(Kernel):
    """x·Wᵀ + b as one 2-d MatMul with Wᵀ an attribute of the op. Its gradients are MatMuls with
    transpose attributes too, where mint's linear (the Dense op) differentiates through Transpose
    copies of the weight and of the output's gradient: profiled on CPU, 178 such copies took
    0.88 s of a 115 M Llama's 3.9 s training step (bench/train_speed.py's big size). The same
    products: bit for bit in GRAPH_MODE, within float32 rounding in PyNative (tests/test_kernels.py)."""

    def __init__(self):
        super().__init__()
        self.matmul = ops.MatMul(transpose_b=True)

    def construct(self, x, weight, bias=None):
        return linear_rows(self.matmul, x, weight, bias)


def linear_rows(matmul, x, weight, bias=None, bias_add=None):
    """x·Wᵀ (+ b) over x's last axis: x's rows as one 2-d `matmul` (an `ops.MatMul(transpose_b=True)`),
    the bias added by `bias_add` (a sharded Add under tensor parallel) or `+`."""
    shape = x.shape
    y = matmul(x.reshape(-1, shape[-1]), weight)
    if bias is not None:
        y = y + bias if bias_add is None else bias_add(y, bias)
    return y.reshape(shape[:-1] + (y.shape[-1],))


class MatMulKernel(Kernel):
    def __init__(self, transpose_b: bool = False):
        super().__init__()
        self.transpose_b = transpose_b
        self.matmul_bt = ops.BatchMatMul(transpose_b=True)
        self.matmul_2d = ops.MatMul(transpose_b=True)
        # Batched products through BatchMatMul, not mint.matmul: mint's gradient copies through
        # Transpose ops (32 of them, 64 ms of a 115 M Llama's training step, profiled), BatchMatMul's
        # takes the transposes as attributes.
        self.batch_matmul = ops.BatchMatMul()

    def construct(self, a, b):
        if self.transpose_b:
            # a·bᵀ without a transposed copy of b (on CPU the copy of a KV cache's keys, or of a tied
            # head's table, cost more than the product): bᵀ as an attribute of the op, a 2-d table
            # through `LinearKernel`'s MatMul.
            if b.ndim == 2:
                return linear_rows(self.matmul_2d, a, b)
            return self.matmul_bt(a, b)
        if b.ndim == 2:
            # x·W (HF's Conv1D layout): mint's, whose bits GPT-2's parity was measured with (a 2-d
            # MatMul over the flattened rows sums in another order).
            return mint.matmul(a, b)
        return self.batch_matmul(a, b)


class SoftmaxKernel(Kernel):
    def construct(self, x):
        return mint.nn.functional.softmax(x, dim=-1)


class FusedSoftmaxKernel(SoftmaxKernel):
    """MindSpore's softmax, its gradient one fused kernel (fused_ops.cc) instead of a row sum, a
    difference and a product: the same figures within float32 rounding, torch's formula."""

    def __init__(self, grad_op):
        super().__init__()
        self.grad_op = grad_op

    def bprop(self, x, out, dout):
        return (self.grad_op(out, dout),)


class LookupKernel(Kernel):
    def construct(self, table, ids):
        # ops.gather, not mint.nn.Embedding: the latter's backward fails on CPU.
        return ops.gather(table, ids, 0)
