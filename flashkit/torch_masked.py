"""flashkit.torch.attention's calls with a block mask or a drop-in functor (block_mask=, mod=, mod_args=):
differentiable through flashkit.attention_backward's lists.

Eager calls run as one torch.autograd.Function (_MaskedAttention), whose backward reuses the forward's CuPy views.
Under torch.compile they are the custom ops flashkit::masked_attention_fwd / masked_attention_bwd, with fake
implementations and the forward's autograd formula, so that the call traces (fullgraph) without a graph break. An op
schema carries tensors, numbers and strings but no Python objects, so the ops name a flashkit.BlockMask or a
flashkit.ModMask by its integer handle (features/mask_handles.py), a functor by its name, and take its mod_args as a
list of tensors, a list of ints and a list of floats after a string of their names. Every launch is flashkit.attention's
and attention_backward's, on torch's current stream and through torch's caching allocator, as the dense ops' are.
A functor with a score_mod needs its derivative (score_mod_grad) for a gradient: without one, a call that would
need its gradient raises UnsupportedError before the forward runs (under torch.no_grad it runs).
"""

from __future__ import annotations

from typing import Any

import torch

from .api import attention as _attention
from .backward import attention_backward as _attention_backward
from .errors import InputError
from .features.mask_handles import NO_MASK, handle_of, lookup
from .features.mod_mask import ModMask
from .features.mods import op_mod_args
from .torch_views import _as_torch, _on_torch_stream_and_allocator, cupy_views, tensor_view


def wants_gradient(*tensors: torch.Tensor) -> bool:
    """Whether autograd will ask for a gradient of one of tensors."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def check_score_mod_gradient(mod: Any, needed: bool) -> None:
    """UnsupportedError before the forward when a gradient (needed) would flow through a score_mod without its
    derivative."""
    from .registry import discover_kernels
    name = mod.mod if type(mod) is ModMask else mod
    if type(name) is not str or not needed:
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


def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, deterministic: bool = False,
                     **call) -> torch.Tensor:
    """flashkit.attention(q, k, v, **call) with call's block_mask / mod / mod_args, differentiable (the backward
    deterministic as asked): the custom op under torch.compile's tracing, the eager Function otherwise."""
    if torch.compiler.is_compiling():
        return masked_attention_fwd(q, k, v, deterministic, wants_gradient(q, k, v), *op_arguments(**call))[0]
    check_score_mod_gradient(call.get("mod"), wants_gradient(q, k, v))
    return _MaskedAttention.apply(q, k, v, deterministic, call)


# ---- the custom ops (torch.compile) ----------------------------------------------------------------------------
# Their arguments after q, k, v: deterministic, needs_grad (the forward refuses a score_mod without its derivative
# when a gradient will be asked), then op_arguments' (the call's keywords). The backward op takes the same ones.

def op_arguments(causal: bool = False, softmax_scale: float | None = None, window_size=None, softcap: float = 0.0,
                 alibi_slopes: torch.Tensor | None = None, attention_chunk: int = 0, block_mask=None, mod=None,
                 mod_args: dict | None = None) -> tuple:
    """A masked call's keywords as the ops' arguments: causal, softmax_scale, the modifications (op_mod_args), the
    block mask's handle, the ModMask's handle, the functor's name, then mod_args as the string of their names (None
    without mod_args) and lists of their tensors, ints and floats, in that order."""
    mod_mask = mod if isinstance(mod, ModMask) else None
    if mod is not None and mod_mask is None and not isinstance(mod, str):
        raise InputError(f"mod: expected a functor name (str) or a flashkit.ModMask, got {type(mod).__name__}")
    names, tensors, ints, floats = _split_mod_args(mod_args)
    return (causal, softmax_scale, *op_mod_args(window_size, softcap, alibi_slopes, attention_chunk),
            handle_of(block_mask), handle_of(mod_mask), None if mod_mask is not None else mod, names, tensors, ints,
            floats)


def _split_mod_args(mod_args: dict | None) -> tuple:
    """(names, tensors, ints, floats) of a functor's arguments (names: comma-separated, tensors' first, then the
    ints', then the floats'; None without mod_args)."""
    if mod_args is None:
        return None, [], [], []
    if not isinstance(mod_args, dict):
        raise InputError(f"mod_args: expected a dict of the functor's arguments, got {type(mod_args).__name__}")
    names: tuple[list, list, list] = ([], [], [])    # of the tensors, the ints, the floats
    values: tuple[list, list, list] = ([], [], [])
    for name, value in mod_args.items():
        if isinstance(value, torch.Tensor):
            kind = 0
        elif isinstance(value, int) and not isinstance(value, bool):
            kind = 1
        elif isinstance(value, float):
            kind = 2
        else:
            raise InputError(f"mod_args['{name}']: expected a CUDA tensor, an int or a float, got "
                             f"{type(value).__name__}")
        names[kind].append(name)
        values[kind].append(value)
    return (",".join(names[0] + names[1] + names[2]), *values)


