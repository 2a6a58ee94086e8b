"""Array interop: describe any CUDA array without touching the GPU, then view it as CuPy (zero copy)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InputError

DLPACK_CPU, DLPACK_CUDA, DLPACK_CUDA_HOST, DLPACK_CUDA_MANAGED = 1, 2, 3, 13
CUDA_DEVICE_TYPES = (DLPACK_CUDA, DLPACK_CUDA_MANAGED)


@dataclass(frozen=True)
class ArrayMeta:
    """What validation needs of an array: shape, storage dtype, strides in elements, and where it lives."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    strides: tuple[int, ...]
    on_gpu: bool
    kind: str                  # type name, for messages
    device: int | None = None
    fp8: bool = False          # a float8_e4m3 tensor (carried as uint8 bit patterns)

    def __post_init__(self) -> None:
        # An empty array's strides mean nothing (NumPy and CuPy report 0s for an empty slice of a strided view):
        # it is described as contiguous, so that its layout checks pass; no kernel reads it.
        if 0 in self.shape:
            object.__setattr__(self, "strides", contiguous_strides(self.shape))


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major strides (in elements) of `shape`."""
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


def array_module(x: Any):
    """numpy or cupy, whichever x belongs to."""
    if type(x).__module__.startswith("cupy"):
        import cupy
        return cupy
    return np


def _is_torch_fp8(x: Any) -> bool:
    return type(x).__module__.startswith("torch") and "float8_e4m3" in str(getattr(x, "dtype", ""))


def describe(x: Any, name: str) -> ArrayMeta:
    """Metadata of a CuPy array, a __cuda_array_interface__ object, a DLPack exporter or a host array."""
    kind = f"{type(x).__module__.split('.')[0]}.{type(x).__name__}"
    if x is None:
        raise InputError(f"{name}: expected a CUDA array, got None")
    if type(x).__module__.startswith("cupy"):
        return ArrayMeta(name, tuple(x.shape), np.dtype(x.dtype), tuple(s // x.itemsize for s in x.strides),
                         True, kind, x.device.id)
    if type(x).__module__.startswith("torch"):
        on_gpu = bool(getattr(x, "is_cuda", False))
        fp8 = _is_torch_fp8(x)
        dtype = np.dtype(np.uint8) if fp8 else _torch_storage_dtype(x, name)
        return ArrayMeta(name, tuple(x.shape), dtype, tuple(x.stride()), on_gpu, kind,
                         x.device.index if on_gpu else None, fp8)
    cai = getattr(x, "__cuda_array_interface__", None)
    if isinstance(cai, dict):
        dtype = np.dtype(cai["typestr"])
        shape = tuple(cai["shape"])
        strides = cai.get("strides")
        if strides is None:
            strides = tuple(int(s) for s in np.cumprod((1,) + shape[::-1][:-1])[::-1] * dtype.itemsize) if shape else ()
        return ArrayMeta(name, shape, dtype, tuple(s // dtype.itemsize for s in strides), True, kind)
    if hasattr(x, "__dlpack_device__"):
        dev_type, dev_id = x.__dlpack_device__()
        if int(dev_type) not in CUDA_DEVICE_TYPES:
            where = "on the CPU" if int(dev_type) == DLPACK_CPU else f"on DLPack device type {int(dev_type)}"
            raise InputError(f"{name}: expected a CUDA array, got {kind} {where}")
        return _describe_via_cupy(x, name, kind)
    if isinstance(x, np.ndarray) or hasattr(x, "__array_interface__"):
        raise InputError(f"{name}: expected a CUDA array, got {kind} on the CPU (move it to the GPU first)")
    raise InputError(f"{name}: expected a CUDA array (CuPy, DLPack or __cuda_array_interface__), got {kind}")


def _torch_storage_dtype(x: Any, name: str) -> np.dtype:
    import ml_dtypes
    table = {"torch.float16": np.float16, "torch.bfloat16": ml_dtypes.bfloat16, "torch.float32": np.float32,
             "torch.float64": np.float64, "torch.uint8": np.uint8, "torch.int8": np.int8,
             "torch.int32": np.int32, "torch.int64": np.int64, "torch.bool": np.bool_}
    key = str(x.dtype)
    if key not in table:
        raise InputError(f"{name}: dtype {key} is not supported; expected float16, bfloat16 or float32")
    return np.dtype(table[key])


def _describe_via_cupy(x: Any, name: str, kind: str) -> ArrayMeta:
    arr = to_cupy(x, name)
    return ArrayMeta(name, tuple(arr.shape), np.dtype(arr.dtype), tuple(s // arr.itemsize for s in arr.strides),
                     True, kind, arr.device.id)


def to_cupy(x: Any, name: str):
    """A zero-copy CuPy view: CuPy as is, then DLPack (keeps bf16), then __cuda_array_interface__."""
    from ..runtime.device import cupy_module
    cupy = cupy_module()
    if isinstance(x, cupy.ndarray):
        return x
    if _is_torch_fp8(x):
        import torch
        x = x.view(torch.uint8)
    if getattr(x, "requires_grad", False) is True:   # torch exports neither DLPack nor the interface of these
        raise InputError(f"{name}: a tensor that requires grad; flashkit.attention is not differentiable: use "
                         f"flashkit.torch.attention for autograd, or pass {name}.detach()")
    if hasattr(x, "__dlpack__"):
        try:
            return cupy.from_dlpack(x)
        except Exception as e:
            dlpack_error = e
    else:
        dlpack_error = None
    if hasattr(x, "__cuda_array_interface__"):
        arr = cupy.asarray(x)
        if arr.dtype.kind == "V":
            raise InputError(f"{name}: its __cuda_array_interface__ gives an untyped {arr.dtype.str} dtype "
                             "(bfloat16?); pass it through DLPack")
        return arr
    raise InputError(f"{name}: could not view it as a CUDA array ({dlpack_error})")
