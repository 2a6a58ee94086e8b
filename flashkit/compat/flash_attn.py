"""flash-attn 2's Python API over flashkit: switch a model with one import.

    from flashkit.compat.flash_attn import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache

Same signatures, layouts and return conventions as flash_attn.flash_attn_interface:
  - flash_attn_func and the packed forms are differentiable for torch tensors that need a gradient
    (flashkit.torch's custom op; `deterministic` selects the backward's deterministic mode);
  - return_attn_probs=True returns (out, softmax_lse, None): flash-attn returns S_dmask only when
    dropout_p > 0, and flashkit has no dropout, so the third item is None there too;
  - the varlen functions return out (total_q, heads, head_dim) and an LSE (heads, total_q); they are
    differentiable too (flashkit.torch's varlen custom op, attention_varlen_backward; `deterministic` as above);
  - flash_attn_with_kvcache writes k / v into the caches in place and returns out (and the LSE
    (batch, heads, seqlen_q) with return_softmax_lse=True); like flash-attn's, it has no backward.
Torch tensors in, torch tensors out (on torch's current stream and allocator); CuPy in, CuPy out.
Arguments flashkit cannot honour (dropout_p != 0, rotary_cos / rotary_sin, cache_batch_idx, cache_leftpad,
num_splits != 0, block_table with varlen, ALiBi with a KV cache)
raise one flashkit error naming the argument, before any launch.
"""

from __future__ import annotations

from typing import Any

from ..call.arrays import describe
from ..call.validate import check_flag
from ..errors import InputError
from . import args as _args
from . import backend as _backend

