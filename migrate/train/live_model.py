"""What the live MindSpore model of a run does, read from its cells (for effective_hparams.json).

Config text says what was asked for; these records say what the model that trains
will do, so a trainer that silently drops autocast or recompute shows it:

  shared_record(model)          the facts golden/train_torch.py records from its live
                                torch model with the same meaning and the same keys
                                (`live_shared`): parameter dtypes, the dtype the linear
                                layers of each decoder layer and the LM head compute in,
                                the decoder layers that recompute in the backward pass
  mindspore_only_record(model)  every kind of cell with the dtype it computes in and its
                                parameters' dtypes (`live_mindspore_only`)
  autocast_dtype(model)         the dtype autocast's linear cells round to; None without autocast
"""
from __future__ import annotations

from migrate.models.base import ModelCell
from migrate.models.common import Linear, TiedHead
from migrate.train.precision import autocast_rounds_to, compute_dtype


def dtype_name(dtype) -> str:
    """MindSpore's dtype in torch's spelling (BFloat16 -> bfloat16), so both sides read alike."""
    return str(dtype).lower()


def recomputes(cell) -> bool:
    # Cell.recompute() has no public getter; it sets this on the cell and on every cell below
    # it (mindspore/nn/cell.py `_recompute`), along with the `recompute_` scope graph mode uses.
    return bool(getattr(cell, "_has_config_recompute", False))


def _linear_dtypes(cell) -> list[str]:
    """Sorted dtypes the matmul-class cells (linear layers, the tied head) under `cell` compute in."""
    return sorted({dtype_name(compute_dtype(c)) for _, c in cell.cells_and_names()
                   if isinstance(c, (Linear, TiedHead))})


def shared_record(model) -> dict:
    layers = list(model.model.layers)
    head = model.tied_head if model.tie_word_embeddings else model.lm_head
    return {
        "parameter_dtypes": sorted({dtype_name(p.dtype) for p in model.get_parameters()}),
        "linear_compute_dtypes": {"decoder_layers": [_linear_dtypes(layer) for layer in layers],
                                  "lm_head": _linear_dtypes(head)},
        "recompute_layers": [i for i, layer in enumerate(layers) if recomputes(layer)],
    }


def mindspore_only_record(model) -> dict:
    groups: dict[tuple, dict] = {}
    for name, cell in model.cells_and_names():
        if not isinstance(cell, ModelCell):  # containers (CellList) and kernels have no precision of their own
            continue
        params = sorted({dtype_name(p.dtype) for p in cell.get_parameters(expand=False)})
        kind = type(cell).__name__
        computes_in = dtype_name(compute_dtype(cell))
        group = groups.setdefault((kind, computes_in, tuple(params)),
                                  {"class": kind, "computes_in": computes_in, "parameter_dtypes": params,
                                   "cells": 0, "first": name or "<model>"})
        group["cells"] += 1
    return {"cells": list(groups.values()),
            "computes_in": "the dtype a cell's results carry, or are rounded to where fp32 math emulates it "
                           "(autocast; low precision on CPU)"}


def autocast_dtype(model):
    # The matmul-class cells are where autocast acts; a cell given another policy is out of it.
    found = sorted({dtype_name(autocast_rounds_to(c)) for _, c in model.cells_and_names()
                    if isinstance(c, (Linear, TiedHead)) and autocast_rounds_to(c) is not None})
    if not found:
        return None
    return found[0] if len(found) == 1 else found
