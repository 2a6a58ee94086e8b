"""KV caches (flash-attn's flash_attn_with_kvcache): checks on every argument, the append of new tokens,
and the parameter fields of the decode kernel.

Layouts (vLLM / FlashInfer): a contiguous cache is (batch, seqlen_cache, kv_heads, head_dim); a paged one is
(num_pages, page_size, kv_heads, head_dim) with block_table (batch, max_pages) int32, sequence b's key j in
row j % page_size of page block_table[b, j // page_size]. cache_seqlens (batch,) int32 counts each sequence's
keys before k_new / v_new (batch, seqlen_new, kv_heads, head_dim) are written after them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..call.arrays import ArrayMeta, describe, to_cupy
from ..call.dtypes import dtype_of_storage
from ..call.validate import Problem, check_on_gpu, check_scale
from ..errors import InputError

RANK = 4
PAGE_MIN, PAGE_MAX, PAGE_MULTIPLE = 16, 256, 16   # a page holds whole 16-key tiles of the decode kernel
KV_DTYPES = ("float16", "bfloat16")
ALIGN_ELEMS = 8                                   # 16 bytes of a 16-bit type


@dataclass(frozen=True)
class KvCacheCall:
    """A checked KV-cache call: its Problem (seqlen_k = the cache's capacity) and the cache geometry."""

    problem: Problem
    paged: bool
    page_size: int          # 0 when not paged
    num_blocks: int         # pages (paged) or sequences (contiguous)
    seqlen_new: int         # 0 without k_new / v_new


def _four_d(m: ArrayMeta, layout: str) -> None:
    check_on_gpu(m)
    if len(m.shape) != RANK:
        raise InputError(f"{m.name}: expected {RANK} dims {layout}, got shape {m.shape}")
    if m.strides[-1] != 1 and m.shape[-1] != 1:
        raise InputError(f"{m.name}: the last (head_dim) dimension must be contiguous, got strides {m.strides}")


def _int32_vector(m: ArrayMeta, shape: tuple[int, ...]) -> None:
    check_on_gpu(m)
    if m.dtype != np.int32:
        raise InputError(f"{m.name}: expected dtype int32, got {m.dtype}")
    if tuple(m.shape) != shape:
        raise InputError(f"{m.name}: expected shape {shape}, got {tuple(m.shape)}")
    if m.strides[-1] != 1 and m.shape[-1] > 1:
        raise InputError(f"{m.name}: expected a contiguous last dimension, got strides {m.strides}")


def validate_kvcache(q: ArrayMeta, k_cache: ArrayMeta, v_cache: ArrayMeta, cache_seqlens: ArrayMeta | None,
                     block_table: ArrayMeta | None, k_new: ArrayMeta | None, v_new: ArrayMeta | None,
                     softmax_scale: float | None) -> KvCacheCall:
    """Every metadata check of a KV-cache call; InputError names the argument and what was expected."""
    paged = block_table is not None
    cache_layout = "(num_pages, page_size, kv_heads, head_dim)" if paged else "(batch, seqlen_cache, kv_heads, head_dim)"
    _four_d(q, "(batch, seqlen_q, heads, head_dim)")
    _four_d(k_cache, cache_layout)
    _four_d(v_cache, cache_layout)
    qt = dtype_of_storage(q.dtype)
    if q.fp8 or qt is None or qt.name not in KV_DTYPES:
        raise InputError(f"q: dtype {q.dtype} is not supported; expected float16 or bfloat16")
    for m in (k_cache, v_cache):
        if m.dtype != q.dtype:
            raise InputError(f"{m.name}: dtype must match q's ({q.dtype}), got {m.dtype}")
    if k_cache.shape != v_cache.shape:
        raise InputError(f"v_cache: expected the shape of k_cache {k_cache.shape}, got {v_cache.shape}")
    b, sq, h, d = q.shape
    if 0 in q.shape:
        raise InputError(f"q: every dimension must be >= 1, got shape {q.shape}")
    nb, rows, hk, dk = k_cache.shape
    if dk != d:
        raise InputError(f"k_cache: head_dim must match q's ({d}), got {dk}")
    if hk < 1 or h % hk:
        raise InputError(f"k_cache: kv heads ({hk}) must divide q's heads ({h})")
    for m in (k_cache, v_cache):
        if any(s % ALIGN_ELEMS for s in m.strides[:-1]):
            raise InputError(f"{m.name}: strides {m.strides} must be multiples of {ALIGN_ELEMS} elements (16 bytes)")
    if paged:
        check_on_gpu(block_table)
        if block_table.dtype != np.int32:
            raise InputError(f"block_table: expected dtype int32, got {block_table.dtype}")
        if len(block_table.shape) != 2 or block_table.shape[0] != b or block_table.shape[1] < 1:
            raise InputError(f"block_table: expected shape (batch={b}, max_pages >= 1), got {tuple(block_table.shape)}")
        if block_table.strides[-1] != 1 and block_table.shape[1] > 1:
            raise InputError(f"block_table: expected a contiguous last dimension, got strides {block_table.strides}")
        if not (PAGE_MIN <= rows <= PAGE_MAX and rows % PAGE_MULTIPLE == 0):
            raise InputError(f"k_cache: page_size (dim 1) must be a multiple of {PAGE_MULTIPLE} from {PAGE_MIN} to "
                             f"{PAGE_MAX}, got {rows}")
        capacity = block_table.shape[1] * rows
    else:
        if nb != b:
            raise InputError(f"k_cache: batch must match q's ({b}), got {nb} (pass block_table for a paged cache)")
        capacity = rows
    if cache_seqlens is not None:
        _int32_vector(cache_seqlens, (b,))
    if (k_new is None) != (v_new is None):
        raise InputError("k_new, v_new: pass both or neither")
    seqlen_new = 0
    if k_new is not None:
        for m in (k_new, v_new):
            _four_d(m, "(batch, seqlen_new, kv_heads, head_dim)")
            if m.dtype != q.dtype:
                raise InputError(f"{m.name}: dtype must match q's ({q.dtype}), got {m.dtype}")
            if m.shape[0] != b or m.shape[2] != hk or m.shape[3] != d or m.shape[1] < 1:
                raise InputError(f"{m.name}: expected shape (batch={b}, seqlen_new >= 1, kv_heads={hk}, "
                                 f"head_dim={d}), got {tuple(m.shape)}")
        if k_new.shape != v_new.shape:
            raise InputError(f"v_new: expected the shape of k_new {k_new.shape}, got {v_new.shape}")
        seqlen_new = k_new.shape[1]
        if seqlen_new > capacity:
            raise InputError(f"k_new: seqlen_new={seqlen_new} exceeds the cache's capacity of {capacity} keys")
    devices = {m.device for m in (q, k_cache, v_cache, block_table, cache_seqlens, k_new, v_new)
               if m is not None and m.device is not None}
    if len(devices) > 1:
        raise InputError(f"q, k_cache, v_cache, ...: must be on one device, got devices {sorted(devices)}")
    problem = Problem(b, sq, capacity, h, hk, d, qt.name, check_scale(softmax_scale, d))
    return KvCacheCall(problem, paged, rows if paged else 0, nb, seqlen_new)


def seqlens_array(cache_seqlens: Any, batch: int, cupy):
    """cache_seqlens as a (batch,) int32 device array (an int broadcasts); metadata checked by the caller."""
    if isinstance(cache_seqlens, (int, np.integer)) and not isinstance(cache_seqlens, bool):
        return cupy.full((batch,), int(cache_seqlens), dtype=cupy.int32)
    return to_cupy(cache_seqlens, "cache_seqlens")


def describe_seqlens(cache_seqlens: Any) -> ArrayMeta | None:
    """Metadata of cache_seqlens, None for an int (checked by check_values)."""
    if cache_seqlens is None:
        raise InputError("cache_seqlens: required, (batch,) int32 or an int")
    if isinstance(cache_seqlens, bool) or (not isinstance(cache_seqlens, (int, np.integer))
                                           and not hasattr(cache_seqlens, "shape")):
        raise InputError(f"cache_seqlens: expected a (batch,) int32 CUDA array or an int, got {type(cache_seqlens).__name__}")
    if isinstance(cache_seqlens, (int, np.integer)):
        return None
    return describe(cache_seqlens, "cache_seqlens")


def check_values(call: KvCacheCall, seqlens, block_table, cupy) -> None:
    """The checks that read device data (one synchronizing copy): lengths within the cache, pages in range."""
    p = call.problem
    lens = seqlens.astype(cupy.int64)
    lo, hi = (int(x) for x in cupy.stack([lens.min(), lens.max()]).get())
    if lo < 0 or hi + call.seqlen_new > p.seqlen_k:
        raise InputError(f"cache_seqlens: values must lie in [0, {p.seqlen_k - call.seqlen_new}] (capacity "
                         f"{p.seqlen_k} keys{f' less seqlen_new={call.seqlen_new}' if call.seqlen_new else ''}), "
                         f"got min {lo}, max {hi}")
    if block_table is not None:
        used = cupy.arange(block_table.shape[1])[None, :] * call.page_size < (lens + call.seqlen_new)[:, None]
        bad = used & ((block_table < 0) | (block_table >= call.num_blocks))
        if bool(bad.any()):
            b, j = (int(x) for x in cupy.argwhere(bad)[0].get())
            raise InputError(f"block_table: entry [{b}, {j}] = {int(block_table[b, j])} is not a page index in "
                             f"[0, {call.num_blocks})")


def append_new(call: KvCacheCall, k_cache, v_cache, k_new, v_new, seqlens, block_table, cupy):
    """Write k_new / v_new at positions cache_seqlens[b] + j (through the pages); returns the new lengths."""
    if k_new is None:
        return seqlens
    b = call.problem.batch
    pos = seqlens[:, None] + cupy.arange(call.seqlen_new, dtype=cupy.int32)[None, :]   # (batch, seqlen_new)
    if block_table is None:
        block, row = cupy.broadcast_to(cupy.arange(b, dtype=cupy.int32)[:, None], pos.shape), pos
    else:
        block = cupy.take_along_axis(block_table, pos // call.page_size, axis=1)
        row = pos % call.page_size
    for cache, new in ((k_cache, k_new), (v_cache, v_new)):
        cache.view(cupy.uint16)[block, row] = new.view(cupy.uint16)
    return seqlens + call.seqlen_new


def kernel_fields(seqlens, block_table, call: KvCacheCall) -> dict:
    """The `cache` block of the parameter block (splits and row_blocks come from the launch's plan)."""
    return {"cache": {"seqlens": seqlens.data.ptr,
                      "block_table": block_table.data.ptr if block_table is not None else 0,
                      "table_batch_stride": block_table.strides[0] // block_table.itemsize if block_table is not None
                      else 0,
                      "page_size": call.page_size}}
