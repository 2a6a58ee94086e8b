"""flashkit.torch's hot path: torch tensors of a signature seen before go straight into the launch that the
signature's first call prepared.

A first call takes the full path (CuPy views of the tensors, validation, selection, build) and leaves its
decision in the call cache (runtime/call_cache.py) under the views' signature. flashkit.torch then files that
decision again under the tensors' own signature: every tensor's shape, strides, dtype, device and address modulo
16, each scalar with its type, the current device and the kernel search path. A view shares its tensor's address
and strides, so the views' signature is a function of the tensors' and the same torch signature means the same
decision. A later call of it costs the key, torch.empty for the outputs and the workspace (torch's caching
allocator, ordered on the current stream like any torch op's scratch), the parameter block's addresses and the
launches on torch's current stream: no CuPy view, DLPack exchange, or device, stream and allocator context.
Those cost most of the eager adapter's host time (a forward's and backward's, measured in BENCHMARKS.md), and
about twice as much on autograd's backward thread.

The entries live in the call cache itself, so whatever empties it (a rediscovery of the kernels, clear_loaded)
empties these too.

Packed calls go through CuPy views into attention_varlen's own call cache (a signature seen before skips validation
and selection), not through this direct path; and the one synchronizing read of their offsets' values is skipped
for a cu_seqlens pair that was checked before and has not changed since (offsets_checked).
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

import torch

from .runtime.call_cache import ALIGN_MASK, CALLS, kernel_path

FORWARD, BACKWARD = "torch.attention", "torch.attention_backward"   # the keys' first items
_TENSOR_TYPES = (torch.Tensor, torch.nn.Parameter)                  # subclasses (fake, distributed) take the full path
# torch's current stream as a raw handle: the C function behind torch.cuda.current_stream().cuda_stream, without
# the Stream object it builds (about 8 us a call; an adapter call asks once, and every layer of a model calls).
_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)
_GET_DEVICE = getattr(torch._C, "_cuda_getDevice", None)             # the current device, without torch.cuda's wrapper


def raw_stream(device: int) -> int:
    """torch's current stream on device, as a raw handle."""
    return _RAW_STREAM(device) if _RAW_STREAM is not None else torch.cuda.current_stream(device).cuda_stream


class StreamHandle:
    """A raw stream handle as CuPy reads a stream: .ptr for a kernel launch's stream argument, the CUDA stream
    protocol for cupy.cuda.Stream.from_external."""

    __slots__ = ("ptr",)

    def __init__(self, ptr: int):
        self.ptr = ptr

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.ptr)


def _tensor(t: Any) -> tuple | None:
    """What the full path's checks and launch read of a tensor: shape, strides (elements), dtype, device and
    address modulo 16; None for an absent one."""
    if t is None:
        return None
    if type(t) not in _TENSOR_TYPES:
        raise TypeError   # caught by the key builders: no direct path for this call
    return (t.shape, t.stride(), t.dtype, t.get_device(), t.data_ptr() & ALIGN_MASK)


def _current_device() -> int:
    return _GET_DEVICE() if _GET_DEVICE is not None else torch.cuda.current_device()


def _key(kind: str, tensors: tuple, scalars: tuple) -> tuple | None:
    """kind's key: the tensors' signatures, each scalar with its type (True == 1 == 1.0, which the full path's
    checks tell apart), the current device and the kernel search path; None for a call that cannot take the
    direct path (an argument that is no plain tensor, no CUDA device)."""
    try:
        return (kind, tuple(_tensor(t) for t in tensors), tuple((type(x), x) for x in scalars), _current_device(),
                kernel_path())
    except (TypeError, RuntimeError):
        return None


def forward_key(q, k, v, causal, softmax_scale, window_left, window_right, softcap, alibi_slopes,
                attention_chunk) -> tuple | None:
    """The key of a dense forward of the adapter's ops (their arguments, the LSE always returned)."""
    return _key(FORWARD, (q, k, v, alibi_slopes),
                (causal, softmax_scale, window_left, window_right, softcap, attention_chunk))


def backward_key(dout, q, k, v, out, lse, causal, softmax_scale, deterministic, window_left, window_right, softcap,
                 alibi_slopes, attention_chunk) -> tuple | None:
    """The key of a dense backward of the adapter's ops (their arguments)."""
    return _key(BACKWARD, (dout, q, k, v, out, lse, alibi_slopes),
                (causal, softmax_scale, deterministic, window_left, window_right, softcap, attention_chunk))


def lookup(key: tuple | None) -> Any:
    """The direct launch filed under key, or None."""
    return None if key is None else CALLS.get(key)


def _launch(prepared: Any, tensors: tuple, extra: tuple, device: int) -> None:
    """prepared (runtime/launch.PreparedLaunch) at the addresses of tensors (POINTER_FIELDS' order up to the
    workspace), a workspace of its size from torch's allocator, then extra's; on device's current torch stream
    (the full path's: flashkit.torch runs it on the current device's)."""
    nbytes = prepared.workspace_bytes
    work = torch.empty(nbytes, dtype=torch.uint8, device=device) if nbytes else None
    pointers = (*(t.data_ptr() for t in tensors), work.data_ptr() if work is not None else 0, *extra)
    prepared.run(pointers, StreamHandle(raw_stream(device)))


def _slopes(alibi_slopes) -> tuple[int, ...]:
    """The per-call address after the fixed pointers: ALiBi's slopes (api.ALIBI_FIELDS), when given."""
    return () if alibi_slopes is None else (alibi_slopes.data_ptr(),)


