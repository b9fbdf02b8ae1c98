"""Whether the float64 twin of the reference model can be built here (`align.reference`).

The twin holds every parameter in float64 (8 bytes each) beside the model itself, plus its
activations, gradients and AdamW state with ``--grads``; a 70B model's twin would need 560 GB.
Where it does not fit in half the memory available now, `migrate diff` judges on the fixed
bounds scaled for depth and width instead, and the verdict line says so.
"""
from __future__ import annotations

REFERENCES = ("fp64", "none")
TWIN_SHARE = 0.5   # of the memory available when the diff starts


def twin_bytes(model) -> int:
    """float64 parameters of a torch model; gradients and optimizer state come on top with --grads."""
    return 8 * sum(p.numel() for p in model.parameters())


def available_bytes() -> int:
    import psutil

    return int(psutil.virtual_memory().available)


def twin_refused(model, reference: str, available: int | None = None) -> str | None:
    """None when the twin is to be built, else why not (for the report's verdict line)."""
    if reference == "none":
        return "--reference none"
    need = twin_bytes(model)
    available = available_bytes() if available is None else available
    if need > TWIN_SHARE * available:
        return (f"a float64 copy of the model needs {need / 2**30:.1f} GiB, more than {TWIN_SHARE:.0%} of the "
                f"{available / 2**30:.1f} GiB available")
    return None
