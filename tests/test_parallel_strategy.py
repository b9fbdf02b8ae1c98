"""Shard strategies on every matmul, pipeline stages, the parallel context: assigned and read back on CPU.

Nothing here initialises communication or compiles a parallel graph (MindSpore
refuses tensor/pipeline parallel on CPU); strategies are primitive attributes
and stages are cell attributes, which is what MindSpore compiles from.
"""
import mindspore as ms
import numpy as np
import pytest

from migrate.errors import MigrateError
from migrate.memory_plan import stage_params
from migrate.models.common import Linear, TiedHead
from migrate.models.config import LlamaConfig
from migrate.models.kernels import Kernel, LinearKernel
from migrate.models.llama import LlamaForCausalLM
from migrate.parallel.context import apply_parallel_context, auto_parallel_network, parallel_context
from migrate.parallel.layout import Layout, validate
from migrate.parallel.pipeline import (
    CausalLMLoss,
    assign_pipeline_stages,
    build_pipeline_network,
    pipeline_grad_reducer,
    read_pipeline_stages,
)
from migrate.parallel.strategy import ShardedKernel, assign_strategies, param_splits, per_device_params


def _cfg(n_kv=8, layers=2, **kw):
    base = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_layers=layers, num_heads=8,
                n_kv_heads=n_kv)
    base.update(kw)
    return LlamaConfig(**base)


def _expected(config, dp, mp):
    """The strategy of every annotated op of the bundled model, written out."""
    col, row = ((dp, 1), (mp, 1)), ((dp, mp), (1, mp))
    kv = col if config.n_kv_heads % mp == 0 else ((dp, 1), (1, 1))
    heads = ((dp, mp, 1, 1), (dp, mp, 1, 1))
    head = "tied_head.matmul" if config.tie_word_embeddings else "lm_head.matmul"
    out = {"model.tok_embeddings.gather": ((mp, 1), (dp, 1)), head: col}
    for i in range(config.num_layers):
        p = f"model.layers.{i}"
        if config.qkv_concat:
            out.update({f"{p}.attention.w_qkv.matmul": col, f"{p}.feed_forward.w_gate_hidden.matmul": col})
        else:
            out.update({
                f"{p}.attention.wq.matmul": col, f"{p}.attention.wk.matmul": kv, f"{p}.attention.wv.matmul": kv,
                f"{p}.feed_forward.w1.matmul": col, f"{p}.feed_forward.w3.matmul": col,
            })
        out.update({
            f"{p}.attention.wo.matmul": row,
            f"{p}.attention.bmm_qk": heads, f"{p}.attention.softmax": ((dp, mp, 1, 1),),
            f"{p}.attention.bmm_pv": heads,
            f"{p}.feed_forward.w2.matmul": row,
        })
    return out


def _all_sharded(model):
    """No cell is left computing through a functional call that cannot carry a strategy."""
    for name, cell in model.cells_and_names():
        if isinstance(cell, Kernel):
            assert isinstance(cell, ShardedKernel), name


@pytest.mark.parametrize("mp, dp, n_kv", [(2, 2, 8), (4, 2, 8), (8, 1, 8), (2, 4, 2), (4, 1, 2), (8, 1, 2)])
def test_every_matmul_gets_its_strategy(mp, dp, n_kv):
    config = _cfg(n_kv=n_kv)
    model = LlamaForCausalLM(config)
    strategies = assign_strategies(model, Layout(dp=dp, mp=mp))
    assert strategies == _expected(config, dp, mp)
    _all_sharded(model)
    # The strategy MindSpore compiles from is the primitive attribute.
    wq = model.model.layers[0].attention.wq.kernel.matmul
    assert wq.attrs["in_strategy"] == ((dp, 1), (mp, 1))


def test_bias_adds_follow_their_projection():
    config = _cfg(qkv_has_bias=True, out_proj_has_bias=True, mlp_bias=True, layers=1)
    strategies = assign_strategies(LlamaForCausalLM(config), Layout(dp=2, mp=4))
    p = "model.layers.0"
    assert strategies[f"{p}.attention.wq.bias_add"] == ((2, 4), (4,))
    assert strategies[f"{p}.attention.wo.bias_add"] == ((2, 1), (1,))
    assert strategies[f"{p}.feed_forward.w1.bias_add"] == ((2, 4), (4,))
    assert strategies[f"{p}.feed_forward.w2.bias_add"] == ((2, 1), (1,))
    assert "lm_head.bias_add" not in strategies  # no bias, no op


