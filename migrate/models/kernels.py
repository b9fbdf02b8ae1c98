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
    attention.softmax       SoftmaxKernel                     softmax over the last axis
    attention.mix           MatMulKernel()                    probs·v
    Embedding.lookup        LookupKernel                      table[ids]
"""
from __future__ import annotations

from mindspore import mint, nn, ops


class Kernel(nn.Cell):
    """Base of kernel cells: a seam, not a layer (no precision of its own, no name in op paths)."""


class LinearKernel(Kernel):
    def construct(self, x, weight, bias=None):
        return mint.nn.functional.linear(x, weight, bias)


class MatMulKernel(Kernel):
    def __init__(self, transpose_b: bool = False):
        super().__init__()
        self.transpose_b = transpose_b
        self.matmul_bt = ops.BatchMatMul(transpose_b=True)

    def construct(self, a, b):
        if self.transpose_b:
            # a·bᵀ without a transposed copy of b (on CPU the copy of a KV cache's keys, or of a tied
            # head's table, cost more than the product): bᵀ as an attribute of the op, or as
            # torch.nn.Linear's layout when b is a 2-d table.
            if b.ndim == 2:
                return mint.nn.functional.linear(a, b)
            return self.matmul_bt(a, b)
        return mint.matmul(a, b)


class SoftmaxKernel(Kernel):
    def construct(self, x):
        return mint.nn.functional.softmax(x, dim=-1)


class LookupKernel(Kernel):
    def construct(self, table, ids):
        # ops.gather, not mint.nn.Embedding: the latter's backward fails on CPU.
        return ops.gather(table, ids, 0)
