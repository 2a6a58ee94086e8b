"""attention_with_kvcache: flash-attn's flash_attn_with_kvcache over the split-KV decode kernel.

Every argument is checked before anything is written or launched (features/kv_cache.py); k_new / v_new are
appended into the cache at cache_seqlens, then q attends the first cache_seqlens + seqlen_new keys of its
sequence (causal: bottom-right aligned to that length; so is window_size; softcap caps the scores, as in
flash-attn's flash_attn_with_kvcache).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .api import _aligned, _output, request_for, run
from .call.arrays import describe, to_cupy
from .call.validate import check_flag, check_variant
from .errors import InputError
from .features.kv_cache import (append_new, check_values, describe_seqlens, kernel_fields, seqlens_array,
                                validate_kvcache)
from .features.mods import launch_fields as mod_launch_fields
from .features.mods import mods_of
from .registry import discover_kernels, select_kernel
from .runtime.device import cupy_module, device_info
from .runtime.call_cache import (CALLS, UNKEYED, CachedLaunch, array_signature, arrays_signature, context_signature,
                                 window_signature)
from .runtime.launch import LaunchInputs, PreparedLaunch
from .runtime.params import merge_fields


def attention_with_kvcache(q: Any, k_cache: Any, v_cache: Any, *, cache_seqlens: Any, block_table: Any = None,
                           k_new: Any = None, v_new: Any = None, causal: bool = False,
                           softmax_scale: float | None = None, window_size: Any = None, softcap: float = 0.0,
                           return_lse: bool = False, out: Any = None, variant: str | None = None,
                           check_indices: bool = True):
    """softmax(scale q K^T) V over each sequence's cached keys (plus k_new / v_new, appended first).

    q (batch, seqlen_q, heads, D); caches (batch, seqlen_cache, kv_heads, D), or paged
    (num_pages, page_size, kv_heads, D) with block_table (batch, max_pages) int32; cache_seqlens (batch,)
    int32 or an int. window_size=(left, right) and softcap=c as in attention(), each sequence's window aligned
    to its own length. check_indices=False skips the value checks (one synchronizing read).
    Returns out (and the float32 LSE, (batch, heads, seqlen_q), with return_lse=True).
    """
    causal, return_lse = check_flag(causal, "causal"), check_flag(return_lse, "return_lse")
    check_indices = check_flag(check_indices, "check_indices")
    check_variant(variant)
    key = _kvcache_key(q, k_cache, v_cache, cache_seqlens, block_table, k_new, v_new, out, causal, return_lse,
                       softmax_scale, variant, window_size, softcap)
    if key is not None and (cached := CALLS.get(key)) is not None:   # this signature validated and selected before
        return cached(q, k_cache, v_cache, cache_seqlens, block_table, k_new, v_new, out, check_indices)
    seqlens_meta = describe_seqlens(cache_seqlens)
    call = validate_kvcache(
        describe(q, "q"), describe(k_cache, "k_cache"), describe(v_cache, "v_cache"), seqlens_meta,
        describe(block_table, "block_table") if block_table is not None else None,
        describe(k_new, "k_new") if k_new is not None else None,
        describe(v_new, "v_new") if v_new is not None else None, softmax_scale)
    problem = call.problem
    mods = mods_of(problem, causal, window_size=window_size, softcap=softcap)
    req = request_for(problem, causal=causal, lse=return_lse, kv_cache=True, cc=device_info().cc,
                      **mods.request_flags())
    sel = select_kernel(req, discover_kernels().specs, variant)

    cupy = cupy_module()
    kc, vc = to_cupy(k_cache, "k_cache"), to_cupy(v_cache, "v_cache")
    for arr, name in ((kc, "k_cache"), (vc, "v_cache")):
        if arr.data.ptr % 16:
            raise InputError(f"{name}: expected a 16-byte aligned base address")
    table = to_cupy(block_table, "block_table") if block_table is not None else None
    seqlens = seqlens_array(cache_seqlens, problem.batch, cupy)
    if check_indices:
        check_values(call, seqlens, table, cupy)
    kn = to_cupy(k_new, "k_new") if k_new is not None else None
    vn = to_cupy(v_new, "v_new") if v_new is not None else None
    lengths = append_new(call, kc, vc, kn, vn, seqlens, table, cupy)
    qc = _aligned(to_cupy(q, "q"))
    out_arr = _output(out, problem, problem.dtype, cupy)
    lse = cupy.empty((problem.batch, problem.heads, problem.seqlen_q), dtype=cupy.float32) if return_lse else None
    fields = merge_fields(kernel_fields(lengths, table, call), mod_launch_fields(mods, problem, None, []))
    prepared = run(sel.chosen, problem, causal, LaunchInputs(qc, kc, vc, out_arr, lse, fields), mods=mods.features,
                   variable=VARIABLE_FIELDS)
    if key is not None and qc is q and problem.softmax_scale > 0:   # no copy of q, no negation
        CALLS.put(key, _CachedKvCache(prepared, call, out_arr.shape, out_arr.dtype,
                                      lse.shape if return_lse else None, seqlens_meta is None))
    return (out_arr, lse) if return_lse else out_arr


VARIABLE_FIELDS = ("cache.seqlens", "cache.block_table")   # per call: the lengths array and the block table


class _CachedKvCache(CachedLaunch):
    """A cached signature of attention_with_kvcache(): the value checks (when asked), the append, then the
    launch with this call's lengths and block table."""

    def __init__(self, prepared: PreparedLaunch, call, out_shape: tuple, out_storage, lse_shape: tuple | None,
                 int_lengths: bool):
        super().__init__(prepared, out_shape, out_storage, lse_shape)
        self.call = call
        self.int_lengths = int_lengths   # cache_seqlens an int (the key tells the two kinds apart)

    def __call__(self, q, k_cache, v_cache, cache_seqlens, block_table, k_new, v_new, out, check_indices: bool):
        lengths = cache_seqlens   # the decode loop's case: a CuPy int32 array, read by the kernel as it is
        if check_indices or k_new is not None or self.int_lengths:
            cupy = cupy_module()
            seqlens = seqlens_array(cache_seqlens, self.call.problem.batch, cupy)
            if check_indices:
                check_values(self.call, seqlens, block_table, cupy)
            lengths = append_new(self.call, k_cache, v_cache, k_new, v_new, seqlens, block_table, cupy)
        return self.launch(q, k_cache, v_cache, out,
                           (lengths.data.ptr, block_table.data.ptr if block_table is not None else 0))


def _kvcache_key(q, k_cache, v_cache, cache_seqlens, block_table, k_new, v_new, out, causal, return_lse,
                 softmax_scale, variant, window_size, softcap) -> tuple | None:
    """The signature of an attention_with_kvcache() call of CuPy arrays (one flat tuple); None when it takes the
    full path."""
    if (seqlens := array_signature(cache_seqlens)) is None:
        if not isinstance(cache_seqlens, (int, np.integer)) or isinstance(cache_seqlens, (bool, np.bool_)):
            return None
        seqlens = ("int", type(cache_seqlens))   # the value is checked per call (check_values)
    arrays = arrays_signature(q, k_cache, v_cache, block_table, k_new, v_new, out)
    if arrays is None or arrays[0] is None or arrays[1] is None or arrays[2] is None:
        return None
    context = context_signature()
    if context is None:
        return None
    window = window_signature(window_size)
    if window is UNKEYED:
        return None
    return ("kvcache", arrays, seqlens, causal, return_lse, type(softmax_scale), softmax_scale, variant, window,
            type(softcap), softcap, context)


__all__ = ["attention_with_kvcache"]
