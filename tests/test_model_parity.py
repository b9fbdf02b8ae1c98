"""Every bundled MindSpore model against HF transformers' own, on tiny random models
(tests/family_models.py): outputs, hidden states at the keymap's `align` points,
gradients, and low precision. One test each, parametrised by family; what only one
family has stays in its own `test_<family>_model.py`. Run with -s to see the figures.
"""
from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
import torch

from family_models import (
    FAMILIES,
    MODES,
    build_hf,
    case,
    compared_rows,
    cosine,
    hf_forward,
    hf_in_ms_names,
    load_into,
    ms_config,
    ms_forward,
    ms_inputs,
    outputs,
    to_dtype,
    to_numpy,
)
from migrate.models.registry import build_model

FORWARD = [(f.name, name, mode) for f in FAMILIES.values() for name in f.configs
           for mode in ("pynative", "graph") if mode == "pynative" or name in f.graph_cases]
LOW_PRECISION = [(f.name, dtype, mode) for f in FAMILIES.values() if f.low_precision
                 for dtype, mode in f.low_precision.cases]


@pytest.mark.slow
@pytest.mark.parametrize("family,name,mode", FORWARD)
def test_outputs_match_hf(family, name, mode):
    _, ms_model, inputs, ref = case(family, name)
    ms.set_context(mode=MODES[mode])
    *values, hidden = ms_forward(ms_model, inputs)
    assert hidden is None
    keep = compared_rows(FAMILIES[family], inputs)
    figures = []
    for key, got in zip(outputs(ms_model), values, strict=True):
        if key == "loss":
            loss_rel = abs(float(got.asnumpy()) - ref[key]) / abs(ref[key])
            figures.append(f"loss rel diff {loss_rel:.2e} (loss {ref[key]:.4f})")
            assert loss_rel <= 1e-6
            continue
        diff = np.abs(got.asnumpy() - ref[key])
        max_abs = float((diff[keep] if diff.shape[:2] == keep.shape else diff).max())
        figures.append(f"{key} max|diff| {max_abs:.2e} (|{key}| max {np.abs(ref[key]).max():.2f})")
        assert max_abs <= 1e-5
    print(f"\n[{family} {name:>14} {mode:>8}] " + ", ".join(figures))


def _align_points(align: dict[str, str], layers: int, detail: bool) -> list[tuple[str, str]]:
    """(block, HF module path) in the order the bundled model returns its hidden states."""
    blocks = ("attention", "mlp", "layer output") if detail else ("layer output",)
    points = [("embedding", align["embedding"])]
    points += [(f"{block} {i}", align[block].replace("{layer}", str(i))) for i in range(layers) for block in blocks]
    return points + ([("final norm", align["final norm"])] if "final norm" in align else [])


@pytest.mark.parametrize("family", list(FAMILIES))
def test_hidden_states_match_hf_at_the_align_points(family):
    """Ours, plain and "detail", against the outputs of the HF modules the keymap's `align`
    table names (what `migrate diff` compares), read with forward hooks."""
    fam = FAMILIES[family]
    hf_model, ms_model, inputs, _ = case(family, fam.hidden_case)
    inputs = {k: v for k, v in inputs.items() if k != "labels"}
    cfg, align = ms_model.config, fam.keymap_for().align
    points = _align_points(align, cfg.num_layers, detail=True)
    modules = dict(hf_model.named_modules())
    captured, hooks = {}, []
    for block, path in points:
        hooks.append(modules[path].register_forward_hook(
            lambda m, a, out, block=block: captured.__setitem__(block, out[0] if isinstance(out, tuple) else out)))
    try:
        with torch.no_grad():
            hf_forward(hf_model, inputs)
    finally:
        for h in hooks:
            h.remove()

    names = type(ms_model).hidden_names(cfg)
    *_, hidden = ms_forward(ms_model, inputs, output_hidden_states=True)
    plain = _align_points(align, cfg.num_layers, detail=False)
    assert len(hidden) == len(names) == len(plain) == cfg.num_layers + 1 + ("final norm" in align)
    worst = max(float(np.abs(a.asnumpy() - to_numpy(captured[block])).max())
                for a, (block, _) in zip(hidden, plain, strict=True))

    detail_names = type(ms_model).hidden_names(cfg, detail=True)
    *_, detail = ms_forward(ms_model, inputs, output_hidden_states="detail")
    assert len(detail) == len(detail_names) == len(points) == 3 * cfg.num_layers + 1 + ("final norm" in align)
    for a, (block, _) in zip(detail, points, strict=True):
        worst = max(worst, float(np.abs(a.asnumpy() - to_numpy(captured[block])).max()))
    by_name = dict(zip(detail_names, detail, strict=True))
    for a, b in zip(hidden, [by_name[n] for n in names], strict=True):
        assert np.array_equal(a.asnumpy(), b.asnumpy())
    print(f"\n[{family} hidden/detail] max|diff| vs HF {worst:.2e}")
    assert worst <= 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("family", [f.name for f in FAMILIES.values() if f.backward])
