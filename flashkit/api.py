"""The public entry points: validate -> select -> build -> launch."""

from __future__ import annotations

import warnings
from dataclasses import replace
from typing import Any

from .call.arrays import describe, to_cupy
from .call.dtypes import BY_NAME, FLOAT8_E4M3, dtype_by_name
from .call.validate import Problem, check_flag, check_scale, check_variant, validate_inputs
from .errors import CompileError, FallbackWarning, InputError
from .features.mods import launch_fields as mod_launch_fields
from .features.mods import mods_of
from .registry import Request, Selection, discover_kernels, select_kernel
from .registry.select import check_head_dim_v
from .registry.manifest import KernelSpec
from .runtime.build import build_module, launch_table, make_config
from .runtime.device import cupy_module, device_count, device_info
from .runtime.call_cache import (CALLS, UNKEYED, CachedLaunch, arrays_signature, context_signature,
                                 window_signature)
from .runtime.launch import LaunchInputs, PreparedLaunch, launch, prepare_launch  # noqa: F401 (launch: re-exported)
from .runtime.params import merge_fields

ALIGN_BYTES = 16   # the flash kernels load 16-byte vectors: base and row/head strides must be multiples
FP8_OUT_DTYPES = ("bfloat16", "float16")


def attention(q: Any, k: Any, v: Any, *, causal: bool = False, softmax_scale: float | None = None,
              variant: str | None = None, return_lse: bool = False, block_mask: Any = None,
              fp8: bool = False, q_scale: Any = None, k_scale: Any = None, v_scale: Any = None,
              out_dtype: str | None = None, out: Any = None, fp8_options: dict | None = None,
              window_size: tuple[int, int] | None = None, softcap: float = 0.0, alibi_slopes: Any = None,
              attention_chunk: int = 0, mod: Any = None, mod_args: dict | None = None):
    """softmax(scale * q k^T [masked]) v for (batch, seqlen, heads, head_dim) CUDA arrays.

    v (and out) may have a head dim of its own, head_dim_v (DeepSeek's MLA: q, k 192, v 128); the output is
    (batch, seqlen_q, heads, head_dim_v). The FA2 family (fa2, causal) runs it, for head_dim_v <= head_dim; fa3 on
    sm_90 where both are among its head dims (192 / 128, 128 / 64, ...).

    window_size=(left, right), attention_chunk, softcap and alibi_slopes (float32 (heads,) or (batch, heads))
    follow flash-attn (flashkit.features.mods).

    mod names a drop-in functor (score_mod / mask_mod in a mods/*.cu file; docs/functors.md), mod_args its
    arguments by the names its manifest declares; or mod is a flashkit.ModMask (a mask_mod with its arguments,
    its tiles classified once and reused).

    fp8=True quantizes q, k, v with flashkit.features.fp8.quantize_qkv(**fp8_options): block, hadamard, seed.

    Returns a CuPy array (and the float32 log-sum-exp, (batch, heads, seqlen_q), with return_lse=True).
    """
    causal, return_lse, fp8 = (check_flag(causal, "causal"), check_flag(return_lse, "return_lse"),
                               check_flag(fp8, "fp8"))
    # A call with no quantizing (fp8=True) may have been seen before: a cached key holds only arguments that
    # passed validation, so the checks below, which such a call passes trivially, can come after the look-up.
    # ALiBi's slopes, pre-quantized fp8's scales and a functor's array arguments are keyed by their signatures
    # (shape, strides, dtype, device) and put in per call (ALIBI_FIELDS, SCALE_FIELDS, the functor's fields).
    scales = (q_scale, k_scale, v_scale)
    prequantized = any(s is not None for s in scales)
    keyed_scales = scales if prequantized else ()
    functor_key = snapshot = None
    if mod is not None or mod_args is not None:
        from .features.mod_mask import call_tiles
        # a ModMask: its functor, arguments and tiles; a scalar-argument mask_mod by name: tiles kept by signature
        mod, mod_args, snapshot, functor_key = call_tiles(mod, mod_args)
    key = _forward_key(q, k, v, out, causal, softmax_scale, variant, return_lse, block_mask, out_dtype, window_size,
                       softcap, attention_chunk, alibi_slopes, keyed_scales, functor_key) if (
        not fp8 and fp8_options is None and (functor_key is not None or (mod is None and mod_args is None))) else None
    if key is not None and (cached := CALLS.get(key)) is not None:   # this signature validated and selected before
        if functor_key is not None:
            return cached(q, k, v, out, per_call_pointers(alibi_slopes, keyed_scales), mod_args, snapshot)
        if alibi_slopes is None and not prequantized:
            return cached(q, k, v, out)
        return cached(q, k, v, out, per_call_pointers(alibi_slopes, keyed_scales))
    if prequantized and not all(s is not None for s in scales):
        raise InputError("q_scale, k_scale, v_scale: pre-quantized fp8 inputs need all three scales")
    if prequantized and fp8:
        raise InputError("fp8: pass fp8=True with float16/bfloat16 inputs, or pre-quantized inputs with "
                         "scales, not both")
    if fp8_options is not None and (not fp8 or not isinstance(fp8_options, dict)):
        raise InputError("fp8_options: expected a dict (block, hadamard, seed) together with fp8=True")
    check_variant(variant)
    q_meta = describe(q, "q")
    problem = validate_inputs(q_meta, describe(k, "k"), describe(v, "v"), softmax_scale, prequantized)
    check_head_dim_v(problem.head_dim, problem.head_dim_v, discover_kernels().specs)
    mods = mods_of(problem, causal, window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes,
                   attention_chunk=attention_chunk, device=q_meta.device)
    functor = None
    if mod is not None or mod_args is not None:
        from .features.functors import bind_functor
        if mod is None:
            raise InputError("mod_args: given without mod (the functor they belong to)")
        functor = bind_functor(mod, mod_args, problem, mods, q_meta.device)
        functor.snapshot = snapshot
    if fp8 and problem.dtype == "float32":
        raise InputError("fp8: quantizing needs float16 or bfloat16 inputs, got float32")
    if block_mask is not None:
        _check_block_mask(block_mask, problem, functor)
    out_name = _output_dtype(problem, fp8 or prequantized, out_dtype)
    if fp8:   # the kernel sees the quantized inputs
        problem = replace(problem, dtype=FLOAT8_E4M3.name)
    use_fp8 = fp8 or prequantized
    cc = device_info().cc
    req = request_for(problem, causal=causal, block_sparse=block_mask is not None, fp8=use_fp8,
                      lse=return_lse, cc=cc, **mods.request_flags(),
                      **(functor.request_flags() if functor else {}))
    sel = select_kernel(req, discover_kernels().specs, variant)
    if sel.warning:
        warnings.warn(sel.warning, FallbackWarning, stacklevel=2)

    cupy = cupy_module()
    qc, kc, vc = (_aligned(to_cupy(x, n)) for x, n in ((q, "q"), (k, "k"), (v, "v")))
    extras: dict[str, int] = {}
    keep: list = []   # device arrays the launch reads, alive until it is queued
    if fp8:
        from .features.fp8 import quantize_qkv
        (qc, qs), (kc, ks), (vc, vs) = quantize_qkv(qc, kc, vc, **_fp8_options(fp8_options))
        scales = (qs, ks, vs)
    if use_fp8:
        from .features.fp8 import scale_fields
        extras.update(scale_fields(problem, *scales, keep=keep))
    if block_mask is not None:
        extras.update(block_mask.kernel_fields(problem, keep=keep))
    extras.update(mod_launch_fields(mods, problem, alibi_slopes, keep))
    per_call = (ALIBI_FIELDS if mods.alibi else ()) + (SCALE_FIELDS if prequantized else ())
    if functor is not None:   # ModArgs beside the built-in fields of Params.mods
        extras = merge_fields(extras, functor.kernel_fields(problem, to_cupy))
        per_call += functor.variable_fields()
    out_arr = _output(out, problem, out_name, cupy)
    lse = cupy.empty((problem.batch, problem.heads, problem.seqlen_q), dtype=cupy.float32) if return_lse else None
    prepared = run(sel.chosen, problem, causal, LaunchInputs(qc, kc, vc, out_arr, lse, extras),
                   block_sparse=block_mask is not None, out_dtype=out_name, mods=mods.features + (
                       functor.features if functor else ()), variable=per_call, functor=functor)
    # Cached where the launch read the call's own arrays: no copy, no negation, the scales as given.
    if (key is not None and qc is q and kc is k and vc is v and problem.softmax_scale > 0
            and (not prequantized or all(a is b for a, b in zip(keep, scales)))):
        entry = (_CachedForward(prepared, out_arr.shape, out_arr.dtype, lse.shape if return_lse else None, block_mask)
                 if functor is None else
                 _CachedFunctorForward(prepared, out_arr.shape, out_arr.dtype, lse.shape if return_lse else None,
                                       block_mask, functor.launch))
        CALLS.put(key, entry)
    return (out_arr, lse) if return_lse else out_arr


