"""attention_backward and attention_varlen_backward: the gradients of flashkit.attention and
flashkit.attention_varlen, on the same path (validate -> select -> build -> launch)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from .api import ALIBI_FIELDS, _aligned, _check_block_mask, _negate_scale, per_call_pointers, request_for
from .call.arrays import ArrayMeta, describe, to_cupy
from .call.dtypes import BY_NAME
from .errors import CompileError, InputError
from .registry import discover_kernels, select_kernel
from .registry.select import check_head_dim_v
from .runtime.build import build_module, make_config
from .runtime.device import cupy_module, device_info
from .runtime import call_cache
from .runtime.call_cache import CALLS, UNKEYED, arrays_signature, context_signature, ndarray_type, window_signature
from .runtime.launch import POINTER_FIELDS, LaunchInputs, PreparedLaunch, prepare_launch, stride_fields
from .runtime.params import merge_fields
from .call.validate import Problem, check_device, check_flag, check_on_gpu, check_variant, validate_inputs
from .features.mods import Mods, launch_fields as mod_launch_fields, mods_of
from .features.varlen import (VARLEN_FIELDS, check_values, kernel_fields, offsets_pointers, packed_key,
                               validate_varlen)

LSE_DTYPE = "float32"
BWD_POINTERS = ("bwd.dout", "bwd.dq", "bwd.dk", "bwd.dv")   # per call beside POINTER_FIELDS: dout and the gradients


def attention_backward(dout: Any, q: Any, k: Any, v: Any, out: Any, lse: Any, *, causal: bool = False,
                       softmax_scale: float | None = None, deterministic: bool = False,
                       variant: str | None = None, window_size: tuple[int, int] | None = None,
                       softcap: float = 0.0, alibi_slopes: Any = None, attention_chunk: int = 0,
                       block_mask: Any = None, mod: Any = None, mod_args: dict | None = None):
    """(dq, dk, dv) of out = attention(q, k, v, causal=..., softmax_scale=..., window_size=..., softcap=...,
    alibi_slopes=..., attention_chunk=..., block_mask=..., mod=..., mod_args=...) for the upstream gradient dout.

    out and lse are the forward's output and log-sum-exp (`attention(..., return_lse=True)`); dk and dv
    are summed over each kv head's group of query heads (GQA/MQA). deterministic=True makes every
    gradient bit-identical run to run (dQ's per-key-block sums are added in a fixed order). The
    modifications take the forward's values (flashkit.features.mods); the slopes get no gradient.
    block_mask (a flashkit.BlockMask) and a drop-in functor's mask_mod (mod, mod_args: docs/functors.md; or mod a
    flashkit.ModMask, whose lists are built once and kept) are walked as the forward walked them: only the tiles
    they keep are visited (features/bwd_lists.py). A score_mod functor needs its derivative, score_mod_grad, in
    its file, or bias: true in its manifest (else UnsupportedError).
    v may have a head dim of its own (head_dim_v <= head_dim; DeepSeek's MLA: 128 under 192), out and dout v's.
    Returns CuPy arrays shaped like q, k, v.
    """
    causal, deterministic = check_flag(causal, "causal"), check_flag(deterministic, "deterministic")
    # A dense call (no block mask, no functor) of a signature seen before: its cached key holds only arguments
    # that passed validation, so the look-up can come first (as attention()'s does).
    key = _backward_key(dout, q, k, v, out, lse, causal, softmax_scale, deterministic, variant, window_size,
                        softcap, attention_chunk, alibi_slopes) if (
        block_mask is None and mod is None and mod_args is None) else None
    if key is not None and (cached := CALLS.get(key)) is not None:
        return cached(dout, q, k, v, out, lse, per_call_pointers(alibi_slopes, ()))
    check_variant(variant)
    q_meta = describe(q, "q")
    problem = validate_inputs(q_meta, describe(k, "k"), describe(v, "v"), softmax_scale)
    check_head_dim_v(problem.head_dim, problem.head_dim_v, discover_kernels().specs, backward=True)
    for x, name in ((dout, "dout"), (out, "out")):
        _check_like_out(describe(x, name), q_meta, problem.head_dim_v)
    _check_lse(describe(lse, "lse"), problem, q_meta)
    mods = mods_of(problem, causal, window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes,
                   attention_chunk=attention_chunk, device=q_meta.device)
    functor = _bind_backward_functor(mod, mod_args, problem, mods, q_meta.device)
    if block_mask is not None:
        _check_block_mask(block_mask, problem, functor)
    cc = device_info().cc
    req = request_for(problem, cc=cc, causal=causal, backward=True, block_sparse=block_mask is not None,
                      **mods.request_flags(), **(functor.request_flags() if functor else {}))
    spec = select_kernel(req, discover_kernels().specs, variant).chosen

    cupy = cupy_module()
    qc, kc, vc, doc, oc = (_aligned(to_cupy(x, n)) for x, n in
                           ((q, "q"), (k, "k"), (v, "v"), (dout, "dout"), (out, "out")))
    lsec = cupy.ascontiguousarray(to_cupy(lse, "lse"))
    storage = BY_NAME[problem.dtype].storage
    dq, dk, dv = (cupy.empty(x.shape, dtype=storage) for x in (qc, kc, vc))
    prepared = _launch_backward(spec, cc, problem, causal, deterministic, (qc, kc, vc, doc, oc, lsec),
                                (dq, dk, dv), mods=mods, alibi_slopes=alibi_slopes, block_mask=block_mask,
                                functor=functor)
    # Cached where the launch read the call's own arrays (no alignment copy, no contiguous LSE copy).
    if key is not None and prepared is not None and all(a is b for a, b in zip((qc, kc, vc, doc, oc, lsec),
                                                                               (q, k, v, dout, out, lse))):
        CALLS.put(key, _CachedBackward(prepared, (dq.shape, dk.shape, dv.shape), storage))
    return dq, dk, dv


def _backward_key(dout, q, k, v, out, lse, causal, softmax_scale, deterministic, variant, window_size, softcap,
                  attention_chunk, alibi_slopes) -> tuple | None:
    """The signature of a dense attention_backward() call (one flat tuple, as api._forward_key's); None when it
    takes the full path (an argument that is no CuPy array, a window that is no tuple or list)."""
    arrays = arrays_signature(dout, q, k, v, out, lse, alibi_slopes)
    if arrays is None or None in arrays[:6]:
        return None
    window = window_signature(window_size)
    context = context_signature()
    if window is UNKEYED or context is None:
        return None
    return ("attention_backward", arrays, causal, deterministic, type(softmax_scale), softmax_scale, variant, window,
            type(softcap), softcap, type(attention_chunk), attention_chunk, context)


def cached_backward(dout, q, k, v, out, lse, *, causal: bool, softmax_scale: float | None, deterministic: bool,
                    window_size=None, softcap: float = 0.0, alibi_slopes: Any = None,
                    attention_chunk: int = 0) -> "_CachedBackward | None":
    """The call cache's entry of a dense attention_backward() call on these CuPy arrays (what the same call would
    run next time: flashkit.torch's direct path keys it by the tensors behind the arrays), or None."""
    key = _backward_key(dout, q, k, v, out, lse, check_flag(causal, "causal"), softmax_scale,
                        check_flag(deterministic, "deterministic"), None, window_size, softcap, attention_chunk,
                        alibi_slopes)
    return None if key is None else CALLS.get(key)


class _CachedBackward:
    """A cached dense signature of attention_backward(): allocate dq, dk, dv, put the call's addresses (and the
    slopes') into the prepared launch, run it on the current stream with this stream's workspace."""

    def __init__(self, prepared: PreparedLaunch, shapes: tuple, storage):
        self.prepared, self.shapes, self.storage = prepared, shapes, storage

    def __call__(self, dout, q, k, v, out, lse, extra: tuple[int, ...]):
        ndarray = ndarray_type()
        grads = tuple(ndarray(shape, self.storage) for shape in self.shapes)
        _run_dense(self.prepared, (q, k, v, dout, out, lse), grads, extra)
        return grads


class _CachedVarlenBackward(_CachedBackward):
    """A cached signature of attention_varlen_backward(): its checked call, against which a later call's offsets
    are checked (their values are not in the key); the offsets' addresses are per-call pointers."""

    def __init__(self, prepared: PreparedLaunch, shapes: tuple, storage, call):
        super().__init__(prepared, shapes, storage)
        self.call = call


def _run_dense(prepared: PreparedLaunch, inputs: tuple, grads: tuple, extra: tuple[int, ...] = ()) -> None:
    """A dense backward's PreparedLaunch on inputs = (q, k, v, dout, out, lse) and grads = (dq, dk, dv): their
    addresses (BWD_POINTERS) and extra (the slopes') put in, on the current stream with its workspace."""
    q, k, v, dout, out, lse = inputs
    nbytes = prepared.workspace_bytes
    prepared(q, k, v, out, lse, (dout.data.ptr,) + tuple(g.data.ptr for g in grads) + extra,
             call_cache.workspace(nbytes) if nbytes else None)


def _bind_backward_functor(mod: Any, mod_args: Any, problem: Problem, mods: Mods, device):
    """The call's drop-in functor checked against its manifest (features/functors.bind_functor), or None; a
    score_mod needs its score_mod_grad (or bias: true) for a backward."""
    if mod is None and mod_args is None:
        return None
    from .features.functors import bind_functor, check_gradient
    from .features.mod_mask import call_tiles
    if mod is None:
        raise InputError("mod_args: given without mod (the functor they belong to)")
    mod, mod_args, snapshot, _ = call_tiles(mod, mod_args)
    functor = bind_functor(mod, mod_args, problem, mods, device)
    functor.snapshot = snapshot
    check_gradient(functor.spec, "; mask_mod functors need none")
    return functor


def attention_varlen_backward(dout: Any, q: Any, k: Any, v: Any, out: Any, lse: Any, cu_seqlens_q: Any,
                              cu_seqlens_k: Any, max_seqlen_q: int, max_seqlen_k: int, *, causal: bool = False,
                              softmax_scale: float | None = None, deterministic: bool = False,
                              variant: str | None = None, check_indices: bool = True,
                              window_size: tuple[int, int] | None = None, softcap: float = 0.0,
                              alibi_slopes: Any = None, attention_chunk: int = 0):
    """(dq, dk, dv) of out = attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
    causal=..., softmax_scale=..., window_size=..., softcap=..., alibi_slopes=..., attention_chunk=...) for the
    upstream gradient dout (total_q, heads, D); alibi_slopes (heads,) or (sequences, heads).

    out and lse are the forward's output and LSE (`attention_varlen(..., return_lse=True)`; lse (heads, total_q)
    float32); the packed layout, cu_seqlens and max_seqlen are checked as the forward checks them (check_indices
    =False skips the one synchronizing read of the offsets). dk and dv are summed over each kv head's group
    (GQA/MQA); causal is bottom-right aligned per sequence. deterministic=True: bit-identical run to run.
    Returns CuPy arrays shaped like q, k, v (rows of zero-length sequences: none; keys no query sees: zeros).
    """
    causal, deterministic = check_flag(causal, "causal"), check_flag(deterministic, "deterministic")
    check_indices = check_flag(check_indices, "check_indices")
    key = _varlen_backward_key(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                               causal, softmax_scale, deterministic, variant, window_size, softcap, attention_chunk,
                               alibi_slopes)
    if key is not None and (cached := CALLS.get(key)) is not None:   # validated and selected before (as the forward)
        if check_indices:
            check_values(cached.call, cu_seqlens_q, cu_seqlens_k)
        return cached(dout, q, k, v, out, lse, offsets_pointers(cu_seqlens_q, cu_seqlens_k, alibi_slopes))
    check_variant(variant)
    q_meta, k_meta, v_meta = describe(q, "q"), describe(k, "k"), describe(v, "v")
    call = validate_varlen(q_meta, k_meta, v_meta, describe(cu_seqlens_q, "cu_seqlens_q"),
                           describe(cu_seqlens_k, "cu_seqlens_k"), max_seqlen_q, max_seqlen_k, softmax_scale)
    problem = call.problem
    check_head_dim_v(problem.head_dim, problem.head_dim_v, discover_kernels().specs, backward=True)
    for x, name in ((dout, "dout"), (out, "out")):
        _check_like_out(describe(x, name), q_meta, problem.head_dim_v)
    _check_varlen_lse(describe(lse, "lse"), problem.heads, call.total_q, q_meta)
    mods = mods_of(problem, causal, window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes,
                   attention_chunk=attention_chunk, device=q_meta.device)
    cc = device_info().cc
    req = request_for(problem, cc=cc, causal=causal, backward=True, varlen=True, **mods.request_flags())
    spec = select_kernel(req, discover_kernels().specs, variant).chosen

    cupy = cupy_module()
    cu_q, cu_k = to_cupy(cu_seqlens_q, "cu_seqlens_q"), to_cupy(cu_seqlens_k, "cu_seqlens_k")
    if check_indices:
        check_values(call, cu_q, cu_k)
    storage = BY_NAME[problem.dtype].storage
    dq, dk, dv = (cupy.empty(m.shape, dtype=storage) for m in (q_meta, k_meta, v_meta))
    if min(call.total_q, call.total_k, problem.seqlen_q, problem.seqlen_k) == 0:   # no query sees a key: all 0
        for g in (dq, dk, dv):
            g.fill(0)
        return dq, dk, dv
    # As in the forward, the kernels see the packed tensors as a batch of one; Params.varlen splits it.
    qc, kc, vc, doc, oc = (_aligned(to_cupy(x, n))[None] for x, n in
                           ((q, "q"), (k, "k"), (v, "v"), (dout, "dout"), (out, "out")))
    lsec = cupy.ascontiguousarray(to_cupy(lse, "lse"))
    prepared = _launch_backward(spec, cc, problem, causal, deterministic, (qc, kc, vc, doc, oc, lsec),
                                (dq[None], dk[None], dv[None]), mods=mods, alibi_slopes=alibi_slopes, varlen=True,
                                extras=kernel_fields(cu_q, cu_k, call.total_q))
    # Cached where the launch read the call's own arrays (no alignment copy, no contiguous LSE copy).
    if key is not None and prepared is not None and all(
            a.data.ptr == b.data.ptr for a, b in zip((qc, kc, vc, doc, oc, lsec), (q, k, v, dout, out, lse))):
        CALLS.put(key, _CachedVarlenBackward(prepared, (dq.shape, dk.shape, dv.shape), storage, call))
    return dq, dk, dv


def _varlen_backward_key(dout, q, k, v, out, lse, cu_q, cu_k, max_seqlen_q, max_seqlen_k, causal, softmax_scale,
                         deterministic, variant, window_size, softcap, attention_chunk, alibi_slopes) -> tuple | None:
    """The signature of an attention_varlen_backward() call on CuPy arrays: _backward_key's of the packed arrays
    with the offsets' signatures and the longest lengths; None for the full path."""
    return packed_key("attention_varlen_backward", cu_q, cu_k, max_seqlen_q, max_seqlen_k,
                      lambda: _backward_key(dout, q, k, v, out, lse, causal, softmax_scale, deterministic, variant,
                                            window_size, softcap, attention_chunk, alibi_slopes))


def _launch_backward(spec, cc, problem: Problem, causal: bool, deterministic: bool, inputs: tuple, grads: tuple,
                     mods: Mods, alibi_slopes: Any = None, varlen: bool = False, extras: dict | None = None,
                     block_mask: Any = None, functor: Any = None) -> PreparedLaunch | None:
    """Launch a backward variant: inputs = (q, k, v, dout, out, lse) and grads = (dq, dk, dv) as its kernels
    index them (Params.bwd carries the gradients' pointers and strides, dout also as a tensor map), with the
    call's modifications built in (Params.mods as the forward's).

    A modified call with a negative softmax_scale runs as the forward does (features/mods.kernel_fields: raw
    scores of -q at |scale|): on -q, and dq negated back.

    Returns the dense call's PreparedLaunch (dout, the gradients, a packed call's offsets and the slopes as its
    per-call pointers: BWD_POINTERS, VARLEN_FIELDS, ALIBI_FIELDS), for the call cache; None for a call that cannot
    repeat it (negated, listed)."""
    qc, kc, vc, doc, oc, lsec = inputs
    dq, dk, dv = grads
    negate = bool(mods.features) and problem.softmax_scale < 0
    if negate:
        qc, problem = _negate_scale(qc, problem, cupy_module())
    config = make_config(spec, problem.dtype, problem.head_dim, causal, cc, block_sparse=block_mask is not None,
                         mods=(("varlen",) if varlen else ()) + mods.features + (functor.features if functor else ()),
                         functor=functor.build_key if functor else None, head_dim_v=problem.head_dim_v,
                         seqlen_q=problem.seqlen_q)
    bwd = {"dout": doc.data.ptr, "dq": dq.data.ptr, "dk": dk.data.ptr, "dv": dv.data.ptr,
           "deterministic": int(deterministic), "order_pairs": _order_pairs(config.launch_dict, problem, causal, mods,
                                                                              varlen),
           **stride_fields("do", doc), **stride_fields("dq", dq), **stride_fields("dk", dk),
           **stride_fields("dv", dv)}
    keep: list = []   # the slopes' CuPy view, alive until the launch is queued
    extras = {**(extras or {}), **mod_launch_fields(mods, problem, alibi_slopes, keep), "bwd": bwd}
    io = LaunchInputs(qc, kc, vc, oc, lsec, extras=extras, map_arrays={"dout": doc}, map_fields={"dout": "bwd.dout"})
    if block_mask is not None or (functor is not None and functor.spec.mask):
        _launch_listed(spec, cc, config, problem, io, causal, mods, block_mask, functor)
        prepared = None
    elif functor is not None:   # a score_mod alone: the dense walk, the functor built in (not cached: no key)
        io = replace(io, extras=merge_fields(io.extras, functor.kernel_fields(problem, to_cupy)))
        prepare_launch(spec, _build(spec, config, cc, functor), config, problem, io)(io.q, io.k, io.v, io.out, io.lse)
        prepared = None
    else:
        variable = BWD_POINTERS + (VARLEN_FIELDS if varlen else ()) + (ALIBI_FIELDS if mods.alibi else ())
        prepared = prepare_launch(spec, build_module(spec, config, cc), config, problem, io, variable)
        offsets = (extras["varlen"]["cu_seqlens_q"], extras["varlen"]["cu_seqlens_k"]) if varlen else ()
        slopes = (keep[0].data.ptr,) if mods.alibi else ()   # launch_fields' view of alibi_slopes
        _run_dense(prepared, (qc, kc, vc, doc, oc, lsec), grads, offsets + slopes)
    if negate:
        dq *= -1
        return None
    return prepared


def _order_pairs(launch: dict[str, int], problem: Problem, causal: bool, mods: Mods, varlen: bool) -> int:
    """Params.bwd.order_pairs: the causal key-block order's group size (runtime/bwd_order.py) for a main kernel
    that reorders (launch flag heaviest_first); 1 (the launch order) otherwise, and for packed sequences, whose
    lengths the host does not read."""
    if not (causal and launch.get("heaviest_first") and not varlen):
        return 1
    from .runtime.bwd_order import order_pairs
    window = (-1, -1) if mods.chunk else mods.window()   # a chunk's work is modelled as the causal mask's
    return order_pairs(problem.batch, problem.kv_heads, problem.heads // problem.kv_heads, problem.seqlen_q,
                       problem.seqlen_k, launch["block_m"], launch["block_n"], causal, window, device_info().sm_count)


def _build(spec, config, cc, functor: Any):
    """The build of config; a functor's compile error names its file and line (features/functors.py)."""
    try:
        return build_module(spec, config, cc)
    except CompileError as e:
        raise (functor.compile_error(e) if functor else e) from None


def _launch_listed(spec, cc, config, problem: Problem, io: LaunchInputs, causal: bool, mods: Mods, block_mask: Any,
                   functor: Any) -> None:
    """A backward over visit lists (features/bwd_lists.py): the tile states (a block mask's, or a mask_mod's by
    its classifier), the lists and ranks, then the variant's entries, all on the current stream."""
    from .features.bwd_lists import VisitLists, geometry
    loaded = _build(spec, config, cc, functor)
    cupy = cupy_module()
    launch_cfg = config.launch_dict
    by_mask_mod = block_mask is None   # the tile states: a mask_mod's classifier, else the block mask's blocks
    batch, heads = functor.mask_rows(problem) if by_mask_mod else block_mask.shape[:2]
    # A ModMask keeps the lists of its first call of this geometry (features/mod_mask.py)
    snapshot = functor.snapshot if by_mask_mod else None
    key = functor.tiles_key("backward", spec.name, config, problem) if snapshot is not None else None
    held = snapshot.held(key) if snapshot is not None else None
    lists = held if held is not None else VisitLists.allocate(geometry(problem, launch_cfg, batch, heads), cupy)
    extras = merge_fields(io.extras, lists.fields())
    if functor is not None:   # ModArgs (a mask_mod: no scale), of a mask_mod or of a score_mod beside a block mask
        extras = merge_fields(extras, functor.kernel_fields(problem, to_cupy))
    io = replace(io, extras=extras)
    prepared = prepare_launch(spec, loaded, config, problem, io)
    if held is None:
        block = prepared.params.fill(*(0,) * len(POINTER_FIELDS))   # the list passes read no array of the attention
        if by_mask_mod:
            lists.classify(loaded.aux, block)
        else:
            lists.block_mask_states(block_mask, problem, launch_cfg, causal, mods, cupy)
        lists.compact(loaded.aux, block)
        if snapshot is not None:
            snapshot.hold(key, lists)
    prepared(io.q, io.k, io.v, io.out, io.lse)


def _check_like_out(m: ArrayMeta, q: ArrayMeta, head_dim_v: int) -> None:
    """dout and out: CUDA arrays of the forward output's shape (q's, with v's head dim last) and q's dtype, last dim
    contiguous."""
    check_on_gpu(m)
    want = tuple(q.shape[:-1]) + (head_dim_v,)
    if tuple(m.shape) != want:
        what = "q's shape" if head_dim_v == q.shape[-1] else "q's shape with v's head dim (head_dim_v) last"
        raise InputError(f"{m.name}: expected {what} {want}, got {m.shape}")
    if m.dtype != q.dtype:
        raise InputError(f"{m.name}: expected q's dtype {q.dtype}, got {m.dtype}")
    if m.strides[-1] != 1 and m.shape[-1] != 1:
        raise InputError(f"{m.name}: the last (head_dim) dimension must be contiguous (stride 1), got strides {m.strides}")
    check_device(m, q.device)


def _check_lse(m: ArrayMeta, p: Problem, q: ArrayMeta) -> None:
    """lse: the forward's float32 log-sum-exp, (batch, heads, seqlen_q)."""
    want = (p.batch, p.heads, p.seqlen_q)
    check_on_gpu(m)
    if m.shape != want:
        raise InputError(f"lse: expected shape (batch, heads, seqlen_q) = {want}, got {m.shape}")
    if str(m.dtype) != LSE_DTYPE:
        raise InputError(f"lse: expected dtype float32 (attention(..., return_lse=True)), got {m.dtype}")
    check_device(m, q.device)


def _check_varlen_lse(m: ArrayMeta, heads: int, total_q: int, q: ArrayMeta) -> None:
    """lse: attention_varlen's float32 log-sum-exp, (heads, total_q)."""
    check_on_gpu(m)
    if m.shape != (heads, total_q):
        raise InputError(f"lse: expected shape (heads, total_q) = {(heads, total_q)} "
                         f"(attention_varlen(..., return_lse=True)), got {m.shape}")
    if str(m.dtype) != LSE_DTYPE:
        raise InputError(f"lse: expected dtype float32 (attention_varlen(..., return_lse=True)), got {m.dtype}")
    check_device(m, q.device)


__all__ = ["attention_backward", "attention_varlen_backward"]
