"""migrate.transforms: fused layouts against hand-built expectations, bit-exact round trips."""
from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest

from migrate.errors import MigrateError
from migrate.models.config import LlamaConfig
from migrate.transforms import LAYOUTS, compose, get_layout, heads

BF16 = ms.Tensor(np.zeros(1, np.float32), ms.bfloat16).asnumpy().dtype  # MindSpore's numpy bfloat16
DTYPES = {"fp32": (np.float32, np.uint32), "fp16": (np.float16, np.uint16), "bf16": (BF16, np.uint16)}
HEADS = {"mha": (4, 4), "gqa": (4, 2), "mqa": (6, 1)}
HEAD_DIM, HIDDEN, INTER = 3, 5, 7

Q, K, V = 1, 2, 3  # "kind" digit in the labelled test values


def cfg_for(name: str, **extra) -> dict:
    nh, nkv = HEADS[name]
    return {"num_heads": nh, "n_kv_heads": nkv, "head_dim": HEAD_DIM, **extra}


def labelled(kind: int, n_heads: int, cols: int | None) -> np.ndarray:
    """Rows of n_heads x HEAD_DIM; value kind*10000 + head*100 + dim*10 + col, so order is visible."""
    rows = []
    for h in range(n_heads):
        for d in range(HEAD_DIM):
            base = kind * 10000 + h * 100 + d * 10
            rows.append([base + c for c in range(cols)] if cols else base)
    return np.array(rows, dtype=np.int64)


def random_bits(shape, dtype_name: str, seed: int) -> np.ndarray:
    """Arbitrary bit patterns (NaN payloads, infs, subnormals included) in the given dtype."""
    dtype, bits = DTYPES[dtype_name]
    raw = np.random.default_rng(seed).integers(0, np.iinfo(bits).max, size=shape, dtype=bits, endpoint=True)
    return raw.view(dtype)


