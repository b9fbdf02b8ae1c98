"""Operator-level shard strategies for the bundled Llama, applied from outside the model.

    strategies = assign_strategies(model, layout)    # {"model.layers.0.attention.wq.matmul": ((2, 1), (4, 1)), ...}

The bundled model (migrate/models/llama.py) computes its projections with
`mint.nn.functional.linear` and its attention with `mint.matmul`: functional
calls that carry no primitive object, so nothing to call `.shard()` on.
`assign_strategies` therefore swaps cells for drop-in subclasses that hold
MindSpore primitives (`ops.MatMul`, `ops.BatchMatMul`, `ops.Gather`,
`ops.Softmax`), keeps the very same Parameter objects (names, values and the
optimizer's references are untouched), and sets the strategies on those
primitives. On a single device the strategies are ignored and the swapped
model computes what the original does (tests check it).

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
(construct(h, weight)); it is swapped and annotated like lm_head, its weight
operand split over the vocabulary like the embedding gather's table.
"""
from __future__ import annotations

from mindspore import mint, nn, ops

from migrate.models.llama import F32, Linear, LlamaAttention, LlamaEmbedding, TiedHead
from migrate.parallel.layout import Layout, check, kv_replicated


def _copy_precision(dst: nn.Cell, src: nn.Cell) -> None:
    dst.emulate, dst.cdtype, dst.act = src.emulate, src.cdtype, src.act
    dst.training = src.training


class ShardedLinear(Linear):
    """`Linear` through an `ops.MatMul` primitive (weight (out, in), transpose_b) that can carry a strategy."""

    def __init__(self, linear: Linear):
        nn.Cell.__init__(self)
        _copy_precision(self, linear)
        self.weight = linear.weight
        self.bias = linear.bias
        self.matmul = ops.MatMul(transpose_b=True)
        self.bias_add = ops.Add() if linear.bias is not None else None

    def set_strategy(self, kind: str, dp: int, mp: int) -> None:
        """kind: "column" (split out dim), "row" (split in dim), "replicated" (weight whole on every rank)."""
        strategies = {
            "column": (((dp, 1), (mp, 1)), ((dp, mp), (mp,))),
            "row": (((dp, mp), (1, mp)), ((dp, 1), (1,))),
            "replicated": (((dp, 1), (1, 1)), ((dp, 1), (1,))),
        }
        if kind not in strategies:
            raise ValueError(f"unknown linear strategy kind {kind!r}")
        matmul, bias = strategies[kind]
        self.matmul.shard(matmul)
        if self.bias_add is not None:
            self.bias_add.shard(bias)

    def construct(self, x):
        shape = x.shape
        y = self.matmul(x.reshape(-1, shape[-1]), self._p(self.weight))
        if self.bias is not None:
            y = self.bias_add(y, self._p(self.bias))
        return self._r(y.reshape(shape[:-1] + (y.shape[-1],)))


class ShardedEmbedding(LlamaEmbedding):
    """`LlamaEmbedding` with its lookup as an `ops.Gather` primitive."""

    def __init__(self, emb: LlamaEmbedding):
        nn.Cell.__init__(self)
        _copy_precision(self, emb)
        self.embedding_weight = emb.embedding_weight
        self.padding_idx = emb.padding_idx
        self.gather = ops.Gather()

    def set_strategy(self, dp: int, mp: int) -> None:
        self.gather.shard(((mp, 1), (dp, 1)))

    def construct(self, input_ids, weight=None):
        if weight is None:
            weight = self._p(self.embedding_weight)
        out = self.gather(weight, input_ids, 0)
        if self.padding_idx is not None:
            keep = (input_ids != self.padding_idx).expand_dims(-1)
            out = mint.where(keep, out, ops.stop_gradient(out))
        return out


class ShardedTiedHead(TiedHead):
    """`TiedHead` through an `ops.MatMul` primitive: h · Eᵀ with E the (vocab, hidden) embedding table."""

    def __init__(self, head: TiedHead):
        nn.Cell.__init__(self)
        _copy_precision(self, head)
        self.matmul = ops.MatMul(transpose_b=True)

    def set_strategy(self, dp: int, mp: int) -> None:
        # Vocab-parallel: the table is split over its rows, as for the embedding gather.
        self.matmul.shard(((dp, 1), (mp, 1)))

    def construct(self, h, weight):
        shape = h.shape
        y = self.matmul(h.reshape(-1, shape[-1]), weight)
        return self._r(y.reshape(shape[:-1] + (y.shape[-1],)))