def _run(model, ids, graph=False):
    ms.set_context(mode=ms.GRAPH_MODE if graph else ms.PYNATIVE_MODE)
    tensor = ms.Tensor(ids)
    logits, loss, _ = model(tensor, None, tensor)
    return logits.asnumpy(), float(loss.asnumpy())


@pytest.mark.slow
@pytest.mark.parametrize("fused, tied, mp", [(False, False, 4), (True, True, 2), (False, True, 4)])
def test_sharded_model_computes_what_the_model_computes(fused, tied, mp):
    config = _cfg(n_kv=2, qkv_has_bias=True, pad_token_id=0, qkv_concat=fused, tie_word_embeddings=tied)
    ref, model = LlamaForCausalLM(config, seed=3), LlamaForCausalLM(config, seed=3)
    params = {p.name: p for p in model.trainable_params()}
    assign_strategies(model, Layout(dp=2, mp=mp))
    # Same Parameter objects under the same names: checkpoints and the optimizer see no change.
    assert {p.name: p for p in model.trainable_params()} == params
    ids = np.random.default_rng(0).integers(0, config.vocab_size, (2, 12)).astype(np.int32)
    ref_logits, ref_loss = _run(ref, ids)
    for graph in (False, True):
        logits, loss = _run(model, ids, graph)
        np.testing.assert_allclose(logits, ref_logits, rtol=0, atol=1e-6)
        assert loss == pytest.approx(ref_loss, rel=1e-6)

    def grads(net):
        fn = ms.value_and_grad(lambda x: net(x, None, x)[1], None, net.trainable_params())
        return [g.asnumpy() for g in fn(ms.Tensor(ids))[1]]

    ms.set_context(mode=ms.PYNATIVE_MODE)
    for a, b in zip(grads(ref), grads(model), strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-7)


def test_reassigning_updates_strategies():
    model = LlamaForCausalLM(_cfg())
    assign_strategies(model, Layout(dp=1, mp=2))
    again = assign_strategies(model, Layout(dp=2, mp=4))
    assert again["model.layers.1.feed_forward.w2.matmul"] == ((2, 4), (1, 4))


def test_bad_layout_is_refused_before_anything_changes():
    model = LlamaForCausalLM(_cfg())
    with pytest.raises(MigrateError, match=r"num_heads \(8\) is not divisible by mp \(3\)"):
        assign_strategies(model, Layout(mp=3))
    assert type(model.model.layers[0].attention.wq) is Linear
    assert type(model.model.layers[0].attention.wq.kernel) is LinearKernel


@pytest.mark.parametrize("mp, dp", [(2, 2), (4, 1), (8, 1)])
def test_tied_head_gets_the_lm_head_strategy(mp, dp):
    config = _cfg(tie_word_embeddings=True, layers=1)
    model = LlamaForCausalLM(config)
    strategies = assign_strategies(model, Layout(dp=dp, mp=mp))
    assert strategies == _expected(config, dp, mp)
    assert strategies["tied_head.matmul"] == ((dp, 1), (mp, 1))
    assert "lm_head.matmul" not in strategies
    _all_sharded(model)
    # Its weight operand is the embedding table, split over the vocabulary like the gather's.
    assert strategies["tied_head.matmul"][1] == strategies["model.tok_embeddings.gather"][0]


def test_tied_head_adds_no_parameters():
    config = _cfg(tie_word_embeddings=True, layers=1)
    model = LlamaForCausalLM(config)
    assert isinstance(model.tied_head, TiedHead)
    assert not hasattr(LlamaForCausalLM(_cfg(layers=1)), "tied_head")
    names = [p.name for p in model.get_parameters()]
    assert not [n for n in names if "head" in n]
    assign_strategies(model, Layout(mp=2))
    assert [p.name for p in model.get_parameters()] == names


