"""Logical element types: names, NumPy dtypes, device codes and rounding units."""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np


@dataclass(frozen=True)
class DType:
    """A logical element type as flashkit names it, with its storage and its code in params.cuh."""

    name: str
    storage: np.dtype        # how the bits are held in a CuPy/NumPy array
    compute: np.dtype        # the NumPy type that rounds like it (for the plain reference)
    code: int                # FLASHKIT_<NAME> in params.cuh
    eps: float               # unit roundoff: half the spacing of 1.0

    @property
    def itemsize(self) -> int:
        return self.storage.itemsize


FLOAT16 = DType("float16", np.dtype(np.float16), np.dtype(np.float16), 1, 2.0**-11)
BFLOAT16 = DType("bfloat16", np.dtype(ml_dtypes.bfloat16), np.dtype(ml_dtypes.bfloat16), 2, 2.0**-8)
FLOAT32 = DType("float32", np.dtype(np.float32), np.dtype(np.float32), 3, 2.0**-24)
FLOAT8_E4M3 = DType("float8_e4m3", np.dtype(np.uint8), np.dtype(ml_dtypes.float8_e4m3fn), 4, 2.0**-4)

BY_NAME = {d.name: d for d in (FLOAT16, BFLOAT16, FLOAT32, FLOAT8_E4M3)}
ALIASES = {"fp16": "float16", "half": "float16", "bf16": "bfloat16", "fp32": "float32",
           "float": "float32", "fp8": "float8_e4m3", "e4m3": "float8_e4m3", "float8_e4m3fn": "float8_e4m3"}


def dtype_by_name(name: str) -> DType:
    """The logical dtype for a name or alias ('bf16', 'float16', ...)."""
    key = ALIASES.get(name, name)
    if key not in BY_NAME:
        from ..errors import InputError
        raise InputError(f"dtype: unknown dtype {name!r}; expected one of {', '.join(BY_NAME)}")
    return BY_NAME[key]


def dtype_of_storage(storage: np.dtype) -> DType | None:
    """The logical dtype for an array's storage dtype (uint8 is not FP8 unless the caller says so)."""
    for d in (FLOAT16, BFLOAT16, FLOAT32):
        if d.storage == storage:
            return d
    return None
