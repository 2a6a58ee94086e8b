"""FP8 (e4m3) quantization for the fp8 variant: block scales and Hadamard incoherent processing.

`quantize_fp8(x)` turns a (batch, seqlen, heads, head_dim) float16/bfloat16/float32 CUDA array into
e4m3 bit patterns (uint8, contiguous) and float32 scales (batch, heads, ceil(seqlen / block)) with
real value = e4m3 * scale, scale = amax / 448 per (batch, head, block of rows), in one GPU pass
(include/flashkit/fp8_quantize.cuh). With `hadamard=True` each row is first rotated by the
random-sign Walsh-Hadamard transform R = diag(signs) H / sqrt(d) (orthogonal), which spreads outliers
over the head dim; applied to both Q and K with the same seed it leaves Q K^T unchanged (V is never
rotated). The NumPy/CuPy helpers here (`round_e4m3`, `dequantize_fp8`, `hadamard_rotation`) are the
reference math the tests and the verification use.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np

from ..errors import InputError, UnsupportedError

E4M3_MAX = 448.0
E4M3_MIN_EXP = -6            # smallest normal exponent of e4m3 (subnormal spacing 2**-9)
E4M3_MANTISSA_BITS = 3
MIN_SCALE_BLOCK = 64         # rows per scale block: a power of two >= this (fp8.cuh kMinScaleBlock)
DEFAULT_BLOCK = 128
MAX_HEAD_DIM = 1024
FP8_MIN_CC = (8, 9)
QUANT_THREADS = 512          # the quantizer's block size (FLASHKIT_QUANT_THREADS)
MAX_VECTOR_BYTES = 16        # its widest load (FLASHKIT_ALIGN)
MODE_FUSED, MODE_AMAX, MODE_GIVEN_AMAX = 0, 1, 2
INPUT_DTYPES = ("float16", "bfloat16", "float32")


# ---- reference math (NumPy or CuPy) --------------------------------------------------------------

def _xp(x):
    from ..call.arrays import array_module
    return array_module(x)


def round_e4m3(x):
    """Round float32 values to the nearest e4m3 value (ties to even), saturating at +-448."""
    xp = _xp(x)
    x = xp.asarray(x, dtype=xp.float32)
    a = xp.abs(x)
    _, e = xp.frexp(a)                                            # a = m 2**e, m in [0.5, 1)
    exp = xp.maximum(e.astype(xp.int32) - 1, E4M3_MIN_EXP)        # floor(log2 a), subnormals share -6
    ulp = xp.ldexp(xp.ones_like(a), exp - E4M3_MANTISSA_BITS)
    q = xp.minimum(xp.rint(a / ulp) * ulp, E4M3_MAX)
    return xp.copysign(q, x).astype(xp.float32)


@lru_cache(maxsize=None)
def _e4m3_table() -> np.ndarray:
    import ml_dtypes
    return np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)


def decode_e4m3(bits):
    """e4m3 bit patterns (uint8, NumPy or CuPy) -> float32 values."""
    xp = _xp(bits)
    return xp.asarray(_e4m3_table())[bits]


def dequantize_fp8(data, scales, block: int | None = None):
    """float32 (batch, seqlen, heads, d) from e4m3 bits and (batch, heads, blocks) scales."""
    xp = _xp(data)
    seqlen = data.shape[1]
    n = scales.shape[2]
    block = block or (seqlen if n == 1 else scale_block_rows(seqlen, n, seqlen, n) or -(-seqlen // n))
    idx = xp.arange(seqlen) // block                                  # row -> scale block
    s = xp.asarray(scales, dtype=xp.float32)[:, :, idx]               # (b, h, s)
    return decode_e4m3(data) * xp.transpose(s, (0, 2, 1))[..., None]


def random_signs(head_dim: int, seed: int) -> np.ndarray:
    """The +-1 diagonal of the Hadamard rotation, a function of the seed only."""
    return np.random.default_rng(seed).choice(np.array([-1.0, 1.0], dtype=np.float32), size=head_dim)


def hadamard_rotation(head_dim: int, seed: int) -> np.ndarray:
    """R = diag(signs) H / sqrt(d) (float64, orthogonal): a row x becomes x R."""
    if head_dim < 1 or head_dim & (head_dim - 1):
        raise InputError(f"hadamard: head_dim must be a power of two, got {head_dim}")
    h = np.ones((1, 1))
    while h.shape[0] < head_dim:
        h = np.block([[h, h], [h, -h]])
    return random_signs(head_dim, seed)[:, None].astype(np.float64) * h / np.sqrt(head_dim)


def quantize_reference(x, block: int | None = DEFAULT_BLOCK, hadamard: bool = False, seed: int = 0):
    """NumPy/CuPy model of quantize_fp8: (e4m3 values as float32, scales). Slow; for tests."""
    xp = _xp(x)
    x = xp.asarray(x).astype(xp.float32)
    b, s, h, d = x.shape
    if hadamard:
        x = (x.astype(xp.float64) @ xp.asarray(hadamard_rotation(d, seed))).astype(xp.float32)
    rows = s if block is None else block
    n = -(-s // rows)
    pad = xp.zeros((b, n * rows - s, h, d), dtype=xp.float32)
    xb = xp.concatenate([x, pad], axis=1).reshape(b, n, rows, h, d)
    amax = xp.abs(xb).max(axis=(2, 4)).transpose(0, 2, 1)           # (b, h, n)
    if block is None:
        amax = xp.broadcast_to(amax.max(), (b, h, 1)).astype(xp.float32)
        n, rows = 1, s
    amax = amax.astype(xp.float32)
    nonzero = amax > 0
    scales = xp.where(nonzero, amax / xp.float32(E4M3_MAX), xp.float32(1)).astype(xp.float32)
    inv = xp.where(nonzero, xp.float32(E4M3_MAX) / xp.where(nonzero, amax, 1), xp.float32(1)).astype(xp.float32)
    idx = xp.arange(s) // rows
    inv_rows = xp.transpose(inv[:, :, idx], (0, 2, 1))[..., None]     # (b, s, h, 1)
    return round_e4m3(x * inv_rows), scales


# ---- the GPU quantizer ---------------------------------------------------------------------------

def _check_block(block: Any) -> int | None:
    if block is None:
        return None
    if isinstance(block, bool) or not isinstance(block, (int, np.integer)) or block < MIN_SCALE_BLOCK \
            or block & (block - 1):
        raise InputError(f"block: expected None (one scale per tensor) or a power of two >= {MIN_SCALE_BLOCK}, "
                         f"got {block!r}")
    return int(block)


def _source() -> str:
    from ..runtime.build import header_digest
    return f'#include "flashkit/fp8_quantize.cuh"\n// flashkit headers sha256 {header_digest()}\n'


def quantize_options(dtype_code: int, head_dim: int, hadamard: bool, align: int = MAX_VECTOR_BYTES) -> tuple:
    """NVRTC options of the quantizer: input dtype, head dim, Hadamard, block size, and `align`, a
    power of two <= 16 dividing the input's address and strides in bytes (the widest safe load)."""
    from ..runtime.build import INCLUDE_DIR
    return ("-std=c++17", f"-I{INCLUDE_DIR}", f"-DFLASHKIT_DTYPE={dtype_code}", f"-DFLASHKIT_HEAD_DIM={head_dim}",
            f"-DFLASHKIT_HADAMARD={int(hadamard)}", f"-DFLASHKIT_QUANT_THREADS={QUANT_THREADS}",
            f"-DFLASHKIT_ALIGN={align}")


