"""flashkit.torch.attention's calls with a block mask or a drop-in functor (block_mask=, mod=, mod_args=):
differentiable through flashkit.attention_backward's lists.

A flashkit.BlockMask, a functor's name with its mod_args (torch tensors or scalars) or a flashkit.ModMask are
Python objects, which torch.library's op schemas cannot carry, so these calls run as one torch.autograd.Function
(eager; under torch.compile a graph break, torch.compiler.disable). Its launches are flashkit.attention's and
attention_backward's, on torch's current stream and through torch's caching allocator, as the custom ops' are.
A functor with a score_mod needs its derivative (score_mod_grad) for a gradient: without one, a call that would
need its gradient raises UnsupportedError before the forward runs (under torch.no_grad it runs).
"""

from __future__ import annotations

from typing import Any

import torch

from .api import attention as _attention
from .backward import attention_backward as _attention_backward
from .torch_views import _as_torch, _on_torch_stream_and_allocator, cupy_views, tensor_view


def wants_gradient(*tensors: torch.Tensor) -> bool:
    """Whether autograd will ask for a gradient of one of tensors."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def check_score_mod_gradient(mod: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """UnsupportedError before the forward when a gradient would flow through a score_mod without its derivative."""
    from .features.mod_mask import ModMask
    from .registry import discover_kernels
    name = mod.mod if type(mod) is ModMask else mod
    if type(name) is not str or not wants_gradient(q, k, v):
        return
    from .features.functors import check_gradient
    spec = discover_kernels().mods.get(name)
    if spec is not None:
        check_gradient(spec, "; run it under torch.no_grad() or on tensors that need no gradient")


class _MaskedAttention(torch.autograd.Function):
    """out of flashkit.attention with a block mask or a functor; the backward through attention_backward with the
    same masks. apply(q, k, v, deterministic, call) with call: the keywords both take (torch tensors among them)."""

    @staticmethod
    def forward(ctx, q, k, v, deterministic: bool, call: dict):
        with _on_torch_stream_and_allocator():
            views = cupy_views((q.detach(), k.detach(), v.detach()))
            kw = _device_keywords(call)
            out, lse = _attention(*views, return_lse=True, **kw)
            ctx.kept, ctx.kw = views + (out, lse), kw   # the backward reuses the views (and holds them)
            ctx.deterministic = deterministic
            out_t = _as_torch(out)
        ctx.save_for_backward(q, k, v)   # autograd's in-place checks on the inputs
        ctx.set_materialize_grads(False)
        return out_t

    @staticmethod
    def backward(ctx, dout):
        if dout is None:   # out took no part in what is differentiated
            return None, None, None, None, None
        ctx.saved_tensors   # raises if an input was modified in place since the forward
        if dout.stride(-1) != 1:
            dout = dout.contiguous()
        with _on_torch_stream_and_allocator():
            grads = _attention_backward(*cupy_views((dout.detach(),)), *ctx.kept, deterministic=ctx.deterministic,
                                        **ctx.kw)
            return (*(_as_torch(g) for g in grads), None, None)


def _device_keywords(call: dict) -> dict:
    """call with torch tensors (the slopes, mod_args' arrays) as CuPy views (under torch's stream and allocator)."""
    kw = dict(call, alibi_slopes=tensor_view(call.get("alibi_slopes")))
    if isinstance(kw.get("mod_args"), dict):
        kw["mod_args"] = {name: tensor_view(value) for name, value in kw["mod_args"].items()}
    return kw


@torch.compiler.disable
def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, deterministic: bool = False,
                     **call) -> torch.Tensor:
    """flashkit.attention(q, k, v, **call) with call's block_mask / mod / mod_args, differentiable (eager; the
    backward deterministic as asked)."""
    check_score_mod_gradient(call.get("mod"), q, k, v)
    return _MaskedAttention.apply(q, k, v, deterministic, call)


__all__ = ["masked_attention"]
