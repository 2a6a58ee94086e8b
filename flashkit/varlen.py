"""attention_varlen: flash-attn's flash_attn_varlen_func layout on the flash kernels (fa3, fa2, causal).

Sequences of different lengths, packed back to back, in one launch: no padding, no loop. Every argument is
checked before anything is compiled or launched (features/varlen.py). A signature seen before (the arrays'
metadata, the longest lengths, flags and modifications) takes the call cache's path, as attention() does: only the
offsets' values are checked again (unless check_indices=False), then the launch at the call's addresses.
"""

from __future__ import annotations

from typing import Any

from .api import ALIBI_FIELDS, _aligned, _forward_key, _output, request_for, run
from .call.arrays import describe, to_cupy
from .call.validate import check_flag, check_variant
from .features.mods import launch_fields as mod_launch_fields
from .features.mods import mods_of
from .features.varlen import VARLEN_FIELDS, check_values, kernel_fields, offsets_pointers, packed_key, validate_varlen
from .registry import discover_kernels, select_kernel
from .registry.select import check_head_dim_v
from .runtime.call_cache import CALLS, CachedLaunch
from .runtime.device import cupy_module, device_info
from .runtime.launch import LaunchInputs


def attention_varlen(q: Any, k: Any, v: Any, cu_seqlens_q: Any, cu_seqlens_k: Any, max_seqlen_q: int,
                     max_seqlen_k: int, *, causal: bool = False, softmax_scale: float | None = None,
                     return_lse: bool = False, window_size: tuple[int, int] | None = None, softcap: float = 0.0,
                     alibi_slopes: Any = None, attention_chunk: int = 0, out: Any = None,
                     variant: str | None = None, check_indices: bool = True):
    """softmax(scale q_b k_b^T [masked]) v_b for every packed sequence b.

    q (total_q, heads, D), k and v (total_k, kv_heads, D), float16 or bfloat16; cu_seqlens_q / cu_seqlens_k
    int32 (batch + 1,) offsets of each sequence's first token (from 0, ending at the totals); max_seqlen_q /
    max_seqlen_k at least the longest sequence. Zero-length sequences are allowed. causal is bottom-right
    aligned per sequence (query i of a sequence sees keys j <= i + len_k - len_q), as are window_size and
    attention_chunk; softcap and alibi_slopes as in flashkit.attention. check_indices=False skips the check of
    the offsets' values (one synchronizing read of 2 (batch + 1) ints).

    v may have a head dim of its own (head_dim_v <= D, as in flashkit.attention); out is then (total_q, heads,
    head_dim_v).

    Returns out (total_q, heads, D) (and the float32 LSE, (heads, total_q), with return_lse=True).
    """
    causal, return_lse = check_flag(causal, "causal"), check_flag(return_lse, "return_lse")
    check_indices = check_flag(check_indices, "check_indices")
    key = _varlen_key(q, k, v, out, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, softmax_scale,
                      return_lse, window_size, softcap, alibi_slopes, attention_chunk, variant)
    if key is not None and (cached := CALLS.get(key)) is not None:   # this signature validated and selected before
        if check_indices:
            check_values(cached.call, cu_seqlens_q, cu_seqlens_k)
        return cached.launch(q, k, v, out, offsets_pointers(cu_seqlens_q, cu_seqlens_k, alibi_slopes))
    check_variant(variant)
    q_meta = describe(q, "q")
    call = validate_varlen(q_meta, describe(k, "k"), describe(v, "v"), describe(cu_seqlens_q, "cu_seqlens_q"),
                           describe(cu_seqlens_k, "cu_seqlens_k"), max_seqlen_q, max_seqlen_k, softmax_scale)
    problem = call.problem
    check_head_dim_v(problem.head_dim, problem.head_dim_v, discover_kernels().specs)
    mods = mods_of(problem, causal, window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes,
                   attention_chunk=attention_chunk, device=q_meta.device)
    req = request_for(problem, causal=causal, lse=return_lse, varlen=True, cc=device_info().cc,
                      **mods.request_flags())
    sel = select_kernel(req, discover_kernels().specs, variant)

    cupy = cupy_module()
    cu_q, cu_k = to_cupy(cu_seqlens_q, "cu_seqlens_q"), to_cupy(cu_seqlens_k, "cu_seqlens_k")
    if check_indices:
        check_values(call, cu_q, cu_k)
    out_arr = _output(out, problem, problem.dtype, cupy, (call.total_q, problem.heads, problem.head_dim_v))
    lse = cupy.empty((problem.heads, call.total_q), dtype=cupy.float32) if return_lse else None
    if call.total_q == 0 or call.total_k == 0 or problem.seqlen_q == 0:   # nothing to attend: O = 0, LSE = -inf
        out_arr.fill(0)
        if lse is not None:
            lse.fill(-cupy.inf)
        return (out_arr, lse) if return_lse else out_arr
    # The kernels see the packed tensors as a batch of one, (1, total, heads, D); Params.varlen splits it.
    qc, kc, vc = (_aligned(to_cupy(x, n))[None] for x, n in ((q, "q"), (k, "k"), (v, "v")))
    keep: list = []   # device arrays the launch reads, alive until it is queued
    extras = {**kernel_fields(cu_q, cu_k, call.total_q), **mod_launch_fields(mods, problem, alibi_slopes, keep)}
    variable = VARLEN_FIELDS + (ALIBI_FIELDS if mods.alibi else ())
    prepared = run(sel.chosen, problem, causal, LaunchInputs(qc, kc, vc, out_arr[None], lse, extras),
                   mods=mods.features + ("varlen",), variable=variable)
    # Cached where the launch read the call's own arrays: no aligned copy of q, k, v, no negated scale.
    if (key is not None and problem.softmax_scale > 0
            and all(a.data.ptr == b.data.ptr for a, b in ((qc, q), (kc, k), (vc, v)))):
        CALLS.put(key, _CachedVarlen(prepared, out_arr.shape, out_arr.dtype, lse.shape if return_lse else None,
                                     call))
    return (out_arr, lse) if return_lse else out_arr


class _CachedVarlen(CachedLaunch):
    """A cached signature of attention_varlen(): its checked call, against which a later call's offsets are
    checked (their values are not in the key)."""

    def __init__(self, prepared, out_shape: tuple, out_storage, lse_shape: tuple | None, call):
        super().__init__(prepared, out_shape, out_storage, lse_shape)
        self.call = call


def _varlen_key(q, k, v, out, cu_q, cu_k, max_seqlen_q, max_seqlen_k, causal, softmax_scale, return_lse,
                window_size, softcap, alibi_slopes, attention_chunk, variant) -> tuple | None:
    """The signature of an attention_varlen() call on CuPy arrays: api._forward_key's of the packed arrays with the
    offsets' signatures and the longest lengths (scalars with their types); None for the full path."""
    return packed_key("attention_varlen", cu_q, cu_k, max_seqlen_q, max_seqlen_k,
                      lambda: _forward_key(q, k, v, out, causal, softmax_scale, variant, return_lse, None, None,
                                           window_size, softcap, attention_chunk, alibi_slopes))
