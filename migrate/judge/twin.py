"""The float64 twin of a torch reference model (`judge.noise`): the model itself widened to
float64 while the twin runs, and whether that fits here.

fp32, bf16 and fp16 values are exact in float64, so casting the model in place and back
restores every weight bit for bit, and the twin costs the widening of the weights (4 more bytes
per fp32 parameter) instead of a second copy -- plus float64 activations, and gradients with
``--grads``. Where that does not fit in half the memory available now, `migrate diff` judges on
the fixed bounds scaled for depth and width instead, and the verdict line says so.
"""
from __future__ import annotations

from contextlib import contextmanager

from migrate.resources import available_bytes

__all__ = ["REFERENCES", "float64_in_place", "twin_bytes", "twin_refused"]

REFERENCES = ("fp64", "none")
TWIN_SHARE = 0.5   # of the memory available when the diff starts


def twin_bytes(model, in_place: bool = False) -> int:
    """What the twin adds: a float64 copy of every parameter, or with `in_place` (the model itself
    widened to float64 while the twin runs) the widening only; gradients and optimizer state come
    on top with --grads."""
    if in_place:
        return sum(p.numel() * (8 - p.element_size()) for p in model.parameters())
    return 8 * sum(p.numel() for p in model.parameters())


def twin_refused(model, reference: str, available: int | None = None, in_place: bool = False) -> str | None:
    """None when the twin is to be built, else why not (for the report's verdict line)."""
    if reference == "none":
        return "--reference none"
    need = twin_bytes(model, in_place)
    available = available_bytes() if available is None else available
    if need > TWIN_SHARE * available:
        return (f"a float64 twin of the model needs {need / 2**30:.1f} GiB, more than {TWIN_SHARE:.0%} of the "
                f"{available / 2**30:.1f} GiB available")
    return None


@contextmanager
def float64_in_place(model, restore: bool = True):
    """The model itself cast to float64 while the block runs, then back: fp32, bf16 and fp16 values
    are exact in float64, so the round trip restores every parameter and buffer bit for bit, and
    the twin costs the float64 widening of the weights instead of a second copy.

    `restore` False leaves the model float64 after the block, for a twin that is the model's last
    use: casting back wrote every weight into fresh memory once more (1 s of a 254 M model's
    `diff --grads` on this VM, where first-touched pages are dear)."""
    import torch

    params = {name: p.dtype for name, p in model.named_parameters()}
    buffers = {name: b.dtype for name, b in model.named_buffers()}
    model.to(torch.float64)
    try:
        yield model
    finally:
        if restore:
            _cast_back(model, params, buffers)


def _cast_back(model, params: dict, buffers: dict) -> None:
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():   # a Parameter keeps its identity (and its tying)
            p.data = p.data.to(params[name])
        for name, b in model.named_buffers():      # a buffer is a new tensor: put it back by name
            owner, _, leaf = name.rpartition(".")
            model.get_submodule(owner)._buffers[leaf] = b.to(buffers[name])
