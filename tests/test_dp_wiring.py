"""How the trainer is wired for a layout, checked without executing a parallel graph.

Tensor/pipeline parallel run only on Ascend/GPU: here the wiring is applied
to a tiny model and read back (strategies on the primitives, stages on the
cells, the Pipeline network and its grad reducer), as the strategy tests do.
"""
from types import SimpleNamespace

import pytest
from mindspore.parallel.nn import Pipeline, PipelineGradReducer

from migrate.errors import MigrateError
from migrate.models.config import LlamaConfig
from migrate.models.llama import LlamaForCausalLM
from migrate.parallel.layout import Layout
from migrate.parallel.runtime import ParallelRun, dp_rank
from migrate.train.optim import AdamW
from migrate.train.parallel_setup import refuse_unsupported, wire_model_parallel, wire_parallel
from migrate.train.step.cells import MicroStep


def _training(layers=4):
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=layers, num_heads=4,
                         n_kv_heads=2)
    model = LlamaForCausalLM(config)
    optimizer = AdamW([{"params": list(model.trainable_params()), "weight_decay": 0.0}], lr=1e-3)
    micro = MicroStep(model, list(optimizer.parameters), loss_divisor=2)
    return SimpleNamespace(model=model, optimizer=optimizer, micro=micro)


def test_tensor_and_pipeline_parallel_wiring():
    training = _training()
    layout = Layout(dp=2, mp=2, pp=2, micro_batches=4, micro_batch_size=1, grad_accum_steps=2)
    wired = wire_model_parallel(training, layout)
    assert wired["strategies"]["model.layers.3.attention.wq.matmul"] == ((2, 1), (2, 1))
    assert wired["strategies"]["model.layers.0.feed_forward.w2.matmul"] == ((2, 2), (1, 2))
    assert wired["stages"] == {0: 0, 1: 0, 2: 1, 3: 1}
    assert training.model.lm_head.pipeline_stage == 1
    micro = training.micro
    assert wired["micro_step"] == "PipelineMicroStep" and isinstance(micro, MicroStep)
    assert isinstance(micro.network, Pipeline) and micro.network.micro_size == 4
    assert micro.loss_divisor == 2 * 4  # Pipeline sums its 4 micro-batch losses
    assert isinstance(wired["grad_reducer"], PipelineGradReducer)


def test_tensor_parallel_leaves_the_reduction_to_the_compiler():
    training = _training(layers=2)
    run = ParallelRun(Layout(dp=2, mp=2), rank=3, size=4)
    wire_parallel(training, run)
    grads = ("g0", "g1")
    assert run.reduce_grads(grads) is grads  # MindSpore's compiler inserts the mirror all-reduces itself
    assert run.describe()["dp"] == 2 and "grad_reducer" not in run.describe()
    assert type(training.micro) is MicroStep  # no pipeline: the trainer's own micro-step
    assert training.model.model.layers[1].attention.wq.kernel.matmul.attrs["in_strategy"] == ((2, 1), (2, 1))


def test_refused_on_cpu_only():
    with pytest.raises(MigrateError, match="--mp 2 needs MindSpore's SEMI_AUTO_PARALLEL"):
        refuse_unsupported(Layout(mp=2), "CPU")
    refuse_unsupported(Layout(mp=2), "Ascend")
    refuse_unsupported(Layout(dp=4), "CPU")  # data parallel runs here


def test_data_shard_of_each_rank():
    # dp 2 × mp 2 × pp 2: ranks are numbered stage by stage, mp fastest; mp peers read the same rows.
    layout = Layout(dp=2, mp=2, pp=2, micro_batches=2)
    assert [dp_rank(r, layout) for r in range(8)] == [0, 0, 1, 1, 0, 0, 1, 1]
    assert ParallelRun(layout, rank=6, size=8).data_shard == (2, 1)
    assert ParallelRun(Layout(dp=4), rank=3, size=4).data_shard == (4, 3)
    assert ParallelRun(Layout(dp=4), rank=0, size=4).is_writer and not ParallelRun(Layout(dp=4), 1, 4).is_writer