def _call_of(causal, softmax_scale, window_left, window_right, softcap, alibi_slopes, attention_chunk, block_mask,
             mod_mask, mod, mod_arg_names, mod_tensors, mod_ints, mod_floats) -> dict:
    """The ops' arguments after needs_grad as flashkit.attention's keywords (the masks looked up by handle)."""
    mod_args = None
    if mod_arg_names is not None:
        names = mod_arg_names.split(",") if mod_arg_names else []
        mod_args = dict(zip(names, (*mod_tensors, *mod_ints, *mod_floats)))
    window = None if (window_left, window_right) == (-1, -1) else (window_left, window_right)
    return dict(causal=causal, softmax_scale=softmax_scale, window_size=window, softcap=softcap,
                alibi_slopes=alibi_slopes, attention_chunk=attention_chunk,
                block_mask=lookup(block_mask, "block_mask"),
                mod=mod if mod_mask == NO_MASK else lookup(mod_mask, "mod"), mod_args=mod_args)


@torch.library.custom_op("flashkit::masked_attention_fwd", mutates_args=(), device_types="cuda")
def masked_attention_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, deterministic: bool, needs_grad: bool,
                         causal: bool, softmax_scale: float | None, window_left: int, window_right: int,
                         softcap: float, alibi_slopes: torch.Tensor | None, attention_chunk: int, block_mask: int,
                         mod_mask: int, mod: str | None, mod_arg_names: str | None, mod_tensors: list[torch.Tensor],
                         mod_ints: list[int], mod_floats: list[float]) -> tuple[torch.Tensor, torch.Tensor]:
    call = _call_of(causal, softmax_scale, window_left, window_right, softcap, alibi_slopes, attention_chunk,
                    block_mask, mod_mask, mod, mod_arg_names, mod_tensors, mod_ints, mod_floats)
    check_score_mod_gradient(call["mod"], needs_grad)
    with _on_torch_stream_and_allocator():
        out, lse = _attention(*cupy_views((q, k, v)), return_lse=True, **_device_keywords(call))
        return _as_torch(out), _as_torch(lse)


@masked_attention_fwd.register_fake
def _masked_attention_fwd_fake(q, k, v, *args):
    b, sq, h, _ = q.shape
    return q.new_empty((b, sq, h, v.shape[-1])), q.new_empty((b, h, sq), dtype=torch.float32)


@torch.library.custom_op("flashkit::masked_attention_bwd", mutates_args=(), device_types="cuda")
def masked_attention_bwd(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                         lse: torch.Tensor, deterministic: bool, needs_grad: bool, causal: bool,
                         softmax_scale: float | None, window_left: int, window_right: int, softcap: float,
                         alibi_slopes: torch.Tensor | None, attention_chunk: int, block_mask: int, mod_mask: int,
                         mod: str | None, mod_arg_names: str | None, mod_tensors: list[torch.Tensor],
                         mod_ints: list[int],
                         mod_floats: list[float]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    call = _call_of(causal, softmax_scale, window_left, window_right, softcap, alibi_slopes, attention_chunk,
                    block_mask, mod_mask, mod, mod_arg_names, mod_tensors, mod_ints, mod_floats)
    if dout.stride(-1) != 1:
        dout = dout.contiguous()
    with _on_torch_stream_and_allocator():
        grads = _attention_backward(*cupy_views((dout, q, k, v, out, lse)), deterministic=deterministic,
                                    **_device_keywords(call))
        return tuple(_as_torch(g) for g in grads)


@masked_attention_bwd.register_fake
def _masked_attention_bwd_fake(dout, q, k, v, *args):
    return tuple(torch.empty_like(x, memory_format=torch.contiguous_format) for x in (q, k, v))


# Where the forward op's tensors after q, k, v sit among its arguments: the slopes and the functor's tensors.
_AFTER_QKV = [a.name for a in torch.ops.flashkit.masked_attention_fwd.default._schema.arguments][3:]
_SLOPES, _MOD_TENSORS = _AFTER_QKV.index("alibi_slopes"), _AFTER_QKV.index("mod_tensors")


def _setup_masked_context(ctx, inputs, output):
    """Saves q, k, v, out, lse, the slopes and the functor's tensors (autograd's in-place checks), the other
    arguments as given, and the inputs' structure (a gradient per input, a list of them per list input)."""
    q, k, v, *rest = inputs
    ctx.save_for_backward(q, k, v, *output, rest[_SLOPES], *rest[_MOD_TENSORS])
    ctx.lists = tuple(len(x) if isinstance(x, (list, tuple)) else None for x in rest)
    rest[_SLOPES], rest[_MOD_TENSORS] = None, None
    ctx.rest = rest


def _masked_backward(ctx, dout, dlse):
    no_grads = tuple(None if n is None else [None] * n for n in ctx.lists)   # for every argument after q, k, v
    if dout is None:   # out took no part in what is differentiated
        return (None, None, None) + no_grads
    rest = list(ctx.rest)
    q, k, v, out, lse, slopes, *mod_tensors = ctx.saved_tensors
    rest[_SLOPES], rest[_MOD_TENSORS] = slopes, mod_tensors
    return tuple(masked_attention_bwd(dout, q, k, v, out, lse, *rest)) + no_grads


masked_attention_fwd.register_autograd(_masked_backward, setup_context=_setup_masked_context)


__all__ = ["masked_attention", "masked_attention_fwd", "masked_attention_bwd"]