class DirectForward:
    """A dense forward's prepared launch, fed torch tensors: (out, lse) from torch.empty."""

    __slots__ = ("prepared", "out_shape", "out_dtype", "lse_shape")

    def __init__(self, prepared: Any, out_shape: tuple, out_dtype: torch.dtype, lse_shape: tuple):
        self.prepared, self.out_shape, self.out_dtype, self.lse_shape = prepared, out_shape, out_dtype, lse_shape

    def __call__(self, q, k, v, alibi_slopes=None) -> tuple[torch.Tensor, torch.Tensor]:
        device = _current_device()   # the key's: outputs where the full path allocates them
        out = torch.empty(self.out_shape, dtype=self.out_dtype, device=device)
        lse = torch.empty(self.lse_shape, dtype=torch.float32, device=device)
        _launch(self.prepared, (q, k, v, out, lse), _slopes(alibi_slopes), device)
        return out, lse


class DirectBackward:
    """A dense backward's prepared launch, fed torch tensors: (dq, dk, dv) from torch.empty."""

    __slots__ = ("prepared", "shapes", "dtype")

    def __init__(self, prepared: Any, shapes: tuple, dtype: torch.dtype):
        self.prepared, self.shapes, self.dtype = prepared, shapes, dtype

    def __call__(self, dout, q, k, v, out, lse, alibi_slopes=None) -> tuple[torch.Tensor, ...]:
        device = _current_device()
        grads = tuple(torch.empty(shape, dtype=self.dtype, device=device) for shape in self.shapes)
        # Params.bwd's per-call pointers follow POINTER_FIELDS: dout, then the gradients (backward.BWD_POINTERS)
        _launch(self.prepared, (q, k, v, out, lse), (dout.data_ptr(), *(g.data_ptr() for g in grads),
                                                     *_slopes(alibi_slopes)), device)
        return grads


def remember_forward(key: tuple | None, entry: Any, q: torch.Tensor) -> None:
    """File the full path's cached forward (api.cached_forward) under the tensors' key; nothing when the call
    left no entry (a copy, a negated scale) or its output is not of q's element size."""
    if key is not None and entry is not None and entry.lse_shape is not None and (
            entry.out_storage.itemsize == q.element_size()):
        CALLS.put(key, DirectForward(entry.prepared, entry.out_shape, q.dtype, entry.lse_shape))


def remember_backward(key: tuple | None, entry: Any, q: torch.Tensor) -> None:
    """File the full path's cached backward (backward.cached_backward) under the tensors' key."""
    if key is not None and entry is not None and entry.storage.itemsize == q.element_size():
        CALLS.put(key, DirectBackward(entry.prepared, entry.shapes, q.dtype))


# Offsets a packed call checked: (id(cu_seqlens_q), id(cu_seqlens_k), the lengths they were checked against) ->
# (weak references to both, their versions and addresses). At most MAX_CHECKED_OFFSETS pairs (oldest dropped).
MAX_CHECKED_OFFSETS = 16
_CHECKED: dict[tuple, tuple] = {}


def _offsets_state(cu_q: torch.Tensor, cu_k: torch.Tensor) -> tuple:
    """What must stay for a checked pair to count as unchanged: each tensor's version counter (which every
    in-place torch op bumps) and address."""
    return cu_q._version, cu_k._version, cu_q.data_ptr(), cu_k.data_ptr()


def offsets_checked(cu_q: Any, cu_k: Any, lengths: tuple) -> bool:
    """Whether these cu_seqlens tensors, unmodified since, passed the varlen check of their values
    (features/varlen.check_values: one synchronizing read) against the same lengths (max_seqlen_q, max_seqlen_k,
    total_q, total_k). transformers hands one pair to every layer of a forward; the first layer reads it."""
    record = _CHECKED.get((id(cu_q), id(cu_k), lengths))
    return (record is not None and record[0]() is cu_q and record[1]() is cu_k
            and record[2] == _offsets_state(cu_q, cu_k))


def remember_checked(cu_q: Any, cu_k: Any, lengths: tuple) -> None:
    """Record a pair whose values a call just checked (plain tensors only: others have no version counter)."""
    if type(cu_q) not in _TENSOR_TYPES or type(cu_k) not in _TENSOR_TYPES:
        return
    if len(_CHECKED) >= MAX_CHECKED_OFFSETS:
        try:   # the oldest record (another thread may have emptied or trimmed the map meanwhile)
            _CHECKED.pop(next(iter(_CHECKED)))
        except (StopIteration, KeyError, RuntimeError):
            pass
    _CHECKED[(id(cu_q), id(cu_k), lengths)] = (weakref.ref(cu_q), weakref.ref(cu_k), _offsets_state(cu_q, cu_k))


def packed_lengths(q, k, max_seqlen_q, max_seqlen_k) -> tuple | None:
    """What a packed call's offsets are checked against: (max_seqlen_q, max_seqlen_k, total_q, total_k); None
    for inputs without a packed shape (the full path names them)."""
    try:
        return max_seqlen_q, max_seqlen_k, q.shape[0], k.shape[0]
    except (AttributeError, IndexError, TypeError):
        return None


def checking_offsets_once(run: Callable[[bool], Any], q, k, cu_q, cu_k, max_seqlen_q, max_seqlen_k) -> Any:
    """run(check_indices) for a packed call: check_indices False where this cu_seqlens pair was checked against the
    call's lengths before and is unchanged (offsets_checked); a pair whose values pass is recorded (run raises
    otherwise), so that later layers skip the read."""
    lengths = packed_lengths(q, k, max_seqlen_q, max_seqlen_k)
    checked = offsets_checked(cu_q, cu_k, lengths)
    result = run(not checked)
    if not checked:
        remember_checked(cu_q, cu_k, lengths)
    return result