def test_gradients_match_torch(family):
    fam = FAMILIES[family]
    spec = fam.backward
    hf_model = build_hf(fam, spec.fields, seed=1)
    cfg = ms_config(fam, hf_model.config)
    ms_model = build_model(cfg)
    load_into(ms_model, hf_model, fam, cfg)
    inputs = fam.batch(seed=1, padded=True)
    if spec.train:
        hf_model.train()  # no dropout configured; train() only matters for the flag
    out = hf_forward(hf_model, inputs)
    out.loss.backward()
    hf_loss = out.loss.item()
    hf_grads = hf_in_ms_names(fam, cfg, {n: to_numpy(p.grad) for n, p in hf_model.named_parameters()})

    ms.set_context(mode=MODES[spec.mode])
    if spec.train:
        ms_model.set_train(True)
    params = ms_model.trainable_params()

    def loss_fn(*args):
        return ms_model(*args)[1]

    loss, grads = ms.value_and_grad(loss_fn, None, params)(*ms_inputs(ms_model, inputs))
    worst, worst_name = 0.0, ""
    for p, g in zip(params, grads, strict=True):
        diff = float(np.abs(g.asnumpy() - hf_grads[p.name]).max())
        if diff >= worst:
            worst, worst_name = diff, p.name
    loss_rel = abs(float(loss.asnumpy()) - hf_loss) / hf_loss
    print(f"\n[{family} backward {spec.mode}] grads max|diff| {worst:.2e} ({worst_name}), loss rel diff "
          f"{loss_rel:.2e}, max|grad| {max(np.abs(g).max() for g in hf_grads.values()):.2e}")
    assert len(params) == len(hf_grads)
    assert worst <= 1e-5
    assert loss_rel <= 1e-6


@pytest.mark.slow
@pytest.mark.parametrize("family,dtype,mode", LOW_PRECISION)
def test_low_precision_tracks_torch(family, dtype, mode):
    fam = FAMILIES[family]
    spec = fam.low_precision
    hf_model = to_dtype(build_hf(fam, spec.fields, seed=2), getattr(torch, dtype), spec.fp32_buffers)
    cfg = ms_config(fam, hf_model.config, compute_dtype=dtype)
    ms_model = build_model(cfg)
    load_into(ms_model, hf_model, fam, cfg)
    ms_dtype = getattr(ms, dtype)
    assert all(p.dtype == ms_dtype for p in ms_model.get_parameters())
    inputs = fam.batch(seed=2)
    with torch.no_grad():
        out = hf_forward(hf_model, inputs)
    ms.set_context(mode=MODES[mode])
    logits, loss, _ = ms_forward(ms_model, inputs)
    assert logits.dtype == ms_dtype
    a = logits.astype(ms.float32).asnumpy().ravel().astype(np.float64)
    b = to_numpy(out.logits).ravel().astype(np.float64)
    cos = cosine(a, b)
    loss_rel = abs(float(loss.asnumpy()) - float(out.loss)) / float(out.loss)
    print(f"\n[{family} {dtype} {mode:>8}] logits cosine {cos:.7f}, max|diff| {np.abs(a - b).max():.2e}, "
          f"bit-equal {np.mean(a == b):.1%}, loss rel diff {loss_rel:.2e}")
    assert cos >= 0.999
    assert loss_rel <= spec.loss_rel
    assert np.mean(a == b) >= spec.bit_equal
