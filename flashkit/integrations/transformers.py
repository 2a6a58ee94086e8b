"""Hugging Face transformers: `register()` adds "flashkit" to transformers' attention implementations.

    import flashkit.integrations.transformers as fk_hf
    fk_hf.register()
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="flashkit")

transformers hands the attention (batch, heads, seqlen, head_dim) tensors; flashkit reads them through
transpose(1, 2) views, (batch, seqlen, heads, head_dim) with a contiguous last dim, with no copy. scaling,
sliding_window, softcap, is_causal and GQA (fewer key/value heads) are honoured. Masks, as transformers'
flash_attention_2 builds them (a 2D padding mask, or None), are classified exactly (padding.py):
  - none, or right padding under causal attention: the plain call, differentiable (training works);
  - left padding, holes, non-causal padding, packed sequences (position_ids restarting, or cu_seq_lens_*):
    the tokens are packed and run through flashkit's varlen path, differentiable too (training works,
    attention_varlen_backward); sliding_window and softcap train on either path (the backward has both);
  - anything else (a custom 4D mask that is no padding pattern, mask functions flash_attention_2 would
    ignore): UnsupportedError. Never a silently wrong result.
"""

from __future__ import annotations

import os
import weakref
from typing import Any, Callable

from ..compat import backend
from ..errors import UnsupportedError
from .padding import MaskPlan, padding_of_4d, plan_padding

NAME = "flashkit"
# mask functions flash_attention_2 silently drops (a union with another mask, bidirectional blocks, chunks):
# flashkit refuses them rather than compute another mask
UNSUPPORTED_MASK_PARTS = ("or_masks", "blockwise_overlay", "chunked_overlay")
DETERMINISTIC_ENV = "FLASH_ATTENTION_DETERMINISTIC"   # transformers' switch for flash-attn's deterministic backward


def register(name: str = NAME) -> None:
    """Register flashkit's attention (and its mask function, where transformers has a mask interface)."""
    from transformers import AttentionInterface
    AttentionInterface.register(name, attention_forward)
    _route_flash_imports(name)
    try:
        from transformers.masking_utils import AttentionMaskInterface
    except ImportError:   # older transformers build the 2D padding mask themselves
        return
    AttentionMaskInterface.register(name, mask_function)


def _route_flash_imports(name: str) -> None:
    """transformers treats every implementation whose name holds "flash" as a flash-attn flavour and, when a
    model is built, imports its flash-attn functions (modeling_flash_attention_utils._lazy_imports), looking
    for a hub kernel of that name otherwise. For `name`, hand it flashkit.compat.flash_attn's functions
    instead (and transformers' own pad / unpad helpers); every other name goes the usual way."""
    try:
        import transformers.modeling_flash_attention_utils as fa_utils
        from transformers.utils.generic import is_flash_attention_requested
    except ImportError:
        return
    if not is_flash_attention_requested(requested_attention_implementation=name):
        return
    lazy = getattr(fa_utils, "_lazy_imports", None)
    if lazy is None or name in getattr(lazy, "flashkit_names", ()):
        return

    def lazy_imports(implementation, *args, **kwargs):
        if fa_utils.split_attention_implementation(implementation)[1] in routed.flashkit_names:
            from ..compat import flash_attn as fa
            return (fa.flash_attn_func, fa.flash_attn_varlen_func, fa.flash_attn_with_kvcache, fa_utils._pad_input,
                    fa_utils._unpad_input)
        return lazy(implementation, *args, **kwargs)

    routed = lazy_imports
    routed.flashkit_names = set(getattr(lazy, "flashkit_names", ())) | {name}
    fa_utils._lazy_imports = routed


def mask_function(batch_size: int, q_length: int, kv_length: int, q_offset: int = 0, kv_offset: int = 0,
                  mask_function: Callable | None = None, attention_mask: Any = None, **kwargs):
    """flash_attention_2's mask (the 2D padding mask, None when there is no padding), refusing the mask
    functions it would drop."""
    from transformers.masking_utils import flash_attention_mask
    if kwargs.get("use_vmap") or (mask_function is not None and
                                  _mask_parts(mask_function) & set(UNSUPPORTED_MASK_PARTS)):
        raise UnsupportedError("attention_mask: this model combines the causal mask with another mask function "
                               "(or_mask_function / and_mask_function / blocks / chunks), which flashkit cannot "
                               "express; use attn_implementation='sdpa' for it")
    return flash_attention_mask(batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
                                kv_offset=kv_offset, mask_function=mask_function, attention_mask=attention_mask,
                                **kwargs)


def _mask_parts(fn: Callable) -> set[str]:
    """The factories a composed transformers mask function was built from (their qualified names' heads)."""
    seen, parts, todo = set(), set(), [fn]
    while todo:
        f = todo.pop()
        if id(f) in seen or not callable(f):
            continue
        seen.add(id(f))
        parts.add(getattr(f, "__qualname__", "").split(".")[0])
        for cell in getattr(f, "__closure__", None) or ():
            try:
                value = cell.cell_contents
            except ValueError:
                continue
            todo.extend(value if isinstance(value, (tuple, list)) else [value])
    return parts


