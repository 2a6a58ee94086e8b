"""The array-kind dispatch of the compat layers: torch tensors in, torch tensors out; anything else through
flashkit's CuPy API.

Torch tensors that need a gradient go through flashkit.torch's op pair (differentiable: the custom op under
torch.compile, its eager twin otherwise); otherwise flashkit's entry points run on torch's current stream with
torch's caching allocator, and their CuPy results come back as torch tensors through DLPack (zero copy).
"""

from __future__ import annotations

from typing import Any

from ..features.mods import given as given_mods


def is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch")


def needs_grad(*xs: Any) -> bool:
    """Autograd is on and some torch tensor among xs requires a gradient."""
    if not any(is_torch(x) for x in xs):
        return False
    import torch
    return torch.is_grad_enabled() and any(getattr(x, "requires_grad", False) for x in xs)


def _torch_call(fn, arrays: tuple, **kw):
    """fn(*arrays, **kw) on torch's stream and allocator; CuPy results as torch tensors."""
    from ..torch import _as_torch, _on_torch_stream_and_allocator, cupy_views
    arrays = tuple(a.detach() if is_torch(a) else a for a in arrays)   # DLPack refuses tensors that require grad
    names = tuple(n for n, x in kw.items() if is_torch(x))             # tensor keywords: slopes, lengths, tables
    with _on_torch_stream_and_allocator():   # results handed over on torch's stream (_as_torch)
        kw.update(zip(names, cupy_views(tuple(kw[n].detach() for n in names))))
        res = fn(*cupy_views(arrays), **kw)
        return tuple(_as_torch(r) for r in res) if isinstance(res, tuple) else _as_torch(res)


def dense(q: Any, k: Any, v: Any, *, causal: bool, softmax_scale: float | None, window_size=None,
          softcap: float = 0.0, alibi_slopes: Any = None, deterministic: bool = False, return_lse: bool = False):
    """flashkit.attention on (batch, seqlen, heads, head_dim) arrays; differentiable for torch tensors that
    need a gradient. Returns out, or (out, lse) with return_lse=True (lse (batch, heads, seqlen_q))."""
    from ..api import attention
    mods = given_mods(window_size, softcap, alibi_slopes)
    if not is_torch(q):
        return attention(q, k, v, causal=causal, softmax_scale=softmax_scale, return_lse=return_lse,
                         window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes)
    if not mods or needs_grad(q, k, v):   # the op pair: differentiable, and traceable under torch.compile
        from .. import torch as fk_torch   # defines torch.ops.flashkit.*
        out, lse = fk_torch.attention_with_lse(q, k, v, causal, softmax_scale, deterministic,
                                               *fk_torch.op_mod_args(window_size, softcap, alibi_slopes))
        return (out, lse) if return_lse else out
    return _torch_call(attention, (q, k, v), causal=causal, softmax_scale=softmax_scale, return_lse=return_lse,
                       window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes)


def varlen(q: Any, k: Any, v: Any, cu_seqlens_q: Any, cu_seqlens_k: Any, max_seqlen_q: int, max_seqlen_k: int, *,
           causal: bool, softmax_scale: float | None, window_size=None, softcap: float = 0.0,
           alibi_slopes: Any = None, deterministic: bool = False, return_lse: bool = False):
    """flashkit.attention_varlen on packed (total, heads, head_dim) arrays; differentiable for torch tensors that
    need a gradient (flashkit.torch's varlen custom op, modifications included).
    Returns out, or (out, lse) with return_lse=True (lse (heads, total_q))."""
    from ..varlen import attention_varlen
    if needs_grad(q, k, v):
        from .. import torch as fk_torch   # defines torch.ops.flashkit.*
        out, lse = fk_torch.attention_varlen_with_lse(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                                      max_seqlen_k, causal, softmax_scale, deterministic,
                                                      *fk_torch.op_mod_args(window_size, softcap, alibi_slopes))
        return (out, lse) if return_lse else out
    kw = dict(causal=causal, softmax_scale=softmax_scale, return_lse=return_lse, window_size=window_size,
              softcap=softcap, alibi_slopes=alibi_slopes)
    arrays = (q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    if not is_torch(q):
        return attention_varlen(*arrays, **kw)
    from .. import torch_direct   # an earlier layer's check of the same offsets holds
    return torch_direct.checking_offsets_once(
        lambda check: _torch_call(attention_varlen, arrays, check_indices=check, **kw),
        q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)


def kvcache(q: Any, k_cache: Any, v_cache: Any, *, cache_seqlens: Any, block_table: Any, k_new: Any, v_new: Any,
            causal: bool, softmax_scale: float | None, window_size: tuple[int, int] | None = None,
            softcap: float = 0.0, return_lse: bool = False):
    """flashkit.attention_with_kvcache; the caches are written in place (k_new, v_new appended). No gradient
    flows through it (flash-attn's flash_attn_with_kvcache has no backward either)."""
    from ..kvcache import attention_with_kvcache
    kw = dict(cache_seqlens=cache_seqlens, block_table=block_table, k_new=k_new, v_new=v_new, causal=causal,
              softmax_scale=softmax_scale, window_size=window_size, softcap=softcap, return_lse=return_lse)
    if is_torch(q):   # _torch_call detaches and views the tensor keywords (lengths, table, new tokens) too
        return _torch_call(attention_with_kvcache, (q, k_cache, v_cache), **kw)
    return attention_with_kvcache(q, k_cache, v_cache, **kw)
