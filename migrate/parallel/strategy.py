"""Operator-level shard strategies for the bundled Llama, applied from outside the model.

    strategies = assign_strategies(model, layout)    # {"model.layers.0.attention.wq.matmul": ((2, 1), (4, 1)), ...}

The bundled model computes its matmuls, attention softmax and embedding lookup
through kernel cells (`migrate.models.kernels`): seams whose defaults are
functional calls that carry no primitive, so nothing to call `.shard()` on.
`assign_strategies` swaps each for a kernel built from MindSpore primitives
(`ops.MatMul`, `ops.Add`, `ops.BatchMatMul`, `ops.Softmax`, `ops.Gather`) and
sets the strategies on those primitives. Nothing else changes: the cells, their
Parameters (names, values, the optimizer's references) and their precision
policy (kernels round nothing; the owning cell rounds around them, so an
autocast model stays autocast). On a single device the strategies are ignored
and the model computes what it did (tests check it).

Strategies follow MindFormers' Llama (weights are (out, in), so MatMul has
transpose_b=True; activations are flattened to (batch·seq, hidden)):

  op                              in_strategy                     meaning
  wq / w1 / w3 (column parallel)  ((dp, 1), (mp, 1))              weight split over out dim
  w_qkv / w_gate_hidden (fused)   ((dp, 1), (mp, 1))              column parallel too (see below)
  wk / wv                         ((dp, 1), (mp, 1))              or ((dp, 1), (1, 1)) when kv heads are replicated
  wo / w2 (row parallel)          ((dp, mp), (1, mp))             weight split over in dim; output all-reduced
  bias of a column projection     ((dp, mp), (mp,))
  bias of a row projection        ((dp, 1), (1,))
  q·kᵀ, probs·v (BatchMatMul)     ((dp, mp, 1, 1), (dp, mp, 1, 1))  heads split over mp
  softmax                         ((dp, mp, 1, 1),)
  embedding gather                ((mp, 1), (dp, 1))              vocab-parallel table, batch split over dp
  lm_head, or tied_head           ((dp, 1), (mp, 1))              vocab-parallel logits

An op is named by the model cell it computes for and its primitive
(`model.layers.0.attention.wq.matmul`, `...attention.bmm_qk`): a kernel is a
seam, not a layer, and adds no name of its own.

Norms, residual adds, RoPE and SwiGLU elementwise ops are not annotated:
under the default context (`parallel_context`, sharding propagation) MindSpore
derives their layouts from the annotated ops; under plain semi-auto they take
MindSpore's default data-parallel strategy.

Fused layouts (`qkv_concat`): w_qkv's rows come in whole KV groups ([q heads
of group g | k_g | v_g]), so splitting its output rows over mp gives every
rank n_kv_heads / mp complete groups, the same heads a split wq/wk/wv would
give it; w_gate_hidden's rows interleave gate/up (g0, u0, g1, u1, ...), so a
split gives every rank matched pairs for a contiguous range of intermediate
indices, which is what the row-parallel w2 expects. Replicated k/v
(n_kv_heads < mp) cannot be had without also replicating q; layout.validate
refuses that combination.

Tied embeddings: the head is the parameter-free `tied_head` cell
(construct(h, weight)); its kernel is swapped and annotated like lm_head's, its
weight operand split over the vocabulary like the embedding gather's table.
"""
from __future__ import annotations

from mindspore import ops

from migrate.models.common import Embedding, Linear, TiedHead
from migrate.models.kernels import Kernel, linear_rows
from migrate.models.llama import LlamaAttention
from migrate.parallel.layout import Layout, check, kv_replicated

_LINEAR_STRATEGIES = {  # kind -> (matmul, bias add)
    "column": lambda dp, mp: (((dp, 1), (mp, 1)), ((dp, mp), (mp,))),
    "row": lambda dp, mp: (((dp, mp), (1, mp)), ((dp, 1), (1,))),
    "replicated": lambda dp, mp: (((dp, 1), (1, 1)), ((dp, 1), (1,))),
}


