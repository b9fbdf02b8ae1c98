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
            from torch.serialization import get_unsafe_globals_in_checkpoint, safe_globals

            with safe_globals(_numpy_globals(get_unsafe_globals_in_checkpoint(str(path)))):
                return torch.load(str(path), map_location="cpu", weights_only=True)
        return torch.load(str(path), map_location="cpu", weights_only=True)
    except MigrateError:
        raise
    except Exception as exc:  # a truncated zip, a pickle naming a class: torch says which in its first line
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise MigrateError(f"cannot read {what} {path} (torch.load, weights only): {first}") from None


def _numpy_globals(names: list[str]) -> list:
    """numpy's array and dtype reconstructors among `names`; anything else is refused."""
    import numpy as np

    allowed = {"numpy.core.multiarray._reconstruct": np.core.multiarray._reconstruct,
               "numpy._core.multiarray._reconstruct": np.core.multiarray._reconstruct,
               "numpy.ndarray": np.ndarray, "numpy.dtype": np.dtype}
    found = []
    for name in names:
        if name in allowed:
            found.append(allowed[name])
        elif name.startswith(("numpy.dtypes.", "numpy.dtype[")) and hasattr(np.dtypes, name.rsplit(".", 1)[-1]):
            found.append(getattr(np.dtypes, name.rsplit(".", 1)[-1]))
        else:
            raise MigrateError(f"the file names {name}, which is not numpy's array or dtype: not read")
    return found
