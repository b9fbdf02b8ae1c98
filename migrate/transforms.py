"""Tensor layout transforms between checkpoint formats: fuse, split, reorder.

Each layout is a named, invertible map from a list of source tensors to a list of
target tensors, so a keymap can name it as data:

    {from: [q_proj, k_proj, v_proj], to: [w_qkv], layout: qkv_groups}

and the converter applies `LAYOUTS[name].forward(arrays, cfg)` while the exporter
applies `.inverse(...)`. `cfg` is the MindSpore model config (a LlamaConfig or
its dict; HF's field names are read too), consulted only for head counts.

    layout = get_layout("qkv_groups")          # or a chain: ["transpose", "split_thirds"]
    (w_qkv,) = layout.forward([q, k, v], cfg)
    q2, k2, v2 = layout.inverse([w_qkv], cfg)   # bit-exact round trip
    layout.out_shapes([q.shape, k.shape, v.shape], cfg)  # plan without data
    layout.in_shapes([w_qkv.shape], cfg)                 # and the other way

Guarantees: pure numpy; only reshapes, concatenation, stacking, indexing and
transposition (never arithmetic), so every dtype, including MindSpore's numpy
bfloat16 and NaN payloads, comes back bit for bit; outputs are C-contiguous and
keep the input dtype. Weights are 2-D (rows = output features), biases 1-D; the
row-wise layouts handle both. Bad shapes raise MigrateError.

Registered layouts (MindFormers layouts checked against its conversion code,
mindformers/utils/convert_utils.py qkv_concat_hf2mg / ffn_concat_hf2mg):
  qkv_groups        (q, k, v) -> (w_qkv,)  per KV group g: [q heads of g | k_g | v_g]
                    (MindFormers w_qkv / mcore linear_qkv, the default interleaved layout)
  qkv_contiguous    (q, k, v) -> (w_qkv,)  [Q | K | V] (older MindFormers; mcore with
                    use_contiguous_weight_layout_attention: true)
  interleave_rows   (gate, up) -> (w,)     rows g0, u0, g1, u1, ... (w_gate_hidden /
                    mcore linear_fc1 with use_interleaved_weight_layout_mlp: true, the default)
  concat_halves     (gate, up) -> (w,)     [gate | up] (use_interleaved_weight_layout_mlp: false)
  transpose         (w,) -> (w.T,)         GPT-2 Conv1D weights (2-D only)
  split_thirds      (w,) -> (q, k, v)      equal row thirds (GPT-2 c_attn after transpose)
  concat            (q, k, v) -> (w,)      inverse of split_thirds
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from migrate.errors import MigrateError

Arrays = Sequence[np.ndarray]
Shape = tuple[int, ...]


# ---------------------------------------------------------------- config access

def _field(cfg: Any, *names: str):
    for name in names:
        if isinstance(cfg, Mapping):
            if cfg.get(name) is not None:
                return cfg[name]
        elif getattr(cfg, name, None) is not None:
            return getattr(cfg, name)
    return None


def heads(cfg: Any) -> tuple[int, int]:
    """(num_heads, n_kv_heads) from a LlamaConfig, its dict, or an HF config dict."""
    if cfg is None:
        raise MigrateError("this layout needs the model config (head counts)")
    num_heads = _field(cfg, "num_heads", "num_attention_heads", "n_head")
    if not isinstance(num_heads, int) or num_heads <= 0:
        raise MigrateError(f"model config has no valid num_heads: {num_heads!r}")
    n_kv = _field(cfg, "n_kv_heads", "num_key_value_heads", "num_query_groups")
    n_kv = num_heads if n_kv is None else n_kv
    if not isinstance(n_kv, int) or n_kv <= 0 or num_heads % n_kv:
        raise MigrateError(f"num_heads ({num_heads}) is not a multiple of n_kv_heads ({n_kv!r})")
    return num_heads, n_kv


def _head_dim_check(cfg: Any, head_dim: int) -> None:
    expected = _field(cfg, "head_dim")
    if expected is not None and expected != head_dim:
        raise MigrateError(f"tensor rows imply head_dim {head_dim}, the config says {expected}")


# ---------------------------------------------------------------- helpers

def _out(arrays) -> list[np.ndarray]:
    return [np.ascontiguousarray(a) for a in arrays]


def _same_tail(shapes: Sequence[Shape], what: str) -> Shape:
    ndims = {len(s) for s in shapes}
    if ndims - {1, 2} or len(ndims) != 1:
        raise MigrateError(f"{what}: expected all 1-D (bias) or all 2-D (weight), got shapes {list(shapes)}")
    tails = {tuple(s[1:]) for s in shapes}
    if len(tails) != 1:
        raise MigrateError(f"{what}: trailing dimensions differ: {list(shapes)}")
    return tails.pop()


def _same_dtype(arrays: Arrays, what: str) -> None:
    if len({a.dtype for a in arrays}) > 1:
        raise MigrateError(f"{what}: dtypes differ: {[str(a.dtype) for a in arrays]}")


# ---------------------------------------------------------------- qkv_groups

def _qkv_dims(q_rows: int, k_rows: int, v_rows: int, cfg) -> tuple[int, int, int]:
    """(n_kv, n_rep, head_dim) from q/k/v row counts."""
    num_heads, n_kv = heads(cfg)
    if k_rows != v_rows or q_rows % num_heads or k_rows % n_kv or q_rows // num_heads != k_rows // n_kv:
        raise MigrateError(f"q/k/v rows {q_rows}/{k_rows}/{v_rows} do not fit {num_heads} query heads "
                           f"and {n_kv} kv heads of one head_dim")
    head_dim = q_rows // num_heads
    _head_dim_check(cfg, head_dim)
    return n_kv, num_heads // n_kv, head_dim


def _fused_qkv_dims(rows: int, cfg) -> tuple[int, int, int]:
    num_heads, n_kv = heads(cfg)
    if rows % (num_heads + 2 * n_kv):
        raise MigrateError(f"fused qkv rows {rows} not divisible by num_heads + 2 n_kv_heads "
                           f"= {num_heads + 2 * n_kv}")
    head_dim = rows // (num_heads + 2 * n_kv)
    _head_dim_check(cfg, head_dim)
    return n_kv, num_heads // n_kv, head_dim


def _qkv_shapes(shapes, cfg) -> list[Shape]:
    tail = _same_tail(shapes, "qkv")
    _qkv_dims(shapes[0][0], shapes[1][0], shapes[2][0], cfg)
    return [(shapes[0][0] + shapes[1][0] + shapes[2][0],) + tail]


def _fused_qkv_shapes(shapes, cfg) -> list[Shape]:
    if len(shapes[0]) not in (1, 2):
        raise MigrateError(f"fused qkv: expected 1-D or 2-D, got {shapes[0]}")
    (rows, *tail) = shapes[0]
    n_kv, n_rep, head_dim = _fused_qkv_dims(rows, cfg)
    return [(n_kv * n_rep * head_dim, *tail), (n_kv * head_dim, *tail), (n_kv * head_dim, *tail)]


def _qkv_groups_forward(arrays: Arrays, cfg) -> list[np.ndarray]:
    q, k, v = arrays
    _qkv_shapes([q.shape, k.shape, v.shape], cfg)
    _same_dtype(arrays, "qkv_groups")
    n_kv, n_rep, head_dim = _qkv_dims(q.shape[0], k.shape[0], v.shape[0], cfg)
    tail = q.shape[1:]
    groups = np.concatenate([q.reshape(n_kv, n_rep * head_dim, *tail),
                             k.reshape(n_kv, head_dim, *tail),
                             v.reshape(n_kv, head_dim, *tail)], axis=1)
    return _out([groups.reshape(-1, *tail)])


def _qkv_groups_inverse(arrays: Arrays, cfg) -> list[np.ndarray]:
    (w,) = arrays
    _fused_qkv_shapes([w.shape], cfg)
    n_kv, n_rep, head_dim = _fused_qkv_dims(w.shape[0], cfg)
    tail = w.shape[1:]
    g = w.reshape(n_kv, (n_rep + 2) * head_dim, *tail)
    q = g[:, : n_rep * head_dim].reshape(-1, *tail)
    k = g[:, n_rep * head_dim: (n_rep + 1) * head_dim].reshape(-1, *tail)
    v = g[:, (n_rep + 1) * head_dim:].reshape(-1, *tail)
    return _out([q, k, v])


# ---------------------------------------------------------------- qkv_contiguous

def _qkv_contiguous_forward(arrays: Arrays, cfg) -> list[np.ndarray]:
    q, k, v = arrays
    _qkv_shapes([q.shape, k.shape, v.shape], cfg)
    _same_dtype(arrays, "qkv_contiguous")
    return _out([np.concatenate([q, k, v], axis=0)])


def _qkv_contiguous_inverse(arrays: Arrays, cfg) -> list[np.ndarray]:
    (w,) = arrays
    _fused_qkv_shapes([w.shape], cfg)
    n_kv, n_rep, head_dim = _fused_qkv_dims(w.shape[0], cfg)
    q_rows, kv_rows = n_kv * n_rep * head_dim, n_kv * head_dim
    return _out([w[:q_rows], w[q_rows: q_rows + kv_rows], w[q_rows + kv_rows:]])


# ---------------------------------------------------------------- gate / up

def _pair_shapes(shapes, cfg) -> list[Shape]:
    tail = _same_tail(shapes, "gate/up")
    if shapes[0][0] != shapes[1][0]:
        raise MigrateError(f"gate/up: row counts differ: {list(shapes)}")
    return [(2 * shapes[0][0],) + tail]


def _fused_pair_shapes(shapes, cfg) -> list[Shape]:
    if len(shapes[0]) not in (1, 2) or shapes[0][0] % 2:
        raise MigrateError(f"fused gate/up: expected 1-D or 2-D with an even row count, got {shapes[0]}")
    (rows, *tail) = shapes[0]
    return [(rows // 2, *tail), (rows // 2, *tail)]


def _interleave_forward(arrays: Arrays, cfg) -> list[np.ndarray]:
    gate, up = arrays
    _pair_shapes([gate.shape, up.shape], cfg)
    _same_dtype(arrays, "interleave_rows")
    return _out([np.stack([gate, up], axis=1).reshape(-1, *gate.shape[1:])])


def _interleave_inverse(arrays: Arrays, cfg) -> list[np.ndarray]:
    (w,) = arrays
    _fused_pair_shapes([w.shape], cfg)
    pairs = w.reshape(w.shape[0] // 2, 2, *w.shape[1:])
    return _out([pairs[:, 0], pairs[:, 1]])


def _halves_forward(arrays: Arrays, cfg) -> list[np.ndarray]:
    gate, up = arrays
    _pair_shapes([gate.shape, up.shape], cfg)
    _same_dtype(arrays, "concat_halves")
    return _out([np.concatenate([gate, up], axis=0)])


def _halves_inverse(arrays: Arrays, cfg) -> list[np.ndarray]:
    (w,) = arrays
    _fused_pair_shapes([w.shape], cfg)
    half = w.shape[0] // 2
    return _out([w[:half], w[half:]])


# ---------------------------------------------------------------- transpose

def _transpose_shapes(shapes, cfg) -> list[Shape]:
    if len(shapes[0]) != 2:
        raise MigrateError(f"transpose: expected a 2-D weight, got shape {shapes[0]}")
    return [(shapes[0][1], shapes[0][0])]


def _transpose(arrays: Arrays, cfg) -> list[np.ndarray]:
    (w,) = arrays
    _transpose_shapes([w.shape], cfg)
    return _out([w.T])


# ---------------------------------------------------------------- thirds

def _thirds_shapes(shapes, cfg) -> list[Shape]:
    if len(shapes[0]) not in (1, 2) or shapes[0][0] % 3:
        raise MigrateError(f"split_thirds: expected 1-D or 2-D with rows divisible by 3, got {shapes[0]}")
    (rows, *tail) = shapes[0]
    return [(rows // 3, *tail)] * 3


def _concat_shapes(shapes, cfg) -> list[Shape]:
    tail = _same_tail(shapes, "concat")
    if len({s[0] for s in shapes}) != 1:
        raise MigrateError(f"concat: parts must have equal row counts, got {list(shapes)}")
    return [(3 * shapes[0][0],) + tail]


def _split_thirds(arrays: Arrays, cfg) -> list[np.ndarray]:
    (w,) = arrays
    _thirds_shapes([w.shape], cfg)
    third = w.shape[0] // 3
    return _out([w[:third], w[third: 2 * third], w[2 * third:]])


def _concat(arrays: Arrays, cfg) -> list[np.ndarray]:
    _concat_shapes([a.shape for a in arrays], cfg)
    _same_dtype(arrays, "concat")
    return _out([np.concatenate(list(arrays), axis=0)])


# ---------------------------------------------------------------- registry

@dataclass(frozen=True)
class Layout:
    """One invertible layout: `n_in` source tensors <-> `n_out` target tensors."""

    name: str
    n_in: int
    n_out: int
    description: str
    _forward: Callable[[Arrays, Any], list[np.ndarray]]
    _inverse: Callable[[Arrays, Any], list[np.ndarray]]
    _out_shapes: Callable[[Sequence[Shape], Any], list[Shape]]
    _in_shapes: Callable[[Sequence[Shape], Any], list[Shape]]

    def _check_count(self, items, expected: int, what: str) -> list:
        items = list(items)
        if len(items) != expected:
            raise MigrateError(f"layout {self.name}: {what} takes {expected} tensor(s), got {len(items)}")
        return items

    def forward(self, arrays: Arrays, cfg: Any = None) -> list[np.ndarray]:
        """Source tensors (n_in, keymap `from` order) -> target tensors (n_out, `to` order)."""
        arrays = [np.asarray(a) for a in self._check_count(arrays, self.n_in, "forward")]
        return self._forward(arrays, cfg)

    def inverse(self, arrays: Arrays, cfg: Any = None) -> list[np.ndarray]:
        """Target tensors (n_out) -> source tensors (n_in); exact inverse of `forward`."""
        arrays = [np.asarray(a) for a in self._check_count(arrays, self.n_out, "inverse")]
        return self._inverse(arrays, cfg)

    def out_shapes(self, in_shapes: Sequence[Sequence[int]], cfg: Any = None) -> list[Shape]:
        """Shapes `forward` produces from source shapes (validates them; no data needed)."""
        shapes = [tuple(int(d) for d in s) for s in self._check_count(in_shapes, self.n_in, "out_shapes")]
        return self._out_shapes(shapes, cfg)

    def in_shapes(self, out_shapes: Sequence[Sequence[int]], cfg: Any = None) -> list[Shape]:
        """Shapes `inverse` produces from target shapes."""
        shapes = [tuple(int(d) for d in s) for s in self._check_count(out_shapes, self.n_out, "in_shapes")]
        return self._in_shapes(shapes, cfg)

    def inverted(self, name: str | None = None, description: str | None = None) -> Layout:
        """The same map read backwards (forward <-> inverse)."""
        return Layout(name or f"inverse({self.name})", self.n_out, self.n_in,
                      description or f"inverse of {self.name}",
                      self._inverse, self._forward, self._in_shapes, self._out_shapes)


def compose(*layouts: Layout) -> Layout:
    """Apply layouts in order (each one's outputs are the next one's inputs)."""
    if not layouts:
        raise MigrateError("compose needs at least one layout")
    for a, b in zip(layouts, layouts[1:], strict=False):
        if a.n_out != b.n_in:
            raise MigrateError(f"cannot chain {a.name} ({a.n_out} out) into {b.name} ({b.n_in} in)")
    if len(layouts) == 1:
        return layouts[0]

    def forward(arrays, cfg):
        for layout in layouts:
            arrays = layout.forward(arrays, cfg)
        return arrays

    def inverse(arrays, cfg):
        for layout in reversed(layouts):
            arrays = layout.inverse(arrays, cfg)
        return arrays

    def out_shapes(shapes, cfg):
        for layout in layouts:
            shapes = layout.out_shapes(shapes, cfg)
        return shapes

    def in_shapes(shapes, cfg):
        for layout in reversed(layouts):
            shapes = layout.in_shapes(shapes, cfg)
        return shapes

    name = "+".join(layout.name for layout in layouts)
    return Layout(name, layouts[0].n_in, layouts[-1].n_out, " then ".join(x.name for x in layouts),
                  forward, inverse, out_shapes, in_shapes)


_SPLIT_THIRDS = Layout("split_thirds", 1, 3, "one tensor -> three equal row blocks (GPT-2 c_attn -> q, k, v)",
                       _split_thirds, _concat, _thirds_shapes, _concat_shapes)

LAYOUTS: dict[str, Layout] = {layout.name: layout for layout in (
    Layout("qkv_groups", 3, 1,
           "(q, k, v) -> w_qkv laid out per KV group: [q heads of group g | k_g | v_g] for g in n_kv_heads "
           "(MindFormers w_qkv, mcore linear_qkv)",
           _qkv_groups_forward, _qkv_groups_inverse, _qkv_shapes, _fused_qkv_shapes),
    Layout("qkv_contiguous", 3, 1,
           "(q, k, v) -> [Q | K | V] (older MindFormers w_qkv; mcore use_contiguous_weight_layout_attention)",
           _qkv_contiguous_forward, _qkv_contiguous_inverse, _qkv_shapes, _fused_qkv_shapes),
    Layout("interleave_rows", 2, 1,
           "(gate, up) -> rows interleaved g0, u0, g1, u1, ... (MindFormers w_gate_hidden, mcore linear_fc1)",
           _interleave_forward, _interleave_inverse, _pair_shapes, _fused_pair_shapes),
    Layout("concat_halves", 2, 1,
           "(gate, up) -> [gate | up] (mcore use_interleaved_weight_layout_mlp: false)",
           _halves_forward, _halves_inverse, _pair_shapes, _fused_pair_shapes),
    Layout("transpose", 1, 1, "(w,) -> (w.T,) for 2-D weights (GPT-2 Conv1D)",
           _transpose, _transpose, _transpose_shapes, _transpose_shapes),
    _SPLIT_THIRDS,
    _SPLIT_THIRDS.inverted("concat", "three equal row blocks -> one tensor (inverse of split_thirds)"),
)}


def get_layout(spec: str | Sequence[str]) -> Layout:
    """A registered layout by name, or a chain: a list of names or "a+b" (applied left to right)."""
    if isinstance(spec, str):
        names = spec.split("+")
    else:
        names = list(spec)
    unknown = [n for n in names if n not in LAYOUTS]
    if unknown or not names:
        raise MigrateError(f"unknown layout {spec!r}; known: {', '.join(LAYOUTS)}")
    return compose(*(LAYOUTS[n] for n in names))