def run(spec: KernelSpec, problem: Problem, causal: bool, io: LaunchInputs, block_sparse: bool = False,
        out_dtype: str | None = None, mods: tuple[str, ...] = (), variable: tuple[str, ...] = (),
        functor: Any = None) -> PreparedLaunch:
    """Build (or fetch) the specialization for this device and launch it; returns the launch, reusable for
    calls of the same signature (their pointers, and the dotted `variable` extras, put in). A functor
    (features/functors.BoundFunctor) is built in, and its mask_mod's tiles classified first."""
    if problem.softmax_scale < 0:   # the kernels take row maxima of the raw scores: hand them a positive scale
        q, problem = _negate_scale(io.q, problem, cupy_module())
        io = replace(io, q=q)
    cc = device_info().cc
    config = make_config(spec, problem.dtype, problem.head_dim, causal, cc, block_sparse, out_dtype, mods,
                         functor.build_key if functor else None, problem.head_dim_v, problem.seqlen_q)
    if functor is None:
        prepared = prepare_launch(spec, build_module(spec, config, cc), config, problem, io, variable)
    else:
        try:
            loaded = build_module(spec, config, cc)
        except CompileError as e:
            raise functor.compile_error(e) from None
        key = functor.tiles_key("forward", spec.name, config, problem)
        tiles = functor.tile_fields(problem, config.launch_dict, cupy_module(), key)
        io = replace(io, extras=merge_fields(io.extras, {"mods": tiles}))
        prepared = prepare_launch(spec, loaded, config, problem, io, variable)
        functor.launch = functor.launcher(loaded, problem, config.launch_dict, key)
        functor.classify(prepared.params)   # a mask_mod's tiles (unless a ModMask holds them), then the attention
    prepared(io.q, io.k, io.v, io.out, io.lse)
    return prepared