class ShardedAttention(LlamaAttention):
    """`LlamaAttention` with q·kᵀ, softmax and probs·v as primitives; same math, same parameters.

    construct mirrors LlamaAttention.construct line for line with the three
    functional calls replaced; tests compare the two on CPU.
    """

    def __init__(self, attn: LlamaAttention):
        nn.Cell.__init__(self)
        _copy_precision(self, attn)
        for name in ("num_heads", "n_kv_heads", "n_rep", "head_dim", "scaling", "dropout", "qkv_concat"):
            setattr(self, name, getattr(attn, name))
        for name in _projections(attn):
            setattr(self, name, _as_sharded_linear(getattr(attn, name)))
        self.bmm_qk = ops.BatchMatMul(transpose_b=True)
        self.softmax = ops.Softmax(axis=-1)
        self.bmm_pv = ops.BatchMatMul()

    def set_strategy(self, dp: int, mp: int, kv_replicated: bool) -> None:
        if self.qkv_concat:
            if kv_replicated:  # layout.validate refuses this; k/v rows are fused with q's
                raise ValueError("a fused w_qkv cannot replicate k/v apart from q")
            self.w_qkv.set_strategy("column", dp, mp)  # whole KV groups per rank (module docstring)
        else:
            self.wq.set_strategy("column", dp, mp)
            for proj in (self.wk, self.wv):
                proj.set_strategy("replicated" if kv_replicated else "column", dp, mp)
        self.wo.set_strategy("row", dp, mp)
        heads = ((dp, mp, 1, 1), (dp, mp, 1, 1))
        self.bmm_qk.shard(heads)
        self.softmax.shard(((dp, mp, 1, 1),))
        self.bmm_pv.shard(heads)

    def construct(self, x, cos, sin, mask):
        b, s, _ = x.shape
        if self.qkv_concat:
            q, k, v = self._split_qkv(self.w_qkv(x), b, s)
        else:
            q = self.wq(x).reshape(b, s, self.num_heads, self.head_dim).swapaxes(1, 2)
            k = self.wk(x).reshape(b, s, self.n_kv_heads, self.head_dim).swapaxes(1, 2)
            v = self.wv(x).reshape(b, s, self.n_kv_heads, self.head_dim).swapaxes(1, 2)
        q = self._rope(q, cos, sin)
        k = self._repeat_kv(self._rope(k, cos, sin))
        v = self._repeat_kv(v)

        scores = self._r(self._r(self.bmm_qk(q, k)) * self.scaling)
        scores = self._r(scores + mask)
        probs = self._r(self.softmax(scores.astype(F32)).astype(self.act))
        if self.training and self.dropout > 0:
            probs = ops.dropout(probs, p=self.dropout, training=True)
        out = self._r(self.bmm_pv(probs, v))
        out = out.swapaxes(1, 2).reshape(b, s, self.num_heads * self.head_dim)
        return self.wo(out)


def _as_sharded_linear(cell):
    return cell if isinstance(cell, ShardedLinear) else ShardedLinear(cell)


def _projections(attn) -> tuple[str, ...]:
    return ("w_qkv", "wo") if attn.qkv_concat else ("wq", "wk", "wv", "wo")


def _ffn_columns(ffn) -> tuple[str, ...]:
    """The feed-forward's column-parallel projections (w2 is the row-parallel one)."""
    return ("w_gate_hidden",) if ffn.ffn_concat else ("w1", "w3")


def _sharded_cells(model):
    """Swap the model's cells for the primitive-carrying subclasses (idempotent); return them."""
    inner = model.model
    if not isinstance(inner.tok_embeddings, ShardedEmbedding):
        inner.tok_embeddings = ShardedEmbedding(inner.tok_embeddings)
    for layer in inner.layers:
        if not isinstance(layer.attention, ShardedAttention):
            layer.attention = ShardedAttention(layer.attention)
        ffn = layer.feed_forward
        for name in _ffn_columns(ffn) + ("w2",):
            setattr(ffn, name, _as_sharded_linear(getattr(ffn, name)))
    if _has_cell(model, "lm_head"):
        model.lm_head = _as_sharded_linear(model.lm_head)
    elif not isinstance(model.tied_head, ShardedTiedHead):
        model.tied_head = ShardedTiedHead(model.tied_head)
    # Cell.__setattr__ prefixes the names of a new child's parameters; put back
    # the full paths the model (and its checkpoints) use.
    for name, param in model.parameters_and_names():
        param.name = name


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
    _sharded_cells(model)
    inner = model.model
    inner.tok_embeddings.set_strategy(dp, mp)
    replicated = kv_replicated(layout, config)
    for layer in inner.layers:
        layer.attention.set_strategy(dp, mp, replicated)
        ffn = layer.feed_forward
        for name in _ffn_columns(ffn):
            getattr(ffn, name).set_strategy("column", dp, mp)
        ffn.w2.set_strategy("row", dp, mp)
    if _has_cell(model, "lm_head"):
        model.lm_head.set_strategy("column", dp, mp)
    else:
        model.tied_head.set_strategy(dp, mp)
    return read_strategies(model)


def read_strategies(model) -> dict[str, tuple]:
    """op path -> in_strategy for every primitive of the model that carries one."""
    out = {}
    for cell_name, cell in model.cells_and_names():
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
        if isinstance(cell, ShardedLinear):
            strategy = cell.matmul.attrs.get("in_strategy")
            if strategy:
                splits[prefix + "weight"] = tuple(strategy[1])
                if cell.bias is not None:
                    splits[prefix + "bias"] = tuple(cell.bias_add.attrs["in_strategy"][1])
        elif isinstance(cell, ShardedEmbedding):
            strategy = cell.gather.attrs.get("in_strategy")
            if strategy:
                splits[prefix + "embedding_weight"] = tuple(strategy[0])
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
        for dim, ways in zip(param.shape, splits[name]):
            count *= dim // ways
        total += count
    return total


__all__ = [
    "ShardedAttention", "ShardedEmbedding", "ShardedLinear", "ShardedTiedHead",
    "assign_strategies", "param_splits", "per_device_params", "read_strategies",
]
