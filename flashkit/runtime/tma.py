"""TMA tensor maps of the contract's (batch, seqlen, heads, head_dim) tensors: geometry, encoding, cache.

A kernel that declares `tensor_maps` in its manifest receives, after the parameter block, one
CUtensorMap per named tensor (include/flashkit/hopper/tma.cuh). Each describes the tensor as it is
(no copy) in four dimensions, innermost first (head_dim, seqlen, heads, batch), with a box of one
128-byte panel of the head dim by `rows` rows and the 128-byte swizzle (a head dim that ends inside a
panel, 96 of 16-bit elements, reads the panel's rest as zeros: TMA's out-of-bounds fill). The maps are encoded by the
CUDA driver's cuTensorMapEncodeTiled through NVIDIA's cuda-bindings and cached per geometry, so a
repeated call with the same pointers and shapes encodes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from ..errors import DeviceError

PANEL_BYTES = 128            # the box's inner extent: the 128-byte swizzle span
STRIDE_ALIGN = 16            # TMA: base address and every stride in bytes, multiples of 16
MAX_BOX_ROWS = 256           # TMA: at most 256 elements a box dimension
MAX_STRIDE = 1 << 40         # TMA: strides below 2^40 bytes
TENSOR_MAP_DTYPE = np.dtype((np.void, 128))   # CUtensorMap: 128 opaque bytes, passed by value
MISSING_BINDING = ("needs NVIDIA's cuda-bindings for TMA tensor maps "
                   "(pip install 'flashkit[cuda13]' or 'flashkit[cuda12]')")
SWIZZLES = (128, 64)          # panel bytes a box may span: TMA's 128- and 64-byte swizzle modes
DTYPE_NAMES = {"float16": "FLOAT16", "bfloat16": "BFLOAT16", "float8_e4m3": "UINT8"}


@dataclass(frozen=True)
class MapGeometry:
    """What one tensor map encodes: element type, base address, dims and strides, box."""

    dtype: str
    address: int
    dims: tuple[int, int, int, int]        # (head_dim, seqlen, heads, batch)
    strides: tuple[int, int, int]          # bytes between rows, heads, batches
    box: tuple[int, int, int, int]         # (panel elements, rows, 1, 1)
    swizzle: int = PANEL_BYTES             # the swizzle span: the panel's bytes (128, or 64 for a 64-byte panel)


def map_geometry(address: int, shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int,
                 dtype: str, rows: int, panel_bytes: int = PANEL_BYTES) -> MapGeometry:
    """The tensor map of a (batch, seqlen, heads, head_dim) tensor with byte strides, or ValueError why not.
    Its box: one panel of panel_bytes (128, or 64: the 64-byte swizzle) of the innermost dimension by `rows`."""
    batch, seqlen, heads, head_dim = shape
    if dtype not in DTYPE_NAMES:
        raise ValueError(f"TMA maps take {', '.join(DTYPE_NAMES)}, not {dtype}")
    if strides[3] != itemsize:
        raise ValueError("the head dim must be contiguous")
    if address % STRIDE_ALIGN:
        raise ValueError(f"the base address must be {STRIDE_ALIGN}-byte aligned")
    if (head_dim * itemsize) % STRIDE_ALIGN:
        raise ValueError(f"rows must be whole {STRIDE_ALIGN}-byte units (head_dim * itemsize)")
    if not 0 < rows <= MAX_BOX_ROWS:
        raise ValueError(f"box rows {rows} outside 1..{MAX_BOX_ROWS}")
    row_b, head_b, batch_b = strides[1], strides[2], strides[0]
    # A dimension of extent 1 is never stepped: any valid stride describes it.
    head_b = head_b if heads > 1 else head_dim * itemsize
    batch_b = batch_b if batch > 1 else max(row_b * seqlen, head_b * heads)
    for name, s in (("row", row_b), ("head", head_b), ("batch", batch_b)):
        if s <= 0 or s % STRIDE_ALIGN or s >= MAX_STRIDE:
            raise ValueError(f"the {name} stride ({s} bytes) must be a positive multiple of {STRIDE_ALIGN} "
                             f"below 2^40")
    if panel_bytes not in SWIZZLES:
        raise ValueError(f"panels of {', '.join(map(str, SWIZZLES))} bytes, not {panel_bytes}")
    return MapGeometry(dtype, address, (head_dim, seqlen, heads, batch), (row_b, head_b, batch_b),
                       (panel_bytes // itemsize, rows, 1, 1), panel_bytes)


def array_geometry(arr: Any, dtype: str, rows: int) -> MapGeometry:
    """map_geometry of a CuPy array."""
    return map_geometry(arr.data.ptr, tuple(arr.shape), tuple(arr.strides), arr.itemsize, dtype, rows)


@lru_cache(maxsize=1)
def binding_missing() -> str | None:
    """None when cuda-bindings' driver module imports, else why TMA kernels cannot run."""
    try:
        from cuda.bindings import driver  # noqa: F401
    except ImportError:
        return MISSING_BINDING
    return None


@lru_cache(maxsize=4096)
def encode(geometry: MapGeometry) -> np.void:
    """The 128-byte CUtensorMap of a geometry (cached: the same geometry never encodes twice)."""
    if binding_missing():
        raise DeviceError(f"TMA: {MISSING_BINDING}")
    from cuda.bindings import driver as cu
    data_type = getattr(cu.CUtensorMapDataType, f"CU_TENSOR_MAP_DATA_TYPE_{DTYPE_NAMES[geometry.dtype]}")
    err, tensor_map = cu.cuTensorMapEncodeTiled(
        data_type, len(geometry.dims), geometry.address, [cu.cuuint64_t(d) for d in geometry.dims],
        [cu.cuuint64_t(s) for s in geometry.strides], [cu.cuuint32_t(b) for b in geometry.box],
        [cu.cuuint32_t(1)] * len(geometry.dims),
        cu.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        getattr(cu.CUtensorMapSwizzle, f"CU_TENSOR_MAP_SWIZZLE_{geometry.swizzle}B"),
        cu.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        cu.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
    if err != cu.CUresult.CUDA_SUCCESS:
        raise DeviceError(f"cuTensorMapEncodeTiled failed ({err.name}) for {geometry}")
    words = np.array([int(w) for w in tensor_map.opaque], dtype=np.uint64)
    return words.view(TENSOR_MAP_DTYPE)[0]


def padded_keys(seqlen_k: int, block_n: int) -> int:
    """Keys a row of the transposed V holds: seqlen_k padded to whole block_n tiles (zeros past the last key)."""
    return -(-seqlen_k // block_n) * block_n


def transposed_v_geometry(dtype: str, itemsize: int, batch: int, kv_heads: int, head_dim: int, seqlen_k: int,
                          block_n: int, rows: int) -> MapGeometry:
    """The map of V transposed into the workspace (the v_transposed workspace, hopper/v_transpose.cuh):
    (batch, kv_heads, head_dim, keys) seen as (batch, rows = head_dim, heads = kv_heads, keys), a box of
    one panel of keys (a block_n tile: 128 or 64 bytes, swizzled alike) by `rows` head-dim rows (the manifest's
    `vt: head_dim`: every row); address 0 (the workspace's, each call)."""
    keys = padded_keys(seqlen_k, block_n)
    row = keys * itemsize
    return map_geometry(0, (batch, head_dim, kv_heads, keys), (kv_heads * head_dim * row, row, head_dim * row, itemsize),
                        itemsize, dtype, rows, panel_bytes=block_n * itemsize)