class ShardedKernel(Kernel):
    """Base of the kernels built from primitives that carry shard strategies."""


class ShardedLinearKernel(ShardedKernel):
    """x·Wᵀ + b through `ops.MatMul(transpose_b=True)` and `ops.Add` (only with a bias)."""

    def __init__(self, has_bias: bool):
        super().__init__()
        self.matmul = ops.MatMul(transpose_b=True)
        self.bias_add = ops.Add() if has_bias else None

    def set_strategy(self, kind: str, dp: int, mp: int) -> None:
        """kind: "column" (split out dim), "row" (split in dim), "replicated" (weight whole on every rank)."""
        if kind not in _LINEAR_STRATEGIES:
            raise ValueError(f"unknown linear strategy kind {kind!r}")
        matmul, bias = _LINEAR_STRATEGIES[kind](dp, mp)
        self.matmul.shard(matmul)
        if self.bias_add is not None:
            self.bias_add.shard(bias)

    def construct(self, x, weight, bias=None):
        return linear_rows(self.matmul, x, weight, bias, self.bias_add)


class ShardedScoresKernel(ShardedKernel):
    """q·kᵀ through `ops.BatchMatMul(transpose_b=True)`."""

    def __init__(self):
        super().__init__()
        self.bmm_qk = ops.BatchMatMul(transpose_b=True)

    def construct(self, q, k):
        return self.bmm_qk(q, k)


class ShardedMixKernel(ShardedKernel):
    """probs·v through `ops.BatchMatMul`."""

    def __init__(self):
        super().__init__()
        self.bmm_pv = ops.BatchMatMul()

    def construct(self, probs, v):
        return self.bmm_pv(probs, v)


class ShardedSoftmaxKernel(ShardedKernel):
    def __init__(self):
        super().__init__()
        self.softmax = ops.Softmax(axis=-1)

    def construct(self, x):
        return self.softmax(x)


class ShardedLookupKernel(ShardedKernel):
    """table[ids] through `ops.Gather`."""

    def __init__(self):
        super().__init__()
        self.gather = ops.Gather()

    def set_strategy(self, dp: int, mp: int) -> None:
        self.gather.shard(((mp, 1), (dp, 1)))

    def construct(self, table, ids):
        return self.gather(table, ids, 0)


def _swap(cell, seam: str, make) -> None:
    if not isinstance(getattr(cell, seam), ShardedKernel):
        setattr(cell, seam, make())


def _shard_kernels(model) -> None:
    """Swap every kernel of the model for its primitive-carrying version (idempotent)."""
    for _, cell in list(model.cells_and_names()):
        if isinstance(cell, Linear):
            _swap(cell, "kernel", lambda cell=cell: ShardedLinearKernel(cell.bias is not None))
        elif isinstance(cell, TiedHead):  # h·Eᵀ: a linear without bias over the embedding table
            _swap(cell, "kernel", lambda: ShardedLinearKernel(has_bias=False))
        elif isinstance(cell, Embedding):
            _swap(cell, "lookup", ShardedLookupKernel)
        elif isinstance(cell, LlamaAttention):
            _swap(cell, "scores", ShardedScoresKernel)
            _swap(cell, "softmax", ShardedSoftmaxKernel)
            _swap(cell, "mix", ShardedMixKernel)


def _shard_attention(attn, dp: int, mp: int, kv_replicated: bool) -> None:
    if attn.qkv_concat:
        if kv_replicated:  # layout.validate refuses this; k/v rows are fused with q's
            raise ValueError("a fused w_qkv cannot replicate k/v apart from q")
        attn.w_qkv.kernel.set_strategy("column", dp, mp)  # whole KV groups per rank (module docstring)
    else:
        attn.wq.kernel.set_strategy("column", dp, mp)
        for proj in (attn.wk, attn.wv):
            proj.kernel.set_strategy("replicated" if kv_replicated else "column", dp, mp)
    attn.wo.kernel.set_strategy("row", dp, mp)
    heads = ((dp, mp, 1, 1), (dp, mp, 1, 1))
    attn.scores.bmm_qk.shard(heads)
    attn.softmax.softmax.shard(((dp, mp, 1, 1),))
    attn.mix.bmm_pv.shard(heads)


