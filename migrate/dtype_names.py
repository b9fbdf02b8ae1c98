"""The dtype vocabulary: fp32, bf16 and fp16, every spelling of them, and what they mean.

The one table of floating-point precisions the package knows. `migrate diff`'s thresholds,
`migrate compare`'s tolerances, run.yaml's `dtype`, the planner's bytes per element, the
compute dtype a model.yaml names and the cross-check of effective hyperparameters all read it.
Framework dtype objects (`torch.bfloat16`, `mindspore.float16`, numpy's) stay in the modules
that import their framework, looked up by the names here.

It sits at the bottom of the package (beside `errors`): the converter's planner reads it and
must not import what lies above.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from migrate.errors import MigrateError

__all__ = ["Precision", "PRECISIONS", "NAMES", "SPELLINGS", "canonical_dtype", "spelled"]


@dataclass(frozen=True)
class Precision:
    name: str                   # the canonical name: fp32, bf16, fp16
    compute: str                # the framework attribute and model.yaml's compute_dtype: float32, ...
    bytes: int                  # storage size of one element
    unit_roundoff: float        # u = 2**-p (p significand bits): the largest relative rounding error
    spellings: tuple[str, ...]  # other names it goes by, lower case

    @property
    def low(self) -> bool:
        """bf16 / fp16: the dtypes judged against noise rather than fixed fp32 bounds."""
        return self.name != "fp32"


PRECISIONS: dict[str, Precision] = {p.name: p for p in (
    Precision("fp32", "float32", 4, 2.0 ** -24, ("float32", "f32", "float", "single")),
    Precision("bf16", "bfloat16", 2, 2.0 ** -8, ("bfloat16",)),
    Precision("fp16", "float16", 2, 2.0 ** -11, ("float16", "f16", "half")),
)}
NAMES = tuple(PRECISIONS)   # ("fp32", "bf16", "fp16")
# every spelling -> canonical name
SPELLINGS: dict[str, str] = {s: p.name for p in PRECISIONS.values() for s in (p.name, *p.spellings)}


def spelled(dtype: Any) -> str | None:
    """The canonical name of any usual spelling -- 'bf16', 'bfloat16', 'torch.bfloat16',
    'mindspore.float16', 'Float32', numpy dtypes and scalar types -- or None."""
    if isinstance(dtype, str):
        name = dtype
    elif isinstance(dtype, np.dtype) or (isinstance(dtype, type) and issubclass(dtype, np.generic)):
        name = np.dtype(dtype).name
    else:
        name = str(dtype)
    return SPELLINGS.get(name.strip().lower().rsplit(".", 1)[-1])


def canonical_dtype(dtype: Any) -> str:
    """'fp32' / 'bf16' / 'fp16' for any spelling `spelled` knows; anything else is a MigrateError."""
    name = spelled(dtype)
    if name is None:
        raise MigrateError(f"unknown dtype {dtype!r}; expected {', '.join(NAMES)}")
    return name