_NO_ROTARY = "flashkit applies no rotary embedding inside attention; rotate q and k before the call"


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                    alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """softmax(scale q k^T [masked]) v for q (batch, seqlen_q, heads, D), k and v (batch, seqlen_k, kv_heads, D).

    causal is bottom-right aligned; window_size=(left, right), softcap and alibi_slopes as flash-attn's.
    Returns out, or (out, softmax_lse (batch, heads, seqlen_q), None) with return_attn_probs=True.
    """
    _args.check_dropout(dropout_p)
    causal, deterministic = check_flag(causal, "causal"), check_flag(deterministic, "deterministic")
    probs = check_flag(return_attn_probs, "return_attn_probs")
    res = _backend.dense(q, k, v, causal=causal, softmax_scale=softmax_scale, window_size=_args.window(window_size),
                         softcap=_args.softcap(softcap), alibi_slopes=alibi_slopes, deterministic=deterministic,
                         return_lse=probs)
    return (res[0], res[1], None) if probs else res


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                              softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """flash_attn_func on qkv (batch, seqlen, 3, heads, D), read in place (strided views, no copy)."""
    _check_packed(qkv, "qkv", 5, 3)
    return flash_attn_func(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], dropout_p, softmax_scale, causal, window_size,
                           softcap, alibi_slopes, deterministic, return_attn_probs)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                             softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """flash_attn_func on q and kv (batch, seqlen_k, 2, kv_heads, D), read in place."""
    _check_packed(kv, "kv", 5, 2)
    return flash_attn_func(q, kv[:, :, 0], kv[:, :, 1], dropout_p, softmax_scale, causal, window_size, softcap,
                           alibi_slopes, deterministic, return_attn_probs)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None):
    """Packed sequences: q (total_q, heads, D), k and v (total_k, kv_heads, D), cu_seqlens int32 (batch + 1,).

    Differentiable for torch tensors that need a gradient (window / softcap / ALiBi included). Returns out
    (total_q, heads, D), or (out, softmax_lse (heads, total_q), None) with return_attn_probs=True.
    """
    _args.check_dropout(dropout_p)
    _args.refuse(block_table, "block_table", "flashkit's varlen path reads contiguous packed k and v; for a paged "
                 "cache use flash_attn_with_kvcache (queries of equal length per sequence)")
    causal, deterministic = check_flag(causal, "causal"), check_flag(deterministic, "deterministic")
    probs = check_flag(return_attn_probs, "return_attn_probs")
    res = _backend.varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, _args.as_int(max_seqlen_q, "max_seqlen_q"),
                          _args.as_int(max_seqlen_k, "max_seqlen_k"), causal=causal, softmax_scale=softmax_scale,
                          window_size=_args.window(window_size), softcap=_args.softcap(softcap),
                          alibi_slopes=alibi_slopes, deterministic=deterministic, return_lse=probs)
    return (res[0], res[1], None) if probs else res


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0, softmax_scale=None, causal=False,
                                     window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False):
    """flash_attn_varlen_func on qkv (total, 3, heads, D), read in place."""
    _check_packed(qkv, "qkv", 4, 3)
    return flash_attn_varlen_func(qkv[:, 0], qkv[:, 1], qkv[:, 2], cu_seqlens, cu_seqlens, max_seqlen, max_seqlen,
                                  dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                                  return_attn_probs)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                                    softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                                    alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """flash_attn_varlen_func on q and kv (total_k, 2, kv_heads, D), read in place."""
    _check_packed(kv, "kv", 4, 2)
    return flash_attn_varlen_func(q, kv[:, 0], kv[:, 1], cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                  dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                                  return_attn_probs)


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                            softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0, return_softmax_lse=False):
    """Decode against a KV cache: q (batch, seqlen_q, heads, D); caches (batch, seqlen_cache, kv_heads, D) or
    paged (num_blocks, page_block_size, kv_heads, D) with block_table (batch, max_blocks) int32.

    k / v (batch, seqlen_new, kv_heads, D), when given, are written into the caches at cache_seqlens first.
    cache_seqlens None means every cache is full (its whole capacity); it is needed with k / v.
    Returns out, or (out, softmax_lse (batch, heads, seqlen_q)) with return_softmax_lse=True.
    """
    _args.refuse(rotary_cos, "rotary_cos", _NO_ROTARY)
    _args.refuse(rotary_sin, "rotary_sin", _NO_ROTARY)
    check_flag(rotary_interleaved, "rotary_interleaved")
    _args.refuse(cache_batch_idx, "cache_batch_idx", "flashkit reads sequence b's cache at batch index b (or "
                 "through block_table); gather the caches, or pass a block_table, instead")
    _args.refuse(cache_leftpad, "cache_leftpad", "flashkit's caches start at position 0; shift left-padded caches "
                 "to the start")
    window, cap = _args.window(window_size), _args.softcap(softcap)
    _args.refuse(alibi_slopes, "alibi_slopes", "the KV-cache path has no ALiBi yet (its slope differs across the "
                 "query heads the decode kernel packs into one tile)")
    _args.check_num_splits(num_splits)
    causal, lse = check_flag(causal, "causal"), check_flag(return_softmax_lse, "return_softmax_lse")
    if cache_seqlens is None:
        if k is not None or v is not None:
            raise InputError("cache_seqlens: needed with k and v (where to write them in the caches)")
        cache_seqlens = _capacity(k_cache, block_table)
    return _backend.kvcache(q, k_cache, v_cache, cache_seqlens=cache_seqlens, block_table=block_table, k_new=k,
                            v_new=v, causal=causal, softmax_scale=softmax_scale, window_size=window, softcap=cap,
                            return_lse=lse)


def _capacity(k_cache: Any, block_table: Any) -> int:
    """Keys a full cache holds: its seqlen (dim 1), or max_blocks * page_block_size when paged."""
    shape = describe(k_cache, "k_cache").shape
    if len(shape) != 4:
        raise InputError(f"k_cache: expected 4 dims, got shape {shape}")
    if block_table is None:
        return int(shape[1])
    table = describe(block_table, "block_table").shape
    if len(table) != 2:
        raise InputError(f"block_table: expected shape (batch, max_blocks), got {table}")
    return int(table[1]) * int(shape[1])


def _check_packed(x: Any, name: str, rank: int, parts: int) -> None:
    shape = tuple(getattr(x, "shape", ()))
    axis = rank - 3   # the packing axis sits before (heads, head_dim)
    if len(shape) != rank or shape[axis] != parts:
        layout = ("(batch, seqlen, " if rank == 5 else "(total, ") + f"{parts}, heads, head_dim)"
        raise InputError(f"{name}: expected {rank} dims {layout}, got shape {shape}")


__all__ = ["flash_attn_func", "flash_attn_qkvpacked_func", "flash_attn_kvpacked_func", "flash_attn_varlen_func",
           "flash_attn_varlen_qkvpacked_func", "flash_attn_varlen_kvpacked_func", "flash_attn_with_kvcache"]
