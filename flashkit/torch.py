"""PyTorch adapter: `flashkit.torch.attention(q, k, v, **kw)` and `flashkit.torch.attention_varlen(...)`,
differentiable, as `torch.library` custom ops.

Two ops a layout, `flashkit::attention_fwd` -> (out, lse) and `flashkit::attention_bwd` -> (dq, dk, dv), and
`flashkit::attention_varlen_fwd` / `flashkit::attention_varlen_bwd` for packed sequences, each with a fake
(meta) implementation, and the forward's autograd formula registered on it, so that the call traces under
torch.compile (fullgraph) without a graph break. Eager calls run the same implementations through a
torch.autograd.Function instead (_EagerOps): a custom op's Python dispatch and its autograd wrapper cost
about 1 ms of host time a training call (forward and backward), more than the attention itself at 2k tokens.
Every launch runs on PyTorch's current CUDA stream, and outputs and workspaces come from PyTorch's caching
allocator.
Layout is flashkit's: (batch, seqlen, heads, head_dim) tensors, k and v with kv_heads dividing heads; varlen:
(total_tokens, heads, head_dim) with int32 cu_seqlens (batch + 1,).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from . import torch_direct as direct
from .api import attention as _attention
from .api import cached_forward
from .backward import attention_backward as _attention_backward
from .backward import cached_backward
from .backward import attention_varlen_backward as _attention_varlen_backward
from .features.mods import op_mod_args  # noqa: F401 (the ops' trailing arguments; the compat layer reads it here)
from .torch_views import (_VIEWED_DTYPES, _as_torch, _on_torch_stream_and_allocator,  # noqa: F401
                          cupy_views, tensor_view)  # (re-exported: the compat layer and tests import them from here)
from .varlen import attention_varlen as _attention_varlen


def _mods_kw(window_left: int, window_right: int, softcap: float, alibi_slopes: torch.Tensor | None,
             attention_chunk: int) -> dict:
    """The ops' modification arguments as flashkit's keywords (window (-1, -1): none; the slopes as a CuPy view,
    so call it on torch's stream and allocator)."""
    window = None if (window_left, window_right) == (-1, -1) else (window_left, window_right)
    return dict(window_size=window, softcap=softcap, alibi_slopes=tensor_view(alibi_slopes),
                attention_chunk=attention_chunk)


# The modifications (window_size as window_left / window_right, softcap, alibi_slopes, attention_chunk) ride along
# as the ops' last arguments, so that the backward sees the forward's; the slopes get no gradient.
def _forward(q, k, v, causal, softmax_scale, deterministic, window_left=-1, window_right=-1, softcap=0.0,
             alibi_slopes=None, attention_chunk=0, keep: list | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of the dense forward: the custom op's body and the eager Function's. A signature seen before
    runs its launch directly (torch_direct.py); else keep (a list) receives the CuPy views of q, k, v and the CuPy
    out and lse, for a backward that need not view them again."""
    key = direct.forward_key(q, k, v, causal, softmax_scale, window_left, window_right, softcap, alibi_slopes,
                             attention_chunk)
    if (launch := direct.lookup(key)) is not None:
        return launch(q, k, v, alibi_slopes)
    q, k, v = (x.detach() for x in (q, k, v))   # DLPack refuses tensors that require grad
    with _on_torch_stream_and_allocator():
        views = cupy_views((q, k, v))
        mods = _mods_kw(window_left, window_right, softcap, alibi_slopes, attention_chunk)
        out, lse = _attention(*views, causal=causal, softmax_scale=softmax_scale, return_lse=True, **mods)
        direct.remember_forward(key, cached_forward(*views, causal=causal, softmax_scale=softmax_scale,
                                                    return_lse=True, **mods), q)
        if keep is not None:
            keep.extend(views + (out, lse))
        return _as_torch(out), _as_torch(lse)


def _backward_impl(dout, q, k, v, out, lse, causal, softmax_scale, deterministic, window_left=-1, window_right=-1,
                   softcap=0.0, alibi_slopes=None, attention_chunk=0, kept: tuple = ()) -> tuple[torch.Tensor, ...]:
    """(dq, dk, dv) of the dense backward: the custom op's body and the eager Function's. A signature seen before
    runs its launch directly (torch_direct.py); else kept: the forward's views of q, k, v, out, lse, _forward's
    keep (viewing a tensor costs about 20 us on autograd's thread)."""
    if dout.stride(-1) != 1:
        dout = dout.contiguous()
    key = direct.backward_key(dout, q, k, v, out, lse, causal, softmax_scale, deterministic, window_left,
                              window_right, softcap, alibi_slopes, attention_chunk)
    if (launch := direct.lookup(key)) is not None:
        return launch(dout, q, k, v, out, lse, alibi_slopes)
    dout = dout.detach()
    with _on_torch_stream_and_allocator():
        arrays = (cupy_views((dout,)) + kept if kept else
                  cupy_views(tuple(x.detach() for x in (dout, q, k, v, out, lse))))
        mods = _mods_kw(window_left, window_right, softcap, alibi_slopes, attention_chunk)
        dq, dk, dv = _attention_backward(*arrays, causal=causal, softmax_scale=softmax_scale,
                                         deterministic=deterministic, **mods)
        direct.remember_backward(key, cached_backward(*arrays, causal=causal, softmax_scale=softmax_scale,
                                                      deterministic=deterministic, **mods), q)
        return _as_torch(dq), _as_torch(dk), _as_torch(dv)


@torch.library.custom_op("flashkit::attention_fwd", mutates_args=(), device_types="cuda")
def attention_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, softmax_scale: float | None,
                  deterministic: bool, window_left: int = -1, window_right: int = -1, softcap: float = 0.0,
                  alibi_slopes: torch.Tensor | None = None,
                  attention_chunk: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    return _forward(q, k, v, causal, softmax_scale, deterministic, window_left, window_right, softcap, alibi_slopes,
                    attention_chunk)


@attention_fwd.register_fake
def _attention_fwd_fake(q, k, v, causal, softmax_scale, deterministic, window_left=-1, window_right=-1, softcap=0.0,
                        alibi_slopes=None, attention_chunk=0):
    b, sq, h, _ = q.shape
    return q.new_empty((b, sq, h, v.shape[-1])), q.new_empty((b, h, sq), dtype=torch.float32)   # out: v's head dim


@torch.library.custom_op("flashkit::attention_bwd", mutates_args=(), device_types="cuda")
def attention_bwd(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                  lse: torch.Tensor, causal: bool, softmax_scale: float | None, deterministic: bool,
                  window_left: int = -1, window_right: int = -1, softcap: float = 0.0,
                  alibi_slopes: torch.Tensor | None = None,
                  attention_chunk: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _backward_impl(dout, q, k, v, out, lse, causal, softmax_scale, deterministic, window_left, window_right,
                          softcap, alibi_slopes, attention_chunk)


@attention_bwd.register_fake
def _attention_bwd_fake(dout, q, k, v, out, lse, causal, softmax_scale, deterministic, window_left=-1,
                        window_right=-1, softcap=0.0, alibi_slopes=None, attention_chunk=0):
    return tuple(torch.empty_like(x, memory_format=torch.contiguous_format) for x in (q, k, v))


def _save(ctx, inputs: tuple, output: tuple, saved_layout: int, kept: tuple = ()) -> None:
    """What a backward needs of its forward (either op pair, custom op or eager Function): q, k, v, out, lse and
    the first saved_layout arguments after q, k, v (varlen's offsets) saved for autograd's in-place checks; the
    other arguments (lengths, flags, modifications) as given; kept: CuPy views the eager backward reuses."""
    q, k, v, *rest = inputs
    ctx.save_for_backward(q, k, v, *output, *rest[:saved_layout])
    ctx.rest, ctx.others, ctx.kept = tuple(rest[saved_layout:]), len(rest), kept


def _saved(ctx) -> tuple:
    """The backward's arguments after dout, in the ops' order: q, k, v, out, lse, then the forward's arguments
    after q, k, v."""
    return (*ctx.saved_tensors, *ctx.rest)


def _input_grads(ctx, grads: tuple) -> tuple:
    """dq, dk, dv and no gradient for each argument after q, k, v."""
    return tuple(grads) + (None,) * ctx.others


def _setup_context(ctx, inputs, output):
    _save(ctx, inputs, output, saved_layout=0)


def _backward(ctx, dout, dlse):
    return _input_grads(ctx, attention_bwd(dout, *_saved(ctx)))


attention_fwd.register_autograd(_backward, setup_context=_setup_context)


@torch.library.custom_op("flashkit::attention_varlen_fwd", mutates_args=(), device_types="cuda")
def attention_varlen_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                         cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, causal: bool,
                         softmax_scale: float | None, deterministic: bool, window_left: int = -1,
                         window_right: int = -1, softcap: float = 0.0, alibi_slopes: torch.Tensor | None = None,
                         attention_chunk: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    return _varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, softmax_scale,
                           deterministic, window_left, window_right, softcap, alibi_slopes, attention_chunk)


def _varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, softmax_scale,
                    deterministic, window_left=-1, window_right=-1, softcap=0.0, alibi_slopes=None,
                    attention_chunk=0, keep: list | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of the packed forward: the custom op's body and the eager Function's (keep: as _forward's, the
    views of q, k, v, out, lse, then of the offsets)."""
    with _on_torch_stream_and_allocator():
        views = cupy_views((q.detach(), k.detach(), v.detach(), cu_seqlens_q, cu_seqlens_k))
        mods = _mods_kw(window_left, window_right, softcap, alibi_slopes, attention_chunk)
        out, lse = direct.checking_offsets_once(
            lambda check: _attention_varlen(*views, max_seqlen_q, max_seqlen_k, causal=causal,
                                            softmax_scale=softmax_scale, return_lse=True, check_indices=check,
                                            **mods),
            q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
        if keep is not None:
            keep.extend(views[:3] + (out, lse) + views[3:])
        return _as_torch(out), _as_torch(lse)


@attention_varlen_fwd.register_fake
def _attention_varlen_fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
                               softmax_scale, deterministic, window_left=-1, window_right=-1, softcap=0.0,
                               alibi_slopes=None, attention_chunk=0):
    total, h, _ = q.shape
    return q.new_empty((total, h, v.shape[-1])), q.new_empty((h, total), dtype=torch.float32)


@torch.library.custom_op("flashkit::attention_varlen_bwd", mutates_args=(), device_types="cuda")
def attention_varlen_bwd(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                         lse: torch.Tensor, cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, max_seqlen_q: int,
                         max_seqlen_k: int, causal: bool, softmax_scale: float | None, deterministic: bool,
                         window_left: int = -1, window_right: int = -1, softcap: float = 0.0,
                         alibi_slopes: torch.Tensor | None = None,
                         attention_chunk: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _varlen_backward_impl(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                 causal, softmax_scale, deterministic, window_left, window_right, softcap,
                                 alibi_slopes, attention_chunk)


def _varlen_backward_impl(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
                          softmax_scale, deterministic, window_left=-1, window_right=-1, softcap=0.0,
                          alibi_slopes=None, attention_chunk=0, kept: tuple = ()) -> tuple[torch.Tensor, ...]:
    """(dq, dk, dv) of the packed backward: the custom op's body and the eager Function's (kept: as
    _backward_impl's)."""
    dout = dout.detach()
    if dout.stride(-1) != 1:
        dout = dout.contiguous()
    with _on_torch_stream_and_allocator():   # the forward checked the offsets' values: no second host read
        arrays = (cupy_views((dout,)) + kept if kept else
                  cupy_views(tuple(x.detach() for x in (dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k))))
        dq, dk, dv = _attention_varlen_backward(*arrays,
                                                max_seqlen_q, max_seqlen_k, causal=causal, softmax_scale=softmax_scale,
                                                deterministic=deterministic, check_indices=False,
                                                **_mods_kw(window_left, window_right, softcap, alibi_slopes,
                                                           attention_chunk))
        return _as_torch(dq), _as_torch(dk), _as_torch(dv)


@attention_varlen_bwd.register_fake
def _attention_varlen_bwd_fake(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                               causal, softmax_scale, deterministic, window_left=-1, window_right=-1, softcap=0.0,
                               alibi_slopes=None, attention_chunk=0):
    return tuple(torch.empty_like(x, memory_format=torch.contiguous_format) for x in (q, k, v))


VARLEN_SAVED = 2   # cu_seqlens_q, cu_seqlens_k: saved beside q, k, v, out, lse


def _setup_varlen_context(ctx, inputs, output):
    _save(ctx, inputs, output, saved_layout=VARLEN_SAVED)


def _varlen_backward(ctx, dout, dlse):
    return _input_grads(ctx, attention_varlen_bwd(dout, *_saved(ctx)))


attention_varlen_fwd.register_autograd(_varlen_backward, setup_context=_setup_varlen_context)


@dataclass(frozen=True)
class _Implementations:
    """A layout's forward and backward bodies (the custom ops' and the eager Function's) and how many arguments
    after q, k, v its backward saves as tensors."""
    forward: Callable
    backward: Callable
    saved_layout: int


_DENSE = _Implementations(_forward, _backward_impl, 0)
_PACKED = _Implementations(_varlen_forward, _varlen_backward_impl, VARLEN_SAVED)


class _EagerOps(torch.autograd.Function):
    """An op pair in eager mode: the custom ops' implementations without their dispatch (the same launches, the
    same saved tensors), the backward reusing the forward's CuPy views; torch.compile traces the custom ops
    instead (_dispatch). apply(implementations, q, k, v, *the op's other arguments)."""

    @staticmethod
    def forward(ctx, impl, *inputs):
        kept: list = []   # the views the backward reuses (alive as long as the graph, as the saved tensors)
        out, lse = impl.forward(*inputs, keep=kept)
        _save(ctx, inputs, (out, lse), impl.saved_layout, tuple(kept))
        ctx.impl = impl
        ctx.mark_non_differentiable(lse)
        ctx.set_materialize_grads(False)   # no zeros for the LSE's absent gradient
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        # no dout: out took no part in what is differentiated (materialize_grads is off)
        grads = (None,) * 3 if dout is None else ctx.impl.backward(dout, *_saved(ctx), kept=ctx.kept)
        return (None,) + _input_grads(ctx, grads)


class _EagerAttention(_EagerOps):
    """The dense pair (flashkit::attention_fwd / attention_bwd) in eager mode."""


class _EagerVarlenAttention(_EagerOps):
    """The packed pair (flashkit::attention_varlen_fwd / attention_varlen_bwd) in eager mode."""


def _dispatch(op, eager: type, impl: _Implementations, *inputs) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse), differentiable in out: the custom op under torch.compile's tracing (it enters the graph) and on
    meta tensors (its fake implementation gives the shapes), its eager twin otherwise."""
    if torch.compiler.is_compiling() or inputs[0].is_meta:
        return op(*inputs)
    return eager.apply(impl, *inputs)


def attention_with_lse(q, k, v, causal, softmax_scale, deterministic, *mods) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of the dense pair, differentiable in out (mods: the ops' trailing arguments, op_mod_args)."""
    return _dispatch(attention_fwd, _EagerAttention, _DENSE, q, k, v, causal, softmax_scale, deterministic, *mods)


def attention_varlen_with_lse(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
                              softmax_scale, deterministic, *mods) -> tuple[torch.Tensor, torch.Tensor]:
    """The packed (out, lse), as attention_with_lse."""
    return _dispatch(attention_varlen_fwd, _EagerVarlenAttention, _PACKED, q, k, v, cu_seqlens_q, cu_seqlens_k,
                     max_seqlen_q, max_seqlen_k, causal, softmax_scale, deterministic, *mods)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
              softmax_scale: float | None = None, deterministic: bool = False,
              window_size: tuple[int, int] | None = None, softcap: float = 0.0,
              alibi_slopes: torch.Tensor | None = None, attention_chunk: int = 0, block_mask=None, mod=None,
              mod_args: dict | None = None) -> torch.Tensor:
    """softmax(scale q k^T [causal, modified]) v for (batch, seqlen, heads, head_dim) CUDA tensors; differentiable,
    the modifications (window_size, softcap, alibi_slopes, attention_chunk: flashkit.attention's) included.

    block_mask (a flashkit.BlockMask) and mod / mod_args (a drop-in functor by name with its arguments, torch
    tensors or scalars, or a flashkit.ModMask: docs/functors.md) are flashkit.attention's too; under torch.compile
    those calls trace as custom ops of their own (torch_masked.py), and a score_mod functor without its derivative
    has no gradient.

    v may have a head dim of its own (head_dim_v <= head_dim; DeepSeek's MLA: 128 under 192), the gradient too."""
    if block_mask is not None or mod is not None or mod_args is not None:
        from .torch_masked import masked_attention
        return masked_attention(q, k, v, deterministic, causal=causal, softmax_scale=softmax_scale,
                                window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes,
                                attention_chunk=attention_chunk, block_mask=block_mask, mod=mod, mod_args=mod_args)
    return attention_with_lse(q, k, v, causal, softmax_scale, deterministic,
                              *op_mod_args(window_size, softcap, alibi_slopes, attention_chunk))[0]


def attention_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                     cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, *, causal: bool = False,
                     softmax_scale: float | None = None, deterministic: bool = False,
                     window_size: tuple[int, int] | None = None, softcap: float = 0.0,
                     alibi_slopes: torch.Tensor | None = None, attention_chunk: int = 0) -> torch.Tensor:
    """flashkit.attention_varlen for packed (total_tokens, heads, head_dim) CUDA tensors and int32 cu_seqlens;
    differentiable (attention_varlen_backward), modifications included. Returns out (total_q, heads, head_dim)."""
    return attention_varlen_with_lse(q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k),
                                     causal, softmax_scale, deterministic,
                                     *op_mod_args(window_size, softcap, alibi_slopes, attention_chunk))[0]


__all__ = ["attention", "attention_varlen", "attention_with_lse", "attention_varlen_with_lse", "attention_fwd",
           "attention_bwd", "attention_varlen_fwd", "attention_varlen_bwd"]
