"""The bundled Llama's one forward and its seams: precision, sharding and faults plug in
without restating it, and compose (an autocast model stays autocast under tensor-parallel
kernels, whichever comes first; a fault reaches the same cell whatever the model carries)."""
import dataclasses

import mindspore as ms
import numpy as np
import pytest

from migrate.align.model_faults import FAULTS
from migrate.models.base import EMULATED_SITES, F32, PrecisionPolicy, model_precision
from migrate.models.common import Linear, TiedHead
from migrate.models.config import LlamaConfig
from migrate.models.kernels import LinearKernel
from migrate.models.llama import LlamaForCausalLM
from migrate.parallel.layout import Layout
from migrate.parallel.strategy import ShardedLinearKernel, assign_strategies
from migrate.train.config import RunConfig
from migrate.train.knob_faults import TRAIN_FAULTS, apply_faults
from migrate.train.knobs import TrainingKnobs
from migrate.train.live_model import autocast_dtype, shared_record
from migrate.train.precision import AUTOCAST_SITES, autocast_model, compute_dtype


def _config(**kw):
    base = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4, n_kv_heads=2,
                seq_length=16, initializer_range=0.1)
    base.update(kw)
    return LlamaConfig(**base)


IDS = ms.Tensor(np.random.default_rng(0).integers(0, 64, (2, 12)).astype(np.int32))


def _outputs(model, graph=False):
    """(logits, loss) as numpy, run in GRAPH_MODE or PyNative."""
    ms.set_context(mode=ms.GRAPH_MODE if graph else ms.PYNATIVE_MODE)
    try:
        logits, loss, _ = model(IDS, None, IDS)
        return logits.astype(ms.float32).asnumpy(), float(loss.asnumpy())
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)


def _logits(model, graph=False):
    return _outputs(model, graph)[0]


@pytest.mark.slow
@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("shard_first", [False, True])
def test_bf16_autocast_survives_tensor_parallel_kernels(tied, shard_first):
    # Before the seams, the sharded cells copied the emulation attributes but not autocast's:
    # a bf16 run under tensor parallel computed every linear in fp32.
    config = _config(tie_word_embeddings=tied)
    model = LlamaForCausalLM(config, seed=1)
    if shard_first:
        assign_strategies(model, Layout(dp=2, mp=2))
        autocast_model(model, "bf16")
    else:
        autocast_model(model, "bf16")
        assign_strategies(model, Layout(dp=2, mp=2))
    linears = [c for _, c in model.cells_and_names() if isinstance(c, (Linear, TiedHead))]
    assert linears and all(compute_dtype(c) == ms.bfloat16 for c in linears)
    assert any(isinstance(c.kernel, ShardedLinearKernel) for c in linears)
    assert autocast_dtype(model) == "bfloat16"
    assert shared_record(model)["linear_compute_dtypes"]["lm_head"] == ["bfloat16"]

    autocast = autocast_model(LlamaForCausalLM(config, seed=1), "bf16")
    sharded_fp32 = LlamaForCausalLM(config, seed=1)
    assign_strategies(sharded_fp32, Layout(dp=2, mp=2))
    got, want, fp32 = _logits(model), _logits(autocast), _logits(sharded_fp32)
    # The rounding is there: far from fp32, as close to the unsharded autocast model as a
    # different matmul kernel lets bf16 roundings be.
    assert np.abs(got - fp32).max() > 10 * np.abs(got - want).max()
    np.testing.assert_allclose(got, _logits(model, graph=True), rtol=0, atol=1e-6)


def test_a_policy_rounds_only_at_its_sites():
    with pytest.raises(ValueError, match="unknown rounding sites"):
        PrecisionPolicy("autocast", F32, F32, ms.bfloat16, ("matmul_out", "matmul_ou"))
    assert set(AUTOCAST_SITES) - set(EMULATED_SITES) == {"matmul_in", "matmul_param", "dropout"}
    assert set(EMULATED_SITES) - set(AUTOCAST_SITES) == {"op"}
    model = autocast_model(LlamaForCausalLM(_config()), "bf16")
    norm = model.model.layers[0].attention_norm
    assert compute_dtype(norm) == F32 and compute_dtype(model.lm_head) == ms.bfloat16
    # One cell can be given another policy; the rest keep theirs.
    model.lm_head.use_precision(model_precision(F32))
    assert compute_dtype(model.lm_head) == F32 and compute_dtype(model.model.layers[0].attention.wq) == ms.bfloat16


def test_projections_compute_through_a_swappable_kernel():
    model = LlamaForCausalLM(_config(qkv_has_bias=True))
    before = _logits(model)

    class Doubled(LinearKernel):  # what an adapter would do: wrap the projection's math
        def construct(self, x, weight, bias=None):
            return super().construct(x, weight, bias) * 2.0

    model.lm_head.kernel = Doubled()
    np.testing.assert_array_equal(_logits(model), 2.0 * before)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(set(FAULTS) - {"untied_head"}))
def test_faults_reach_their_seam_in_both_modes(name):
    # untied_head rebuilds the model from model.yaml: tests/test_diff.py covers it.
    dtype = "bfloat16" if "low_precision" in FAULTS[name].needs else "float32"
    config = _config(compute_dtype=dtype, pad_token_id=0)
    clean_logits, clean_loss = _outputs(LlamaForCausalLM(config, seed=2))
    outs = []
    for graph in (False, True):
        side = type("Side", (), {})()
        side.model, side.config = LlamaForCausalLM(config, seed=2), config
        # A sharded model: faults find cells by type, not by the kernels they carry.
        assign_strategies(side.model, Layout(dp=1, mp=2))
        FAULTS[name].apply(side, 1)
        names = [p.name for p in side.model.get_parameters()]
        assert names == [p.name for p in LlamaForCausalLM(config).get_parameters()]
        outs.append(_outputs(side.model, graph))
    (logits, loss), (graph_logits, graph_loss) = outs
    if name != "mask_fill":  # no padding in these inputs: the fill value does not show
        assert np.abs(logits - clean_logits).max() > 1e-4 or abs(loss - clean_loss) > 1e-4
    np.testing.assert_allclose(graph_logits, logits, rtol=0, atol=1e-5 if dtype == "float32" else 0.1)
    assert graph_loss == pytest.approx(loss, rel=1e-5 if dtype == "float32" else 1e-2)


def test_each_training_fault_adjusts_one_knob():
    cfg = RunConfig(data="data", seq_length=16, total_steps=10, grad_accum_steps=4)
    knobs = TrainingKnobs.from_config(cfg)
    assert knobs == TrainingKnobs(eps=1e-8, bias_correction=True, decay_rule="hf", loss_divisor=4, clip_eps=1e-6,
                                  warmup_shift=0)
    changed = {}
    for name in TRAIN_FAULTS:
        faulty = apply_faults(knobs, [name])
        changed[name] = [f.name for f in dataclasses.fields(knobs) if getattr(faulty, f.name) != getattr(knobs, f.name)]
    assert changed == {"adam_eps": ["eps"], "no_bias_correction": ["bias_correction"], "decay_biases": ["decay_rule"],
                       "warmup_off_by_one": ["warmup_shift"], "no_accum_scaling": ["loss_divisor"],
                       "clip_no_eps": ["clip_eps"], "beta2": ["betas"], "lr_late": ["lr_lag"],
                       "head_grad_scale": ["head_grad_factor"], "bf16_accum": ["accum_dtype"]}
    assert apply_faults(knobs, ["adam_eps", "clip_no_eps"]) == dataclasses.replace(knobs, eps=1e-6, clip_eps=0.0)
