"""Every check on a call's inputs, run on metadata alone, before anything is compiled or launched."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import InputError
from .arrays import ArrayMeta
from .dtypes import FLOAT8_E4M3, dtype_of_storage

RANK = 4
LAYOUT = "(batch, seqlen, heads, head_dim)"


@dataclass(frozen=True)
class Problem:
    """The shape of one attention call, once its inputs are known to be consistent."""

    batch: int
    seqlen_q: int
    seqlen_k: int
    heads: int
    kv_heads: int
    head_dim: int
    dtype: str
    softmax_scale: float
    head_dim_v: int = 0   # of v and the output (MLA: 128 under q / k's 192); 0 given: head_dim

    def __post_init__(self):
        if not self.head_dim_v:
            object.__setattr__(self, "head_dim_v", self.head_dim)


def check_on_gpu(m: ArrayMeta) -> None:
    """InputError unless the array lives on a CUDA device."""
    if not m.on_gpu:
        raise InputError(f"{m.name}: expected a CUDA array, got {m.kind} on the CPU")


def check_device(m: ArrayMeta, device: int | None) -> None:
    """InputError when the array is on another device than q's (either unknown: nothing to compare)."""
    if device is not None and m.device is not None and m.device != device:
        raise InputError(f"{m.name}: must be on q's device ({device}), got device {m.device}")


def _check_one(m: ArrayMeta, fp8: bool) -> None:
    check_on_gpu(m)
    if len(m.shape) != RANK:
        raise InputError(f"{m.name}: expected {RANK} dims {LAYOUT}, got shape {m.shape}")
    if 0 in m.shape:
        raise InputError(f"{m.name}: every dimension must be >= 1, got shape {m.shape}")
    if m.strides[-1] != 1 and m.shape[-1] != 1:
        raise InputError(f"{m.name}: the last (head_dim) dimension must be contiguous (stride 1), "
                         f"got strides {m.strides}")
    if fp8:
        if m.dtype != np.uint8:
            raise InputError(f"{m.name}: pre-quantized fp8 inputs must be float8_e4m3 bit patterns (uint8), "
                             f"got {m.dtype}")
    elif m.fp8 or dtype_of_storage(m.dtype) is None:
        got = "float8_e4m3" if m.fp8 else str(m.dtype)
        hint = " (pass q_scale, k_scale and v_scale for pre-quantized fp8)" if m.fp8 or m.dtype == np.uint8 else ""
        if m.dtype.kind == "V":
            hint = " (an untyped 2-byte dtype is how __cuda_array_interface__ shows bfloat16: pass it through DLPack)"
        raise InputError(f"{m.name}: dtype {got} is not supported; expected float16, bfloat16 or float32{hint}")


def validate_inputs(q: ArrayMeta, k: ArrayMeta, v: ArrayMeta, softmax_scale: float | None = None,
                    prequantized: bool = False) -> Problem:
    """Check q, k, v against each other; InputError names the argument and what was expected."""
    for m in (q, k, v):
        _check_one(m, prequantized)
    if not (q.dtype == k.dtype == v.dtype and q.fp8 == k.fp8 == v.fp8):
        raise InputError(f"k, v: dtypes must match q's ({q.dtype}), got k {k.dtype} and v {v.dtype}")
    devices = {m.device for m in (q, k, v) if m.device is not None}
    if len(devices) > 1:
        raise InputError(f"q, k, v: must be on one device, got devices {sorted(devices)}")
    b, sq, h, d = q.shape
    if k.shape[:3] != v.shape[:3]:   # v's head dim (head_dim_v) may differ from k's: the kernels say which
        raise InputError(f"v: expected the shape of k {k.shape} (its last dim, head_dim_v, may differ), "
                         f"got {v.shape}")
    if k.shape[0] != b:
        raise InputError(f"k: batch must match q's ({b}), got {k.shape[0]}")
    if k.shape[3] != d:
        raise InputError(f"k: head_dim must match q's ({d}), got {k.shape[3]}")
    hk = k.shape[2]
    if h % hk:
        raise InputError(f"k: kv heads ({hk}) must divide q's heads ({h})")
    dtype = FLOAT8_E4M3.name if prequantized else dtype_of_storage(q.dtype).name
    return Problem(b, sq, k.shape[1], h, hk, d, dtype, check_scale(softmax_scale, d), v.shape[3])


def check_scale(softmax_scale: float | None, head_dim: int) -> float:
    """The softmax scale: 1/sqrt(head_dim) by default, otherwise a finite non-zero number."""
    if softmax_scale is None:
        return 1.0 / math.sqrt(head_dim)
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float, np.floating, np.integer)):
        raise InputError(f"softmax_scale: expected a float, got {type(softmax_scale).__name__}")
    if not math.isfinite(softmax_scale) or softmax_scale == 0:
        raise InputError(f"softmax_scale: expected a finite non-zero float, got {softmax_scale}")
    return float(softmax_scale)


def check_variant(variant) -> None:
    """variant=: None (the registry chooses) or a variant's name."""
    if variant is not None and not isinstance(variant, str):
        raise InputError(f"variant: expected a variant name (str), got {type(variant).__name__}")


def check_flag(value, name: str) -> bool:
    if value is True or value is False:   # the common case first: every call checks its flags
        return value
    if not isinstance(value, (bool, np.bool_)):
        raise InputError(f"{name}: expected True or False, got {value!r}")
    return bool(value)