@pytest.mark.parametrize("mp, dp, n_kv", [(2, 2, 8), (4, 2, 8), (8, 1, 8), (2, 1, 2), (2, 4, 4), (4, 1, 4)])
def test_fused_layout_gets_column_strategies(mp, dp, n_kv):
    config = _cfg(n_kv=n_kv, qkv_concat=True, qkv_has_bias=True, mlp_bias=True)
    model = LlamaForCausalLM(config)
    strategies = assign_strategies(model, Layout(dp=dp, mp=mp))
    expected = _expected(config, dp, mp)
    for i in range(config.num_layers):
        p = f"model.layers.{i}"
        expected.update({f"{p}.attention.w_qkv.bias_add": ((dp, mp), (mp,)),
                         f"{p}.feed_forward.w_gate_hidden.bias_add": ((dp, mp), (mp,)),
                         f"{p}.feed_forward.w2.bias_add": ((dp, 1), (1,))})
    assert strategies == expected
    _all_sharded(model)
    splits = param_splits(model)
    assert splits["model.layers.0.attention.w_qkv.weight"] == (mp, 1)
    assert splits["model.layers.0.feed_forward.w_gate_hidden.weight"] == (mp, 1)
    assert per_device_params(model) == stage_params(config, Layout(dp=dp, mp=mp))[0]