def bits_equal(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


# ---------------------------------------------------------------- qkv_groups layout

@pytest.mark.parametrize("cols", [HIDDEN, None], ids=["weight", "bias"])
@pytest.mark.parametrize("name", list(HEADS))
def test_qkv_groups_layout_is_per_kv_group(name, cols):
    nh, nkv = HEADS[name]
    n_rep = nh // nkv
    q, k, v = labelled(Q, nh, cols), labelled(K, nkv, cols), labelled(V, nkv, cols)
    expected = []
    for g in range(nkv):  # group g: its n_rep query heads, then k_g, then v_g
        for r in range(n_rep):
            head = g * n_rep + r
            expected.extend(q[head * HEAD_DIM:(head + 1) * HEAD_DIM])
        expected.extend(k[g * HEAD_DIM:(g + 1) * HEAD_DIM])
        expected.extend(v[g * HEAD_DIM:(g + 1) * HEAD_DIM])
    expected = np.array(expected)

    (fused,) = LAYOUTS["qkv_groups"].forward([q, k, v], cfg_for(name))
    assert fused.shape == ((nh + 2 * nkv) * HEAD_DIM,) + ((cols,) if cols else ())
    np.testing.assert_array_equal(fused, expected)
    back = LAYOUTS["qkv_groups"].inverse([fused], cfg_for(name))
    for a, b in zip(back, (q, k, v), strict=True):
        np.testing.assert_array_equal(a, b)


def test_qkv_groups_mha_is_q_k_v_per_head():
    q, k, v = labelled(Q, 4, None), labelled(K, 4, None), labelled(V, 4, None)
    (fused,) = LAYOUTS["qkv_groups"].forward([q, k, v], cfg_for("mha"))
    heads_of = fused.reshape(4, 3, HEAD_DIM)  # per head: [q_h | k_h | v_h]
    for h in range(4):
        for kind_index, kind in enumerate((Q, K, V)):
            np.testing.assert_array_equal(heads_of[h, kind_index], kind * 10000 + h * 100 + np.arange(HEAD_DIM) * 10)


def test_qkv_contiguous_layout():
    q, k, v = labelled(Q, 4, HIDDEN), labelled(K, 2, HIDDEN), labelled(V, 2, HIDDEN)
    layout = LAYOUTS["qkv_contiguous"]
    (fused,) = layout.forward([q, k, v], cfg_for("gqa"))
    np.testing.assert_array_equal(fused, np.concatenate([q, k, v]))
    for a, b in zip(layout.inverse([fused], cfg_for("gqa")), (q, k, v), strict=True):
        np.testing.assert_array_equal(a, b)


# ---------------------------------------------------------------- gate/up layouts

@pytest.mark.parametrize("cols", [HIDDEN, None], ids=["weight", "bias"])
def test_interleave_rows_layout(cols):
    shape = (INTER, cols) if cols else (INTER,)
    gate = np.arange(np.prod(shape)).reshape(shape) + 1000
    up = np.arange(np.prod(shape)).reshape(shape) + 5000
    expected = []
    for i in range(INTER):
        expected += [gate[i], up[i]]  # g0, u0, g1, u1, ...
    (fused,) = LAYOUTS["interleave_rows"].forward([gate, up])
    np.testing.assert_array_equal(fused, np.array(expected))
    g2, u2 = LAYOUTS["interleave_rows"].inverse([fused])
    np.testing.assert_array_equal(g2, gate)
    np.testing.assert_array_equal(u2, up)


def test_concat_halves_layout():
    gate, up = np.full((INTER, HIDDEN), 1), np.full((INTER, HIDDEN), 2)
    (fused,) = LAYOUTS["concat_halves"].forward([gate, up])
    np.testing.assert_array_equal(fused, np.concatenate([gate, up]))
    g2, u2 = LAYOUTS["concat_halves"].inverse([fused])
    assert np.all(g2 == 1) and np.all(u2 == 2)


# ---------------------------------------------------------------- GPT-2 layouts

def test_gpt2_c_attn_transpose_then_split_thirds():
    h = 4
    conv = np.arange(h * 3 * h, dtype=np.float32).reshape(h, 3 * h)  # Conv1D (in, 3 out): y = x @ W + b
    bias = np.arange(3 * h, dtype=np.float32)
    layout = get_layout(["transpose", "split_thirds"])
    assert layout.n_in == 1 and layout.n_out == 3 and get_layout("transpose+split_thirds").name == layout.name
    q, k, v = layout.forward([conv])
    for i, part in enumerate((q, k, v)):  # nn.Linear layout (out, in) of each third of the output
        np.testing.assert_array_equal(part, conv[:, i * h:(i + 1) * h].T)
        assert part.flags.c_contiguous
    x = np.random.default_rng(0).normal(size=(2, h)).astype(np.float32)
    np.testing.assert_array_equal(np.concatenate([x @ q.T, x @ k.T, x @ v.T], -1), x @ conv)
    (back,) = layout.inverse([q, k, v])
    np.testing.assert_array_equal(back, conv)
    bq, bk, bv = LAYOUTS["split_thirds"].forward([bias])
    np.testing.assert_array_equal(np.concatenate([bq, bk, bv]), bias)
    np.testing.assert_array_equal(LAYOUTS["concat"].forward([bq, bk, bv])[0], bias)
    assert LAYOUTS["concat"].inverse([bias])[1].tolist() == bk.tolist()
    np.testing.assert_array_equal(LAYOUTS["transpose"].inverse(LAYOUTS["transpose"].forward([conv]))[0], conv)


# ---------------------------------------------------------------- bit-exact round trips

def _cases():
    nh, nkv = HEADS["gqa"]
    q_rows, kv_rows = nh * HEAD_DIM, nkv * HEAD_DIM
    return {
        "qkv_groups": [(q_rows, HIDDEN), (kv_rows, HIDDEN), (kv_rows, HIDDEN)],
        "qkv_groups_bias": [(q_rows,), (kv_rows,), (kv_rows,)],
        "qkv_contiguous": [(q_rows, HIDDEN), (kv_rows, HIDDEN), (kv_rows, HIDDEN)],
        "interleave_rows": [(INTER, HIDDEN), (INTER, HIDDEN)],
        "interleave_rows_bias": [(INTER,), (INTER,)],
        "concat_halves": [(INTER, HIDDEN), (INTER, HIDDEN)],
        "transpose": [(INTER, HIDDEN)],
        "split_thirds": [(3 * HIDDEN, HIDDEN)],
        "split_thirds_bias": [(3 * HIDDEN,)],
        "concat": [(HIDDEN, 4), (HIDDEN, 4), (HIDDEN, 4)],
        "transpose+split_thirds": [(HIDDEN, 3 * HIDDEN)],
    }


@pytest.mark.parametrize("heads_name", ["mha", "gqa", "mqa"])
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("case", list(_cases()))
def test_round_trip_bit_exact(case, dtype, heads_name):
    nh, nkv = HEADS[heads_name]
    shapes = _cases()[case]
    if case.startswith("qkv"):  # rebuild the q/k/v shapes for these head counts
        tail = shapes[0][1:]
        shapes = [(nh * HEAD_DIM,) + tail, (nkv * HEAD_DIM,) + tail, (nkv * HEAD_DIM,) + tail]
    layout = get_layout(case.removesuffix("_bias"))
    cfg = cfg_for(heads_name)
    arrays = [random_bits(s, dtype, seed=i) for i, s in enumerate(shapes)]
    fused = layout.forward(arrays, cfg)
    assert [f.shape for f in fused] == layout.out_shapes(shapes, cfg)
    assert all(f.dtype == arrays[0].dtype and f.flags.c_contiguous for f in fused)
    assert layout.in_shapes([f.shape for f in fused], cfg) == [tuple(s) for s in shapes]
    back = layout.inverse(fused, cfg)
    assert len(back) == len(arrays)
    assert all(bits_equal(a, b) for a, b in zip(back, arrays, strict=True))
    # and the other way round: inverse then forward reproduces the fused tensors
    assert all(bits_equal(a, b) for a, b in zip(layout.forward(back, cfg), fused, strict=True))


def test_non_contiguous_inputs():
    base = random_bits((HIDDEN, 2 * INTER), "bf16", seed=7)
    gate, up = base[:, :INTER].T, base[:, INTER:].T  # strided views
    (fused,) = LAYOUTS["interleave_rows"].forward([gate, up])
    g2, u2 = LAYOUTS["interleave_rows"].inverse([fused])
    assert bits_equal(g2, np.ascontiguousarray(gate)) and bits_equal(u2, np.ascontiguousarray(up))


# ---------------------------------------------------------------- config forms and errors

def test_config_forms():
    ms_cfg = LlamaConfig(vocab_size=8, hidden_size=12, intermediate_size=8, num_layers=1, num_heads=4, n_kv_heads=2)
    assert heads(ms_cfg) == heads(ms_cfg.to_dict()) == (4, 2)
    assert heads({"num_attention_heads": 4, "num_key_value_heads": 2}) == (4, 2)
    assert heads({"num_heads": 4}) == (4, 4)  # n_kv_heads absent or None: MHA
    assert heads({"num_heads": 4, "n_kv_heads": None}) == (4, 4)
    q, k, v = (np.zeros((r, 12), np.float32) for r in (12, 6, 6))
    assert LAYOUTS["qkv_groups"].forward([q, k, v], ms_cfg)[0].shape == (24, 12)


def test_errors():
    layout = LAYOUTS["qkv_groups"]
    q, k, v = labelled(Q, 4, HIDDEN), labelled(K, 2, HIDDEN), labelled(V, 2, HIDDEN)
    with pytest.raises(MigrateError, match="head counts"):
        layout.forward([q, k, v])
    with pytest.raises(MigrateError, match="takes 3"):
        layout.forward([q, k], cfg_for("gqa"))
    with pytest.raises(MigrateError, match="do not fit"):
        layout.forward([q, k, v], cfg_for("mha"))
    with pytest.raises(MigrateError, match="head_dim"):
        layout.forward([q, k, v], {**cfg_for("gqa"), "head_dim": 4})
    with pytest.raises(MigrateError, match="not divisible"):
        layout.inverse([np.zeros((25, 2))], cfg_for("gqa"))
    with pytest.raises(MigrateError, match="multiple"):
        heads({"num_heads": 4, "n_kv_heads": 3})
    with pytest.raises(MigrateError, match="trailing"):
        LAYOUTS["interleave_rows"].forward([np.zeros((3, 2)), np.zeros((3, 4))])
    with pytest.raises(MigrateError, match="dtypes differ"):
        LAYOUTS["interleave_rows"].forward([np.zeros((3, 2), np.float32), np.zeros((3, 2), np.float16)])
    with pytest.raises(MigrateError, match="2-D"):
        LAYOUTS["transpose"].forward([np.zeros(3)])
    with pytest.raises(MigrateError, match="divisible by 3"):
        LAYOUTS["split_thirds"].forward([np.zeros((4, 2))])
    with pytest.raises(MigrateError, match="unknown layout"):
        get_layout("qkv_group")
    with pytest.raises(MigrateError, match="cannot chain"):
        compose(LAYOUTS["split_thirds"], LAYOUTS["transpose"])


def test_registry_is_consistent():
    for name, layout in LAYOUTS.items():
        assert layout.name == name and get_layout(name) is layout
        inv = layout.inverted()
        assert (inv.n_in, inv.n_out) == (layout.n_out, layout.n_in)
    assert LAYOUTS["concat"].n_in == 3 and LAYOUTS["concat"].n_out == 1