class _CachedForward(CachedLaunch):
    """A cached signature of attention(); holds the block mask its key names by id (an id must not be reused
    while cached)."""

    def __init__(self, prepared: PreparedLaunch, out_shape: tuple, out_storage, lse_shape: tuple | None,
                 block_mask: Any):
        super().__init__(prepared, out_shape, out_storage, lse_shape)
        self.block_mask = block_mask

    __call__ = CachedLaunch.launch


class _CachedFunctorForward(_CachedForward):
    """A cached signature of an attention() call with a drop-in functor: per call its array arguments' addresses
    and, for a mask_mod, fresh tile buffers classified before the attention (features/functors.FunctorLaunch)."""

    def __init__(self, prepared: PreparedLaunch, out_shape: tuple, out_storage, lse_shape: tuple | None,
                 block_mask: Any, functor: Any):
        super().__init__(prepared, out_shape, out_storage, lse_shape, block_mask)
        self.functor = functor

    def __call__(self, q, k, v, out, extra: tuple[int, ...], mod_args: dict | None, snapshot: Any = None):
        keep: list = []   # new tile buffers, alive until the launches are queued
        # the arguments' addresses and a mask_mod's tiles: classified here, before the attention, unless the
        # snapshot (a ModMask, or a scalar-argument mask_mod's named_tiles) holds them
        extra = extra + self.functor.prepare(self.prepared.params, mod_args or {}, cupy_module(), keep, extra,
                                             snapshot)
        return self.launch(q, k, v, out, extra)


ALIBI_FIELDS = ("mods.alibi_slopes",)   # per call: the slopes' address (their signature is in the key)
SCALE_FIELDS = ("q_scale", "k_scale", "v_scale")   # per call: pre-quantized fp8's scales (likewise)


def per_call_pointers(alibi_slopes, scales: tuple) -> tuple[int, ...]:
    """The addresses a cached call puts in beside q, k, v and out: ALIBI_FIELDS' then SCALE_FIELDS', as given."""
    return ((alibi_slopes.data.ptr,) if alibi_slopes is not None else ()) + tuple(s.data.ptr for s in scales)