@pytest.mark.parametrize("n_kv", [2, 4])
def test_fused_rows_split_into_whole_groups(n_kv):
    # Row block r of w_qkv (split over mp) holds kv groups r·n_kv/mp ... whole: q heads, k, v of each;
    # w_gate_hidden's holds gate/up pairs of a contiguous intermediate range.
    config = _cfg(n_kv=n_kv, qkv_concat=True)
    mp, d, n_rep = n_kv, config.head_dim, config.num_heads // n_kv
    rows = np.arange((config.num_heads + 2 * n_kv) * d).reshape(n_kv, n_rep + 2, d)
    for r, block in enumerate(np.split(rows.reshape(-1), mp)):
        assert (block.reshape(-1, n_rep + 2, d) == rows[r * n_kv // mp:(r + 1) * n_kv // mp]).all()
    pairs = np.arange(2 * config.intermediate_size).reshape(config.intermediate_size, 2)
    for r, block in enumerate(np.split(pairs.reshape(-1), mp)):
        per = config.intermediate_size // mp
        assert (block.reshape(-1, 2) == pairs[r * per:(r + 1) * per]).all()


@pytest.mark.parametrize("mp, n_kv", [(4, 2), (8, 2), (8, 4)])
def test_fused_layout_refuses_replicated_kv(mp, n_kv):
    config = _cfg(n_kv=n_kv, qkv_concat=True)
    message = (f"n_kv_heads ({n_kv}) is not divisible by mp ({mp}) with qkv_concat: the fused w_qkv keeps "
               f"each kv group's q, k and v rows together, so k/v cannot be replicated apart from q; "
               f"use an mp that divides n_kv_heads, or convert without --qkv-concat")
    assert validate(Layout(mp=mp), config) == [message]
    model = LlamaForCausalLM(config)
    with pytest.raises(MigrateError, match="with qkv_concat"):
        assign_strategies(model, Layout(mp=mp))
    assert type(model.model.layers[0].attention.w_qkv) is Linear
    assert type(model.model.layers[0].attention.w_qkv.kernel) is LinearKernel


@pytest.mark.parametrize("mp, n_kv, tied", [(2, 8, False), (4, 8, False), (8, 2, False), (4, 2, True)])
def test_planner_counts_what_the_strategies_place(mp, n_kv, tied):
    config = _cfg(n_kv=n_kv, tie_word_embeddings=tied, qkv_has_bias=True)
    model = LlamaForCausalLM(config)
    lay = Layout(mp=mp)
    assign_strategies(model, lay)
    assert per_device_params(model) == stage_params(config, lay)[0]


@pytest.mark.parametrize("pp", [2, 4])
def test_pipeline_stages(pp):
    model = LlamaForCausalLM(_cfg(layers=8))
    stages = assign_pipeline_stages(model, pp)
    per = 8 // pp
    assert stages == {i: i // per for i in range(8)}
    read = read_pipeline_stages(model)
    assert read["model.tok_embeddings"] == 0
    assert read["model.norm_out"] == pp - 1 and read["lm_head"] == pp - 1
    tied = LlamaForCausalLM(_cfg(layers=8, tie_word_embeddings=True))
    assign_pipeline_stages(tied, pp)
    assert read_pipeline_stages(tied)["tied_head"] == pp - 1
    for i in range(8):
        assert read[f"model.layers.{i}"] == i // per
        assert model.model.layers[i].pipeline_stage == i // per


def test_pipeline_stages_need_equal_layers():
    with pytest.raises(MigrateError, match=r"num_layers \(8\) is not divisible by pp \(3\)"):
        assign_pipeline_stages(LlamaForCausalLM(_cfg(layers=8)), 3)


def test_pipeline_network_wraps_per_documented_api():
    from mindspore.experimental.optim import AdamW
    from mindspore.parallel.nn import Pipeline, PipelineGradReducer

    model = LlamaForCausalLM(_cfg(layers=4))
    net = CausalLMLoss(model)
    piped = build_pipeline_network(net, Layout(pp=2, micro_batches=4))
    assert isinstance(piped, Pipeline) and piped.micro_size == 4 and piped.network is net
    assert build_pipeline_network(net, Layout()) is net
    optimizer = AdamW(model.trainable_params(), lr=1e-3)
    assert isinstance(pipeline_grad_reducer(optimizer, Layout(pp=2, micro_batches=2)), PipelineGradReducer)
    assert pipeline_grad_reducer(optimizer, Layout()) is None
    # The loss cell computes the model's loss.
    ids = ms.Tensor(np.arange(16, dtype=np.int32).reshape(2, 8))
    assert float(net(ids, ids).asnumpy()) == pytest.approx(float(model(ids, None, ids)[1].asnumpy()))


def test_parallel_context_kwargs():
    lay = Layout(dp=2, mp=2, pp=2, micro_batches=4, optimizer_shard=True)
    assert parallel_context(lay) == {
        "device_num": 8, "parallel_mode": "auto_parallel", "search_mode": "sharding_propagation",
        "gradients_mean": True, "dataset_strategy": "data_parallel", "pipeline_stages": 2,
        "enable_parallel_optimizer": True,
        "pipeline_config": {"pipeline_interleave": False, "pipeline_scheduler": "1f1b"},
    }
    semi = parallel_context(Layout(dp=4, mp=2), mode="semi_auto")
    assert semi["parallel_mode"] == "semi_auto_parallel" and "search_mode" not in semi
    assert semi["pipeline_stages"] == 1 and semi["enable_parallel_optimizer"] is False
    assert parallel_context(Layout(dp=4)) == {"device_num": 4, "parallel_mode": "data_parallel",
                                              "gradients_mean": True}
    assert parallel_context(Layout()) == {"parallel_mode": "stand_alone"}
    with pytest.raises(MigrateError, match="unknown parallel mode"):
        parallel_context(lay, mode="auto")


def test_context_kwargs_are_accepted_by_mindspore():
    kwargs = parallel_context(Layout(dp=2, mp=2, pp=2, micro_batches=4, optimizer_shard=True))
    try:
        ms.set_auto_parallel_context(**kwargs)
        for key, value in kwargs.items():
            if key != "pipeline_config":
                assert ms.get_auto_parallel_context(key) == value, key
    finally:
        ms.reset_auto_parallel_context()


def test_apply_refuses_model_parallel_on_cpu_and_sets_data_parallel():
    with pytest.raises(MigrateError, match="only on Ascend or GPU"):
        apply_parallel_context(Layout(mp=2), init_comm=False)
    try:
        assert apply_parallel_context(Layout(dp=2), init_comm=False)["parallel_mode"] == "data_parallel"
        assert ms.get_auto_parallel_context("parallel_mode") == "data_parallel"
    finally:
        ms.reset_auto_parallel_context()


def test_auto_parallel_network_configures_the_210_api():
    net = CausalLMLoss(LlamaForCausalLM(_cfg(layers=2)))
    wrapped = auto_parallel_network(net, Layout(dp=2, mp=1, pp=2, micro_batches=2, optimizer_shard=True))
    assert wrapped.get_pipeline_stages() == 2
    assert wrapped._enable_parallel_optimizer is True  # noqa: SLF001 - AutoParallel exposes no getter