def _ffn_columns(ffn) -> tuple[str, ...]:
    """The feed-forward's column-parallel projections (w2 is the row-parallel one)."""
    return ("w_gate_hidden",) if ffn.ffn_concat else ("w1", "w3")


def _has_cell(model, name: str) -> bool:
    return name in model.name_cells()


def assign_strategies(model, layout: Layout) -> dict[str, tuple]:
    """Annotate every matmul (and the embedding gather, attention softmax) of the bundled model.

    Returns op path -> in_strategy, read back from the primitives' attributes
    (what MindSpore compiles from), so the map is a check, not a restatement.
    """
    config = model.config
    check(layout, config)
    dp, mp = layout.dp, layout.mp
    _shard_kernels(model)
    inner = model.model
    inner.tok_embeddings.lookup.set_strategy(dp, mp)
    replicated = kv_replicated(layout, config)
    for layer in inner.layers:
        _shard_attention(layer.attention, dp, mp, replicated)
        ffn = layer.feed_forward
        for name in _ffn_columns(ffn):
            getattr(ffn, name).kernel.set_strategy("column", dp, mp)
        ffn.w2.kernel.set_strategy("row", dp, mp)
    # Vocab-parallel logits: the head's (or tied table's) rows split like the embedding gather's.
    head = model.lm_head if _has_cell(model, "lm_head") else model.tied_head
    head.kernel.set_strategy("column", dp, mp)
    return read_strategies(model)


def read_strategies(model) -> dict[str, tuple]:
    """op path -> in_strategy for every primitive of the model that carries one (module docstring)."""
    out = {}
    for cell_name, cell in model.cells_and_names():
        if isinstance(cell, Kernel):  # named by the cell it computes for
            cell_name = cell_name.rpartition(".")[0]
        for prim_name, prim in cell._primitives.items():  # noqa: SLF001 - Cell keeps its primitives here
            if prim is None:
                continue
            strategy = prim.attrs.get("in_strategy")
            if strategy is not None:
                out[f"{cell_name}.{prim_name}" if cell_name else prim_name] = strategy
    return out


def param_splits(model) -> dict[str, tuple[int, ...]]:
    """Parameter name -> how many ways each of its dims is split, derived from the assigned strategies.

    The weight of a projection takes the strategy of its matmul's second
    input; the embedding table that of the gather's first input; everything
    else (norms) is replicated. Used to count per-device parameters.
    """
    splits = {}
    for cell_name, cell in model.cells_and_names():
        prefix = f"{cell_name}." if cell_name else ""
        if isinstance(cell, Linear) and isinstance(cell.kernel, ShardedLinearKernel):
            strategy = cell.kernel.matmul.attrs.get("in_strategy")
            if strategy:
                splits[prefix + "weight"] = tuple(strategy[1])
                if cell.bias is not None:
                    splits[prefix + "bias"] = tuple(cell.kernel.bias_add.attrs["in_strategy"][1])
        elif isinstance(cell, Embedding) and isinstance(cell.lookup, ShardedLookupKernel):
            strategy = cell.lookup.gather.attrs.get("in_strategy")
            if strategy:
                splits[prefix + cell.attr] = tuple(strategy[0])
    out = {}
    for name, param in model.parameters_and_names():
        out[name] = splits.get(name, (1,) * len(param.shape))
    return out


def per_device_params(model) -> int:
    """Parameters one device holds under the assigned strategies (all stages together)."""
    total = 0
    splits = param_splits(model)
    for name, param in model.parameters_and_names():
        count = 1
        for dim, ways in zip(param.shape, splits[name], strict=True):
            count *= dim // ways
        total += count
    return total


__all__ = [
    "ShardedKernel", "ShardedLinearKernel", "ShardedLookupKernel", "ShardedMixKernel",
    "ShardedScoresKernel", "ShardedSoftmaxKernel",
    "assign_strategies", "param_splits", "per_device_params", "read_strategies",
]