def _forward_key(q, k, v, out, causal, softmax_scale, variant, return_lse, block_mask, out_dtype, window_size,
                 softcap, attention_chunk, alibi_slopes=None, scales: tuple = (), functor: tuple | None = None
                 ) -> tuple | None:
    """The signature of a plain, block-sparse, modified, functor or pre-quantized fp8 attention() call (one flat
    tuple; a functor's signature (features/functors.functor_signature) is one item of it); None when it takes the
    full path. Scalars go in with their types (True == 1 == 1.0)."""
    arrays = arrays_signature(q, k, v, out, alibi_slopes, *scales)
    if arrays is None or arrays[0] is None:
        return None
    window = window_signature(window_size)
    context = context_signature()
    if window is UNKEYED or context is None:
        return None
    return ("attention", arrays, causal, return_lse, type(softmax_scale), softmax_scale, variant,
            None if block_mask is None else (type(block_mask), id(block_mask)), type(out_dtype), out_dtype, window,
            type(softcap), softcap, type(attention_chunk), attention_chunk, context, functor)


def cached_forward(q, k, v, *, causal: bool, softmax_scale: float | None, return_lse: bool, window_size=None,
                   softcap: float = 0.0, alibi_slopes: Any = None, attention_chunk: int = 0) -> CachedLaunch | None:
    """The call cache's entry of a plain or modified attention() call on these CuPy arrays (what the same call
    would run next time: flashkit.torch's direct path keys it by the tensors behind the arrays), or None."""
    key = _forward_key(q, k, v, None, check_flag(causal, "causal"), softmax_scale, None,
                       check_flag(return_lse, "return_lse"), None, None, window_size, softcap, attention_chunk,
                       alibi_slopes)
    entry = None if key is None else CALLS.get(key)
    return entry if type(entry) is _CachedForward else None


def request_for(problem: Problem, cc: tuple[int, int] | None = None, **flags: bool) -> Request:
    return Request(dtype=problem.dtype, head_dim=problem.head_dim, seqlen_q=problem.seqlen_q,
                   seqlen_k=problem.seqlen_k, heads=problem.heads, kv_heads=problem.kv_heads,
                   batch=problem.batch, cc=cc, head_dim_v=problem.head_dim_v, **flags)


def explain(*, dtype: str = "bfloat16", head_dim: int = 128, seqlen_q: int = 1024, seqlen_k: int | None = None,
            heads: int = 16, kv_heads: int | None = None, batch: int = 1, causal: bool = False,
            block_sparse: bool = False, fp8: bool = False, lse: bool = False,
            cc: tuple[int, int] | None = None, variant: str | None = None, window: bool = False,
            softcap: bool = False, alibi: bool = False, varlen: bool = False,
            head_dim_v: int | None = None, backward: bool = False) -> Selection:
    """Which kernel a request would run (backward: its attention_backward), and why every other was rejected;
    launches nothing."""
    dt = dtype_by_name(dtype)
    req = Request(dtype=dt.name, head_dim=head_dim, seqlen_q=seqlen_q, seqlen_k=seqlen_k or seqlen_q,
                  heads=heads, kv_heads=kv_heads or heads, batch=batch, causal=causal,
                  block_sparse=block_sparse, fp8=fp8 or dt is FLOAT8_E4M3, lse=lse, cc=cc, window=window,
                  softcap=softcap, alibi=alibi, varlen=varlen, head_dim_v=head_dim_v, backward=backward)
    sel = select_kernel(req, discover_kernels().specs, variant)
    compiled = sel.chosen.head_dims.class_of(head_dim)
    if compiled != head_dim:
        sel.notes.append(f"head_dim={head_dim} runs as head-dim class {compiled} (columns {head_dim}..{compiled - 1} "
                         "zero-filled, not stored)")
    if req.split_head_dim:
        compiled_v = sel.chosen.head_dims.class_of(head_dim_v)
        tensors = "v, dout and dv" if backward else "v and the output"
        sel.notes.append(f"head_dim_v={head_dim_v}: {tensors} run as head-dim class {compiled_v} under "
                         f"q / k's {compiled}" + (f" (columns {head_dim_v}..{compiled_v - 1} zero-filled, not stored)"
                                                  if compiled_v != head_dim_v else ""))
    if cc is not None:   # the launch table this architecture takes (manifest launch and overrides)
        table = launch_table(sel.chosen, cc, head_dim, req.build_mods, causal, block_sparse, seqlen_q)
        sel.notes.append(f"tiles on sm_{cc[0]}{cc[1]}: " + " ".join(f"{k}={v}" for k, v in sorted(table.items())))
    info = device_info() if device_count() else None   # the grid notes follow this device's SMs (or assume)
    if "tiles" in sel.chosen.grids:   # persistent or one CTA a tile
        from .runtime.tile_balance import grid_note
        sel.notes.append(grid_note(sel.chosen, req, info and info.sm_count))
    if "kv_splits" in sel.chosen.grids:   # the split-KV path: how many key chunks
        from .runtime.kv_split import split_note
        sel.notes.append(split_note(sel.chosen, req, info and info.sm_count,
                                    info and info.max_smem_per_block + 1024, info.memory_bandwidth if info else 0.0))
    return sel


