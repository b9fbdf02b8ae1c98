"""torch's pickled files (optimizer.pt, scheduler.pt, trainer_state.pt, rng_state.pth), read with
``weights_only=True`` alone: tensors, containers and numbers, never a class or a function from the
file. What else they hold refuses the file in one line."""
from __future__ import annotations

from pathlib import Path

from migrate.errors import MigrateError


def load_torch(path: Path, what: str, numpy_arrays: bool = False):
    """The object in `path`; `numpy_arrays`: also numpy arrays (HF Trainer's rng_state.pth holds numpy's
    generator state), admitted through torch's allowlist of numpy's own reconstructors."""
    import torch

    try:
        if numpy_arrays:
            from torch.serialization import safe_globals

            with safe_globals(_numpy_globals()):
                return torch.load(str(path), map_location="cpu", weights_only=True)
        return torch.load(str(path), map_location="cpu", weights_only=True)
    except MigrateError:
        raise
    except Exception as exc:  # a truncated zip, a pickle naming a class: torch says which in its first line
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise MigrateError(f"cannot read {what} {path} (torch.load, weights only): {first}") from None


def _numpy_globals() -> list:
    """numpy's array reconstructor, ndarray, dtype and the numeric dtype classes: numbers only (an object
    array would still meet the same restricted unpickler for its elements, but none is needed here)."""
    import numpy as np

    numeric = ("Bool", "Int8", "Int16", "Int32", "Int64", "UInt8", "UInt16", "UInt32", "UInt64", "Float16",
               "Float32", "Float64", "Long", "ULong", "LongLong", "ULongLong", "Short", "UShort", "Byte", "UByte")
    classes = [getattr(np.dtypes, f"{n}DType") for n in numeric if hasattr(np.dtypes, f"{n}DType")]
    return [np.core.multiarray._reconstruct, np.ndarray, np.dtype, *classes]
