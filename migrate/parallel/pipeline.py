"""Pipeline stages for the bundled Llama and the MindSpore pipeline wrappers.

    stages = assign_pipeline_stages(model, pp=4)     # {0: 0, 1: 0, ..., 31: 3}
    net = build_pipeline_network(CausalLMLoss(model), layout)   # mindspore.parallel.nn.Pipeline when pp > 1
    reducer = pipeline_grad_reducer(optimizer, layout)          # mindspore.parallel.nn.PipelineGradReducer

Stages follow MindFormers' Llama: layer i goes to stage i // (num_layers / pp)
(contiguous, equal ranges), the embedding to stage 0, the final norm and the
head to the last stage. `Cell.pipeline_stage` is a plain attribute, so this
runs (and is tested) on CPU; MindSpore reads it when it compiles the graph
with `pipeline_stages` > 1 on Ascend/GPU.

Ops that live directly in LlamaModel/LlamaForCausalLM.construct (RoPE tables,
the causal mask, the loss) belong to no staged cell; MindSpore assigns them by
data dependency. A tied embedding is shared by stage 0 (lookup) and the last
stage (head); MindSpore keeps a copy on both stages and keeps them in sync.
"""
from __future__ import annotations

from mindspore import nn

from migrate.errors import MigrateError
from migrate.parallel.layout import Layout


class CausalLMLoss(nn.Cell):
    """The model reduced to `loss = net(input_ids, labels)`: what Pipeline / MicroBatchInterleaved expect.

    (They slice every input along the batch and add the outputs, so the
    wrapped network must return one tensor.)
    """

    def __init__(self, model):
        super().__init__(auto_prefix=False)
        self.model = model

    def construct(self, input_ids, labels):
        _, loss, _ = self.model(input_ids, None, labels)
        return loss


def stage_of_layer(layer: int, num_layers: int, pp: int) -> int:
    return layer // (num_layers // pp)


def assign_pipeline_stages(model, pp: int) -> dict[int, int]:
    """Set `pipeline_stage` on every decoder layer, the embedding, final norm and head; return layer -> stage."""
    num_layers = len(model.model.layers)
    if pp < 1 or num_layers % pp:
        raise MigrateError(f"num_layers ({num_layers}) is not divisible by pp ({pp}): "
                           f"every pipeline stage needs the same number of layers")
    stages = {}
    for i, layer in enumerate(model.model.layers):
        stages[i] = stage_of_layer(i, num_layers, pp)
        layer.pipeline_stage = stages[i]
    model.model.tok_embeddings.pipeline_stage = 0
    model.model.norm_out.pipeline_stage = pp - 1
    for head in ("lm_head", "tied_head"):
        if head in model.name_cells():
            getattr(model, head).pipeline_stage = pp - 1
    return stages


def read_pipeline_stages(model) -> dict[str, int]:
    """cell path -> pipeline_stage for every cell that has one set."""
    out = {}
    for name, cell in model.cells_and_names():
        stage = getattr(cell, "_pipeline_stage", None)
        if stage is not None and stage >= 0:
            out[name] = stage
    return out


def build_pipeline_network(net: nn.Cell, layout: Layout, interleave: int = 1) -> nn.Cell:
    """Wrap a loss network per MindSpore's documented pipeline API.

    pp > 1: `mindspore.parallel.nn.Pipeline(net, micro_size=layout.micro_batches)`
    (the 2.x name of nn.PipelineCell), which slices each batch into
    micro-batches and sums their losses. interleave > 1 first wraps in
    `MicroBatchInterleaved(net, interleave)` (overlaps mp communication with
    compute). pp == 1: the network unchanged (accumulation stays in the trainer).
    """
    from mindspore.parallel.nn import MicroBatchInterleaved, Pipeline

    if interleave > 1:
        net = MicroBatchInterleaved(net, interleave)
    if layout.pp > 1:
        if layout.micro_batches < layout.pp:
            raise MigrateError(f"micro_batches ({layout.micro_batches}) must be >= pp ({layout.pp}) "
                               f"so that every pipeline stage has work")
        return Pipeline(net, layout.micro_batches)
    return net


def pipeline_grad_reducer(optimizer, layout: Layout):
    """`mindspore.parallel.nn.PipelineGradReducer` for the optimizer's parameters (pp > 1), else None.

    It accumulates the micro-batch gradients of a pipeline step before the
    optimizer runs; `opt_shard` must match the context's parallel optimizer.
    """
    if layout.pp == 1:
        return None
    from mindspore.parallel.nn import PipelineGradReducer

    return PipelineGradReducer(optimizer.parameters, opt_shard=layout.optimizer_shard)
