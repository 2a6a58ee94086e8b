"""Variable-length batches (flash-attn's varlen layout), checked before anything is compiled or launched.

q (total_q, heads, D) and k, v (total_k, kv_heads, D) hold the batch's sequences back to back; sequence b
is rows [cu_seqlens_q[b], cu_seqlens_q[b + 1]) of q and [cu_seqlens_k[b], cu_seqlens_k[b + 1]) of k and v.
The kernels run the grid of the longest sequence (max_seqlen_q, max_seqlen_k), so the call's Problem is
(batch, max_seqlen_q, max_seqlen_k, ...); include/flashkit/varlen.cuh shows each CTA its own sequence.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

import numpy as np

from ..call.arrays import ArrayMeta
from ..call.validate import Problem, check_device, check_on_gpu, validate_inputs
from ..errors import InputError
from ..runtime.call_cache import arrays_signature

PACKED_RANK = 3
PACKED_LAYOUT = "(total_tokens, heads, head_dim)"


@dataclass(frozen=True)
class VarlenCall:
    """A checked varlen call: the kernel's problem and the packed token counts."""

    problem: Problem          # batch = sequences, seqlen_q / seqlen_k = the longest of each
    total_q: int
    total_k: int


def _batched(m: ArrayMeta) -> ArrayMeta:
    """A packed (total, heads, D) array as a batch of one, for the dense checks (a zero total reads as 1)."""
    if len(m.shape) != PACKED_RANK:
        raise InputError(f"{m.name}: expected {PACKED_RANK} dims {PACKED_LAYOUT}, got shape {m.shape}")
    total, heads, dim = m.shape
    strides = m.strides if total else (heads * dim, dim, 1)   # an empty array's strides may read as zeros
    return replace(m, shape=(1, max(total, 1), heads, dim), strides=(max(total, 1) * strides[0],) + strides)


def _check_cu(m: ArrayMeta, name: str, device: int | None) -> int:
    """cu_seqlens: an int32 CUDA vector of batch + 1 >= 2 entries; returns the batch."""
    check_on_gpu(m)
    if m.dtype != np.int32:
        raise InputError(f"{name}: expected dtype int32, got {m.dtype}")
    if len(m.shape) != 1 or m.shape[0] < 2:
        raise InputError(f"{name}: expected shape (batch + 1,) with batch >= 1, got {m.shape}")
    if m.strides[0] != 1:
        raise InputError(f"{name}: expected a contiguous vector, got stride {m.strides[0]}")
    check_device(m, device)
    return m.shape[0] - 1


def _check_max(value: Any, name: str) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < 0:
        raise InputError(f"{name}: expected an int >= 0 (the longest sequence), got {value!r}")
    return int(value)


def validate_varlen(q: ArrayMeta, k: ArrayMeta, v: ArrayMeta, cu_q: ArrayMeta, cu_k: ArrayMeta,
                    max_seqlen_q: Any, max_seqlen_k: Any, softmax_scale: float | None) -> VarlenCall:
    """Every metadata check of a varlen call; InputError names the argument and what was expected."""
    dense = validate_inputs(_batched(q), _batched(k), _batched(v), softmax_scale)
    if dense.dtype == "float32":
        raise InputError("q: varlen runs on the flash kernels, which take float16 or bfloat16; got float32")
    batch = _check_cu(cu_q, "cu_seqlens_q", q.device)
    if _check_cu(cu_k, "cu_seqlens_k", q.device) != batch:
        raise InputError(f"cu_seqlens_k: expected shape ({batch + 1},) like cu_seqlens_q, got {cu_k.shape}")
    max_q, max_k = _check_max(max_seqlen_q, "max_seqlen_q"), _check_max(max_seqlen_k, "max_seqlen_k")
    problem = replace(dense, batch=batch, seqlen_q=max_q, seqlen_k=max_k)
    return VarlenCall(problem, q.shape[0], k.shape[0])


def check_values(call: VarlenCall, cu_q: Any, cu_k: Any) -> None:
    """The offsets themselves (one small device-to-host read): from 0, non-decreasing, ending at the totals,
    no sequence longer than max_seqlen."""
    for arr, name, total, longest in ((cu_q, "cu_seqlens_q", call.total_q, call.problem.seqlen_q),
                                      (cu_k, "cu_seqlens_k", call.total_k, call.problem.seqlen_k)):
        host = arr.get()
        lengths = np.diff(host)
        if host[0] != 0:
            raise InputError(f"{name}: expected to start at 0, got {int(host[0])}")
        if (lengths < 0).any():
            at = int(np.argmax(lengths < 0))
            raise InputError(f"{name}: expected non-decreasing offsets, got {int(host[at])} then {int(host[at + 1])}")
        if host[-1] != total:
            raise InputError(f"{name}: expected to end at the {total} packed tokens, got {int(host[-1])}")
        if lengths.max() > longest:
            which = "max_seqlen_q" if name.endswith("_q") else "max_seqlen_k"
            raise InputError(f"{which}: expected >= the longest sequence ({int(lengths.max())}), got {longest}")


VARLEN_FIELDS = ("varlen.cu_seqlens_q", "varlen.cu_seqlens_k")   # a cached call's per-call addresses (kernel_fields)


def packed_key(kind: str, cu_q: Any, cu_k: Any, max_seqlen_q: Any, max_seqlen_k: Any,
               dense_key: Callable[[], tuple | None]) -> tuple | None:
    """The call-cache key of a packed call (attention_varlen, its backward): its dense call's key (dense_key(), asked
    only where the offsets have a signature) with the offsets' signatures and the longest lengths (with their types);
    None for the full path."""
    offsets = arrays_signature(cu_q, cu_k)
    if offsets is None or None in offsets:
        return None
    key = dense_key()
    return None if key is None else (kind, key, offsets, type(max_seqlen_q), max_seqlen_q, type(max_seqlen_k),
                                     max_seqlen_k)


def offsets_pointers(cu_q: Any, cu_k: Any, alibi_slopes: Any = None) -> tuple[int, ...]:
    """The addresses a cached packed call puts in: VARLEN_FIELDS', then the slopes' (api.ALIBI_FIELDS) if any."""
    return (cu_q.data.ptr, cu_k.data.ptr) + ((alibi_slopes.data.ptr,) if alibi_slopes is not None else ())


def kernel_fields(cu_q: Any, cu_k: Any, total_q: int) -> dict:
    """Params.varlen and the (heads, total_q) LSE's strides."""
    return {"varlen": {"cu_seqlens_q": cu_q.data.ptr, "cu_seqlens_k": cu_k.data.ptr},
            "lse_batch_stride": 0, "lse_head_stride": total_q}
