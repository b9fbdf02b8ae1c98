"""Dtype names and conversions shared by readers and writers.

bf16 stays raw 16-bit data end to end: torch bf16 is viewed as int16 and
reinterpreted as a numpy bfloat16, never routed through fp32. The numpy bfloat16
is `ml_dtypes`' (MindSpore's own lives in its C extension, whose import alone
costs 0.5 GB of RSS, more than the conversion's whole memory budget);
`mindspore.Tensor` accepts it, and `canonical` maps MindSpore's back onto it.
"""
from __future__ import annotations

import numpy as np
from ml_dtypes import bfloat16

from migrate.dtype_names import PRECISIONS
from migrate.errors import MigrateError

# safetensors dtype string <-> numpy dtype
SAFETENSORS_TO_NUMPY = {
    "F64": np.dtype(np.float64),
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(bfloat16),
    "I64": np.dtype(np.int64),
    "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16),
    "I8": np.dtype(np.int8),
    "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(np.bool_),
}
BF16 = np.dtype(bfloat16)


def canonical(dtype) -> np.dtype:
    """The dtype as this project's tables key it: any numpy bfloat16 (MindSpore's
    `asnumpy()` returns its own) becomes ml_dtypes' one."""
    dtype = np.dtype(dtype)
    return BF16 if dtype.name == "bfloat16" else dtype


def is_bf16(dtype) -> bool:
    return np.dtype(dtype).name == "bfloat16"


class DtypeTable(dict):
    """A dict keyed by numpy dtypes that finds either numpy bfloat16."""

    def __getitem__(self, key):
        return super().__getitem__(canonical(key))

    def __contains__(self, key):
        try:
            return super().__contains__(canonical(key))
        except TypeError:
            return False

    def get(self, key, default=None):
        return super().get(canonical(key), default) if key is not None else default


NUMPY_TO_SAFETENSORS = DtypeTable({v: k for k, v in SAFETENSORS_TO_NUMPY.items()})

# the numpy dtype of each precision `migrate.dtype_names` names (the order `convert --dtype` lists them)
CLI_DTYPES = {"fp32": np.dtype(np.float32), "fp16": np.dtype(np.float16), "bf16": BF16}
# numpy dtype -> model.yaml compute_dtype
COMPUTE_DTYPE = DtypeTable({dt: PRECISIONS[name].compute for name, dt in CLI_DTYPES.items()})


def torch_dtype_name(dtype) -> str:
    import torch

    names = {
        torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
        torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
        torch.uint8: "U8", torch.bool: "BOOL",
    }
    if dtype not in names:
        raise MigrateError(f"unsupported tensor dtype {dtype}")
    return names[dtype]


def torch_to_numpy(tensor) -> np.ndarray:
    import torch

    tensor = tensor.detach().cpu().contiguous()
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(bfloat16)
    return tensor.numpy()


def numpy_to_torch(array: np.ndarray):
    import torch

    array = np.require(array, requirements="C")  # keeps 0-d arrays 0-d, unlike ascontiguousarray
    if is_bf16(array.dtype):
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


def is_float(dtype: np.dtype) -> bool:
    return dtype in COMPUTE_DTYPE or np.dtype(dtype) == np.dtype(np.float64)


def cast(array: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Cast floating tensors; leave integer tensors alone. Identity casts copy nothing."""
    if canonical(array.dtype) == canonical(dtype) or not is_float(array.dtype):
        return array
    if is_bf16(dtype) or is_bf16(array.dtype):
        # Round to nearest even through torch, which implements bf16 rounding exactly like HF.
        out = np.empty(array.shape, dtype)
        cast_into(array, out)
        return out
    return array.astype(dtype)

# torch runs a copy of more elements than this on its intra-op thread pool; on a
# small busy machine that was measured 30× slower than one thread (45 MB/s).
_SERIAL_ELEMENTS = 32768


def cast_into(array: np.ndarray, out: np.ndarray) -> None:
    """Write `array` cast to `out.dtype` into `out` (same shape), with exactly the
    rounding of `cast`, allocating nothing: torch's `copy_` is the kernel `.to` uses,
    called on slices small enough to run on the calling thread alone."""
    if is_bf16(array.dtype) or is_bf16(out.dtype):
        src, dst = numpy_to_torch(array).reshape(-1), numpy_to_torch(out).reshape(-1)
        for start in range(0, src.numel(), _SERIAL_ELEMENTS):
            dst[start:start + _SERIAL_ELEMENTS].copy_(src[start:start + _SERIAL_ELEMENTS])
    else:
        np.copyto(out, array, casting="unsafe")


# MindSpore `.ckpt` tensor_type string -> numpy dtype
MS_TYPE_TO_NUMPY = {
    "Float64": np.dtype(np.float64),
    "Float32": np.dtype(np.float32),
    "Float16": np.dtype(np.float16),
    "BFloat16": np.dtype(bfloat16),
    "Int64": np.dtype(np.int64),
    "Int32": np.dtype(np.int32),
    "Int16": np.dtype(np.int16),
    "Int8": np.dtype(np.int8),
    "UInt8": np.dtype(np.uint8),
    "Bool": np.dtype(np.bool_),
}


def short_name(dtype: np.dtype) -> str:
    """Human dtype name: fp32, bf16, int64..."""
    names = {**{dt: name for name, dt in CLI_DTYPES.items()}, np.dtype(np.float64): "fp64"}
    return names.get(canonical(dtype), np.dtype(dtype).name)