def attention_forward(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, dropout: float = 0.0,
                      scaling: float | None = None, sliding_window: int | None = None, softcap: float | None = None,
                      is_causal: bool | None = None, s_aux: Any = None, **kwargs) -> tuple[Any, None]:
    """transformers' attention interface: (batch, heads, seqlen, head_dim) in (value's head dim may be below the
    others'), ((batch, seqlen, heads, value's head dim), None) out."""
    if dropout:
        raise UnsupportedError(f"dropout: flashkit has no attention dropout, got {dropout}; set the model's "
                               "attention_dropout to 0")
    if s_aux is not None:
        raise UnsupportedError("s_aux: flashkit has no attention sinks")
    batch, _, q_len, _ = query.shape
    kv_len = key.shape[2]
    # views, no copy; value may have a head dim of its own (MLA: 128 under 192), which the output takes
    q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
    out_heads = (q.shape[2], v.shape[-1])   # the output's (heads, head_dim_v)
    causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))
    window = (sliding_window - 1, sliding_window - 1) if sliding_window is not None and kv_len > sliding_window else None
    kw = dict(softmax_scale=scaling, window_size=window, softcap=float(softcap) if softcap else 0.0,
              deterministic=_deterministic(kwargs))

    if attention_mask is not None:
        plan = _cached(attention_mask, ("mask", batch, q_len, kv_len, causal, window),
                       lambda: _mask_plan(attention_mask, batch, q_len, kv_len, causal, window))
        if not plan.ragged:
            out = backend.dense(q, k[:, :plan.keys], v[:, :plan.keys], causal=plan.causal, **kw)
        else:   # varlen (differentiable: the gather and the scatter back are torch indexing)
            out = _ragged(q, k[:, :plan.keys], v[:, :plan.keys], plan, attention_mask, **kw)
    elif (packed := _packed(kwargs, batch, q_len, kv_len)) is not None:
        cu_q, cu_k, max_q, max_k = packed
        flat = [x.reshape(-1, x.shape[2], x.shape[3]) for x in (q, k, v)]
        out = backend.varlen(*flat, cu_q, cu_k, max_q, max_k, causal=causal, **kw).view(batch, -1, *out_heads)
    else:
        out = backend.dense(q, k, v, causal=causal, **kw)
    return out, None


def _deterministic(kwargs: dict) -> bool:
    flag = kwargs.get("deterministic")
    return bool(flag) if flag is not None else os.environ.get(DETERMINISTIC_ENV, "0") == "1"


def _mask_plan(mask: Any, batch: int, q_len: int, kv_len: int, causal: bool, window) -> MaskPlan:
    if len(mask.shape) == 4:
        mask, causal = padding_of_4d(mask, batch, q_len, kv_len, causal, window)
    return plan_padding(mask, q_len, kv_len, causal, window)


def _ragged(q, k, v, plan: MaskPlan, mask: Any, **kw):
    """Pack the tokens (one gather each), run varlen, scatter back into zeros (batch, q_len, heads, D)."""
    import torch
    gather = _cached(mask, ("gather", plan.keys, q.shape[1]), lambda: _gather_plan(plan))
    (qb, qs), (kb, ks), cu_q, cu_k, max_q, max_k = gather
    out = backend.varlen(q[qb, qs], k[kb, ks], v[kb, ks], cu_q, cu_k, max_q, max_k, causal=plan.causal, **kw)
    full = torch.zeros(q.shape[:2] + out.shape[1:], dtype=out.dtype, device=out.device)
    full[qb, qs] = out
    return full


def _gather_plan(plan: MaskPlan):
    """(batch, position) index pairs of the packed queries and keys, their int32 offsets and longest lengths."""
    import torch
    import torch.nn.functional as F

    def one(m):
        m = m.to(torch.bool)
        lengths = m.sum(1, dtype=torch.int32)
        cu = F.pad(torch.cumsum(lengths, 0, dtype=torch.int32), (1, 0))
        idx = m.nonzero(as_tuple=True)
        return idx, cu, int(lengths.max().item())

    (qi, cu_q, max_q), (ki, cu_k, max_k) = one(plan.query_mask), one(plan.key_mask)
    return qi, ki, cu_q, cu_k, max_q, max_k


def _packed(kwargs: dict, batch: int, q_len: int, kv_len: int):
    """(cu_q, cu_k, max_q, max_k) of packed sequences with no mask: transformers' cu_seq_lens_* / max_length_*
    kwargs, or position_ids that restart inside a row (masking_utils' rule: a step other than +1); else None."""
    cu = [kwargs.get(n) for n in ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")]
    if all(x is not None for x in cu):
        import torch
        return (cu[0].to(torch.int32), cu[1].to(torch.int32), int(cu[2]), int(cu[3]))
    pos = kwargs.get("position_ids")
    if pos is None or q_len != kv_len or q_len < 2 or pos.ndim != 2 or pos.shape[-1] != q_len \
            or pos.shape[0] not in (1, batch):
        return None
    return _cached(pos, ("packed", batch), lambda: _restarts(pos, batch))


def _restarts(pos: Any, batch: int):
    import torch
    pos = pos.expand(batch, -1)
    start = torch.ones_like(pos, dtype=torch.bool)
    start[:, 1:] = pos[:, 1:] - pos[:, :-1] != 1
    if not bool(start[:, 1:].any()):
        return None
    starts = start.flatten().nonzero().flatten().to(torch.int32)
    total = torch.tensor([pos.numel()], dtype=torch.int32, device=pos.device)
    cu = torch.cat([starts, total])
    longest = int((cu[1:] - cu[:-1]).max().item())
    return cu, cu, longest, longest


_CACHE: dict[str, tuple] = {}


def _cached(tensor: Any, key: tuple, compute: Callable):
    """compute() once per (tensor, key) while the tensor is alive and unchanged: every layer of a forward
    gets the same mask and position_ids, which need a synchronizing read to classify."""
    tag = key[0]
    ident = (id(tensor), getattr(tensor, "_version", None), key)
    hit = _CACHE.get(tag)
    if hit is not None and hit[0] == ident and hit[1]() is tensor:
        return hit[2]
    value = compute()
    try:
        _CACHE[tag] = (ident, weakref.ref(tensor), value)
    except TypeError:   # not weak-referenceable: no caching
        pass
    return value


__all__ = ["register", "attention_forward", "mask_function", "NAME"]