def variants() -> list[KernelSpec]:
    """Every registered variant, highest priority first."""
    return sorted(discover_kernels().specs.values(), key=lambda s: (-s.priority, s.name))


def _output_dtype(problem: Problem, fp8: bool, out_dtype: str | None) -> str:
    if not fp8:
        if out_dtype not in (None, problem.dtype):
            raise InputError(f"out_dtype: only fp8 calls choose the output dtype; expected None or {problem.dtype}")
        return problem.dtype
    name = out_dtype or (problem.dtype if problem.dtype in FP8_OUT_DTYPES else "bfloat16")
    if name not in FP8_OUT_DTYPES:
        raise InputError(f"out_dtype: expected one of {', '.join(FP8_OUT_DTYPES)}, got {name!r}")
    return name


def _output(out: Any, problem: Problem, dtype: str, cupy, shape: tuple[int, ...] | None = None):
    """The caller's `out` checked (shape: (batch, seqlen_q, heads, head_dim_v) unless given), or a new array."""
    shape = shape or (problem.batch, problem.seqlen_q, problem.heads, problem.head_dim_v)
    storage = BY_NAME[dtype].storage
    if out is None:
        return cupy.empty(shape, dtype=storage)
    arr = to_cupy(out, "out")
    if tuple(arr.shape) != shape or arr.dtype != storage:
        raise InputError(f"out: expected shape {shape} and dtype {dtype}, got {tuple(arr.shape)} {arr.dtype}")
    if arr.size and (arr.strides[-1] != arr.itemsize or arr.data.ptr % ALIGN_BYTES or
                     any(s % ALIGN_BYTES for s in arr.strides[:-1])):   # (an empty array's strides may read 0)
        raise InputError("out: expected a 16-byte aligned array with a contiguous last dimension")
    return arr


def _negate_scale(q, problem: Problem, cupy):
    """softmax(c q k^T) = softmax(|c| (-q) k^T): -q (its sign bits flipped, any element type) and |c|.

    The kernels' online softmax subtracts the running maximum of the raw scores, which is the maximum
    of the scaled ones only when c > 0 (with c < 0 it overflows and turns O into NaN).
    """
    bits = q.dtype.itemsize * 8
    unsigned = cupy.dtype(f"uint{bits}")
    flipped = cupy.bitwise_xor(q.view(unsigned), unsigned.type(1 << (bits - 1)))
    return flipped.view(q.dtype), replace(problem, softmax_scale=-problem.softmax_scale)


def _aligned(a):
    """a itself when 16-byte vector loads can read it, else a contiguous copy in fresh (aligned) memory: not
    ascontiguousarray, which returns a contiguous array at a misaligned address as it is."""
    if a.data.ptr % ALIGN_BYTES or any(s % ALIGN_BYTES for s, n in zip(a.strides[:-1], a.shape[:-1]) if n > 1):
        return a.copy(order="C")
    return a


def _fp8_options(options: dict | None) -> dict:
    unknown = set(options or {}) - {"block", "hadamard", "seed"}
    if unknown:
        raise InputError(f"fp8_options: unknown key(s) {', '.join(sorted(unknown))}; known: block, hadamard, seed")
    return dict(options or {})


def _check_block_mask(mask: Any, problem: Problem, functor: Any = None) -> None:
    """block_mask: a flashkit.BlockMask of the call's geometry; beside a drop-in functor only a score_mod (the kernels
    take their tiles from one list: a mask_mod's blocks fold into the functor's mask_mod)."""
    from .features.block_mask import BlockMask
    if not isinstance(mask, BlockMask):
        raise InputError(f"block_mask: expected a flashkit.BlockMask, got {type(mask).__name__}")
    if functor is not None and functor.spec.mask:
        raise InputError(f"block_mask: cannot be combined with {functor.spec.name}'s mask_mod (fold the blocks into "
                         f"the functor's mask_mod)")
    mask.check_compatible(problem)


__all__ = ["attention", "explain", "variants", "check_scale"]
