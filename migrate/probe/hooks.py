"""Recording hooks on any model, whichever framework it is: the torch or MindSpore hooks module is
imported only when a model of its framework is hooked."""
from __future__ import annotations

from contextlib import contextmanager

from migrate.errors import MigrateError

__all__ = ["framework_of", "hooks"]


def framework_of(model) -> str:
    roots = {cls.__module__.split(".")[0] for cls in type(model).__mro__}
    if "torch" in roots:
        return "torch"
    if "mindspore" in roots:
        return "mindspore"
    raise MigrateError(f"cannot record a {type(model).__name__}: neither a torch.nn.Module nor a MindSpore nn.Cell")


@contextmanager
def hooks(model, sink, *, inputs: bool = False, params: bool = False, grads: bool = False, include=None):
    """Recording hooks on `model`, whichever framework it is (the heavy one imported here only)."""
    if framework_of(model) == "torch":
        from migrate.probe.hooks_torch import record_torch

        with record_torch(model, sink, inputs=inputs, params=params, grads=grads, include=include) as rec:
            yield rec
    else:
        from migrate.probe.hooks_ms import record_ms

        with record_ms(model, sink, inputs=inputs, params=params, include=include) as rec:
            yield rec