def alignment(pointer: int, byte_strides) -> int:
    """The largest power of two <= 16 dividing the address and every stride (in bytes)."""
    g = MAX_VECTOR_BYTES
    for n in (pointer, *byte_strides):
        while n % g:
            g //= 2
    return g


@lru_cache(maxsize=None)
def _quantize_kernel(dtype_code: int, head_dim: int, hadamard: bool, align: int, device: int):
    from ..runtime.device import cupy_module
    module = cupy_module().RawModule(code=_source(), options=quantize_options(dtype_code, head_dim, hadamard, align))
    return module.get_function("flashkit_fp8_quantize")


@lru_cache(maxsize=None)
def _signs(head_dim: int, seed: int | None, device: int):
    """The Hadamard signs on the device (seed None: a placeholder the kernel never reads), made once."""
    from ..runtime.device import cupy_module
    return cupy_module().asarray(np.ones(1, dtype=np.float32) if seed is None else random_signs(head_dim, seed))


def quantize_fp8(x: Any, block: int | None = DEFAULT_BLOCK, hadamard: bool = False, seed: int = 0,
                 name: str = "x"):
    """(e4m3 bits as a contiguous uint8 CuPy array, float32 scales (batch, heads, blocks)) of x.

    block: rows per scale (a power of two >= 64), or None for one scale for the whole tensor (then
    scales has shape (batch, heads, 1), every entry equal). hadamard: rotate each row by the random-sign
    Walsh-Hadamard transform of `seed` first (power-of-two head_dim; use one seed for q and k).
    """
    from ..call.arrays import describe, to_cupy
    from ..call.dtypes import BY_NAME, dtype_of_storage
    from ..call.validate import check_on_gpu
    from ..runtime.device import cupy_module, device_info
    meta = describe(x, name)
    check_on_gpu(meta)
    dt = None if meta.fp8 else dtype_of_storage(meta.dtype)
    if dt is None or dt.name not in INPUT_DTYPES:
        got = "float8_e4m3 (already quantized)" if meta.fp8 else str(meta.dtype)
        raise InputError(f"{name}: expected float16, bfloat16 or float32 to quantize, got {got}")
    if len(meta.shape) != 4 or 0 in meta.shape:
        raise InputError(f"{name}: expected 4 non-empty dims (batch, seqlen, heads, head_dim), got {meta.shape}")
    b, s, h, d = meta.shape
    if d > MAX_HEAD_DIM:
        raise InputError(f"{name}: head_dim must be <= {MAX_HEAD_DIM}, got {d}")
    if not isinstance(hadamard, (bool, np.bool_)):
        raise InputError(f"hadamard: expected True or False, got {hadamard!r}")
    if hadamard and d & (d - 1):
        raise InputError(f"hadamard: {name}'s head_dim must be a power of two, got {d}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise InputError(f"seed: expected a non-negative int, got {seed!r}")
    block = _check_block(block)
    info = device_info()
    if info.cc < FP8_MIN_CC:
        raise UnsupportedError(f"quantize_fp8: e4m3 conversion needs compute capability >= 8.9, "
                               f"this GPU is {info.cc[0]}.{info.cc[1]}")
    cupy = cupy_module()
    xc = to_cupy(x, name)
    if xc.strides[-1] != xc.itemsize:
        xc = cupy.ascontiguousarray(xc)
    item = xc.itemsize
    strides = [np.int64(st // item) for st in xc.strides[:3]]
    out = cupy.empty((b, s, h, d), dtype=cupy.uint8)
    rows = DEFAULT_BLOCK if block is None else block
    n = -(-s // rows)
    scales = cupy.empty((b, h, n), dtype=cupy.float32)
    signs = _signs(d, int(seed) if hadamard else None, info.index)
    align = alignment(xc.data.ptr, xc.strides[:3])
    kernel = _quantize_kernel(BY_NAME[dt.name].code, d, bool(hadamard), align, info.index)

    def launch(mode: int) -> None:
        kernel((n, h, b), (QUANT_THREADS,), (xc, *strides, out, scales, signs, np.int32(s), np.int32(h),
                                            np.int32(rows), np.int32(mode)))

    if block is None:   # per tensor: block amax, the global max, then quantize with it
        launch(MODE_AMAX)
        scales[...] = scales.max()
        launch(MODE_GIVEN_AMAX)
        scales = cupy.ascontiguousarray(scales[:, :, :1])
    else:
        launch(MODE_FUSED)
    return out, scales


def quantize_qkv(q: Any, k: Any, v: Any, block: int | None = DEFAULT_BLOCK, hadamard: bool = False,
                 seed: int = 0):
    """quantize_fp8 of q, k and v: one Hadamard rotation (same seed) for q and k, none for v."""
    return (quantize_fp8(q, block, hadamard, seed, "q"), quantize_fp8(k, block, hadamard, seed, "k"),
            quantize_fp8(v, block, False, seed, "v"))


# ---- kernel fields -------------------------------------------------------------------------------

def scale_block_rows(seqlen_q: int, q_blocks: int, seqlen_k: int, k_blocks: int) -> int | None:
    """The smallest power of two b >= 64 with ceil(seqlen_q / b) == q_blocks or q_blocks == 1 (and
    likewise for k); None when there is none. A tensor with one scale block is expanded to b later."""
    b = MIN_SCALE_BLOCK
    limit = max(seqlen_q, seqlen_k, MIN_SCALE_BLOCK)
    while b <= 2 * limit:
        if all(n == 1 or -(-s // b) == n for s, n in ((seqlen_q, q_blocks), (seqlen_k, k_blocks))):
            return b
        b *= 2
    return None


def _check_scales(x: Any, name: str, batch: int, heads: int, head_label: str) -> tuple[int, ...]:
    """The shape of a scales argument, after checking its metadata (no device access)."""
    from ..call.arrays import describe
    meta = describe(x, name)
    if not meta.on_gpu:
        raise InputError(f"{name}: expected a CUDA float32 array, got {meta.kind} on the CPU")
    if meta.dtype != np.float32 or meta.fp8:
        raise InputError(f"{name}: expected float32 scales, got {'float8_e4m3' if meta.fp8 else meta.dtype}")
    if len(meta.shape) != 3 or meta.shape[:2] != (batch, heads) or meta.shape[2] < 1:
        raise InputError(f"{name}: expected shape (batch, {head_label}, blocks) = ({batch}, {heads}, n), "
                         f"got {meta.shape}")
    return meta.shape


def scale_fields(problem, q_scale: Any, k_scale: Any, v_scale: Any, keep: list) -> dict[str, int]:
    """Params fields q_scale/k_scale/v_scale (pointers), scale_block_rows, q_/k_scale_blocks.

    Validates the scales (InputError names the argument) and appends the device arrays to `keep`.
    """
    from ..call.arrays import to_cupy
    from ..runtime.device import cupy_module
    p = problem
    q_shape = _check_scales(q_scale, "q_scale", p.batch, p.heads, "heads")
    k_shape = _check_scales(k_scale, "k_scale", p.batch, p.kv_heads, "kv_heads")
    v_shape = _check_scales(v_scale, "v_scale", p.batch, p.kv_heads, "kv_heads")
    if v_shape != k_shape:
        raise InputError(f"v_scale: expected the shape of k_scale {k_shape}, got {v_shape}")
    block = scale_block_rows(p.seqlen_q, q_shape[2], p.seqlen_k, k_shape[2])
    if block is None:
        raise InputError(f"q_scale, k_scale: {q_shape[2]} and {k_shape[2]} scale blocks for seqlens "
                         f"{p.seqlen_q} and {p.seqlen_k} fit no common block of rows (a power of two "
                         f">= {MIN_SCALE_BLOCK}: blocks = ceil(seqlen / block), or 1 per tensor)")
    cupy = cupy_module()
    qs, ks, vs = (cupy.ascontiguousarray(to_cupy(x, n))
                  for x, n in ((q_scale, "q_scale"), (k_scale, "k_scale"), (v_scale, "v_scale")))

    def expand(a, seqlen):   # one block for the whole sequence -> one per `block` rows
        n = -(-seqlen // block)
        return cupy.ascontiguousarray(cupy.broadcast_to(a, a.shape[:2] + (n,))) if a.shape[2] != n else a

    qs, ks, vs = expand(qs, p.seqlen_q), expand(ks, p.seqlen_k), expand(vs, p.seqlen_k)
    keep.extend((qs, ks, vs))
    return {"q_scale": qs.data.ptr, "k_scale": ks.data.ptr, "v_scale": vs.data.ptr,
            "scale_block_rows": block, "q_scale_blocks": qs.shape[2], "k_scale_blocks": ks.shape[2]}


__all__ = ["quantize_fp8", "quantize_qkv", "scale_fields", "dequantize_fp8", "round_e4m3", "decode_e4m3",
           "hadamard_rotation", "random_signs", "quantize_reference", "E4M3_MAX", "MIN_SCALE_BLOCK",
           "DEFAULT_BLOCK"]
