"""Checks before any transfer: each rank's inputs alone, then one small all-gather so every rank agrees.

A rank whose inputs are bad still joins the all-gather (with an error code), so that every rank raises,
none waits for a transfer that never comes; the all-gather itself has a timeout.
"""

from __future__ import annotations

import math
import numbers
import struct
import time
from dataclasses import dataclass
from functools import lru_cache
from datetime import timedelta
from typing import Any

from ..errors import FlashkitError, InputError
from .errors import CollectiveTimeoutError, DistributedError, RankMismatchError
from .plan import LAYOUTS

DTYPES = {"torch.float16": 1, "torch.bfloat16": 2, "torch.float32": 3}
FIELDS = ("error", "batch", "seqlen_q", "seqlen_k", "heads", "kv_heads", "head_dim", "dtype", "causal",
          "layout", "scale")
ERRORS = {1: "inputs are not torch tensors", 2: "inputs are not on a CUDA device",
          3: "inputs are not on the rank's current CUDA device", 4: "q, k, v are inconsistent (shape or dtype)",
          5: "causal zigzag shards need an even local length", 6: "causal ring attention needs equal local "
          "q and k lengths", 7: "an argument (causal, layout, softmax_scale) is invalid",
          8: "no flashkit kernel fits its local blocks"}


@dataclass(frozen=True)
class LocalCall:
    """What a rank holds: its signature for the all-gather and, if its inputs are bad, the error."""

    signature: tuple[int, ...]
    error: FlashkitError | None = None


def check_local(q: Any, k: Any, v: Any, causal: bool, layout: str, softmax_scale: float | None,
                current_device: int | None, variant: str | None = None) -> LocalCall:
    """Check one rank's q, k, v on metadata alone; never raises for bad inputs (the error rides along)."""
    from ._torch import is_torch_tensor
    if not isinstance(causal, bool):
        return LocalCall(_signature(7), InputError(f"causal: expected True or False, got {causal!r}"))
    if layout not in LAYOUTS:
        return LocalCall(_signature(7), InputError(f"layout: expected one of {', '.join(LAYOUTS)}, got {layout!r}"))
    for name, x in zip(("q", "k", "v"), (q, k, v)):
        if not is_torch_tensor(x):
            return LocalCall(_signature(1), InputError(
                f"{name}: ring_attention takes torch tensors (the ring sends them through torch.distributed), "
                f"got {type(x).__module__.split('.')[0]}.{type(x).__name__}"))
        if not x.is_cuda:
            return LocalCall(_signature(2), InputError(f"{name}: expected a CUDA tensor, got one on {x.device}"))
        if current_device is not None and x.device.index != current_device:
            return LocalCall(_signature(3), InputError(
                f"{name}: on {x.device}, but this rank's current device is cuda:{current_device} "
                "(call torch.cuda.set_device(local_rank) and put the shards there)"))
    try:
        _check_shapes(q, k, v)
        scale = _check_scale(softmax_scale, q.shape[-1])
    except InputError as e:
        return LocalCall(_signature(4), e)
    b, sq, h, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    sig = _signature(0, b, sq, sk, h, hk, d, DTYPES[str(q.dtype)], int(causal), LAYOUTS.index(layout),
                     _float_bits(scale))
    if causal and sq != sk:
        return LocalCall(_with_error(sig, 6), InputError(
            f"k: causal ring attention needs local q and k of equal length, got {sq} and {sk}"))
    if causal and layout == "zigzag" and sq % 2:
        return LocalCall(_with_error(sig, 5), InputError(
            f"q: a causal zigzag shard holds two equal chunks, so its length must be even, got {sq} "
            "(shard with flashkit.distributed.shard_zigzag: the full length divisible by 2 * world_size)"))
    if current_device is not None:
        try:
            _check_kernels(q, k, causal, current_device, variant)
        except FlashkitError as e:
            return LocalCall(_with_error(sig, 8), e)
    return LocalCall(sig)


def _check_shapes(q: Any, k: Any, v: Any) -> None:
    """flashkit's layout rules, on torch metadata: (batch, seqlen, heads, head_dim), GQA, one dtype."""
    for name, x in zip(("q", "k", "v"), (q, k, v)):
        if x.dim() != 4 or 0 in x.shape:
            raise InputError(f"{name}: expected 4 dims (batch, seqlen, heads, head_dim), each >= 1, "
                             f"got shape {tuple(x.shape)}")
        if str(x.dtype) not in DTYPES:
            raise InputError(f"{name}: dtype {x.dtype} is not supported; expected float16, bfloat16 or float32")
        if x.stride(-1) != 1:
            raise InputError(f"{name}: the last (head_dim) dimension must be contiguous, got strides {x.stride()}")
    if not q.dtype == k.dtype == v.dtype:
        raise InputError(f"k, v: dtypes must match q's ({q.dtype}), got k {k.dtype} and v {v.dtype}")
    if k.shape != v.shape:
        raise InputError(f"v: expected the shape of k {tuple(k.shape)}, got {tuple(v.shape)}")
    if k.shape[0] != q.shape[0] or k.shape[3] != q.shape[3]:
        raise InputError(f"k: batch and head_dim must match q's {tuple(q.shape)}, got {tuple(k.shape)}")
    if q.shape[2] % k.shape[2]:
        raise InputError(f"k: kv heads ({k.shape[2]}) must divide q's heads ({q.shape[2]})")


def _check_scale(softmax_scale: Any, head_dim: int) -> float:
    if softmax_scale is None:
        return 1.0 / math.sqrt(head_dim)
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, numbers.Real) \
            or not math.isfinite(softmax_scale) or softmax_scale == 0:
        raise InputError(f"softmax_scale: expected a finite non-zero float, got {softmax_scale!r}")
    return float(softmax_scale)


def _check_kernels(q: Any, k: Any, causal: bool, device: int, variant: str | None) -> None:
    """UnsupportedError now, rather than mid-ring, when no kernel (or not the forced one) fits a step."""
    import torch
    b, sq, h, d = q.shape
    _kernels_fit(str(q.dtype).split(".")[1], d, sq, k.shape[1], h, k.shape[2], b, causal,
                 tuple(torch.cuda.get_device_capability(device)), variant)


@lru_cache(maxsize=256)
def _kernels_fit(dtype: str, d: int, sq: int, sk: int, h: int, hk: int, b: int, causal: bool,
                 cc: tuple[int, int], variant: str | None) -> bool:
    """Selection for a call's blocks, once per signature (an error is not cached, so it recurs)."""
    from .. import explain
    for block_causal in ((True, False) if causal else (False,)):
        explain(dtype=dtype, head_dim=d, seqlen_q=sq, seqlen_k=sk, heads=h, kv_heads=hk, batch=b,
                causal=block_causal, lse=True, cc=cc, variant=variant)
    return True


def agree_across_ranks(local: LocalCall, group: Any, rank: int, world_size: int, device: Any,
                       timeout: float) -> None:
    """All-gather the signatures (with a timeout) and raise the same kind of error on every rank on a mismatch."""
    if world_size > 1:
        import torch
        dist = torch.distributed
        mine = torch.tensor(local.signature, dtype=torch.int64, device=device)
        every = torch.empty(world_size * len(FIELDS), dtype=torch.int64, device=device)
        work = dist.all_gather_into_tensor(every, mine, group=group, async_op=True)
        wait_or_raise(work, timeout, "ring_attention's input check (all_gather of every rank's shapes)")
        rows = [tuple(int(x) for x in r) for r in every.view(world_size, len(FIELDS)).cpu().tolist()]
    else:
        rows = [local.signature]
    if local.error is not None:
        raise local.error
    compare_signatures(rows, rank)


def compare_signatures(rows: list[tuple[int, ...]], rank: int) -> None:
    """RankMismatchError if any rank reported an error or a signature unlike this rank's."""
    for r, row in enumerate(rows):
        if row[0]:
            raise RankMismatchError(f"ring_attention: rank {r} rejected its inputs ({ERRORS.get(row[0], row[0])}); "
                                    "no transfer was made on any rank")
    mine = rows[rank]
    differ = [f for i, f in enumerate(FIELDS) if any(row[i] != mine[i] for row in rows)]
    if differ:
        shapes = "; ".join(f"rank {r}: " + ", ".join(f"{f}={_show(f, row[FIELDS.index(f)])}" for f in differ)
                           for r, row in enumerate(rows))
        raise RankMismatchError(f"ring_attention: the ranks disagree on {', '.join(differ)} "
                                f"(unequal shards or mismatched calls): {shapes}; no transfer was made")


def wait_or_raise(work: Any, timeout: float, what: str) -> None:
    """Wait for an async collective at most `timeout` seconds; CollectiveTimeoutError otherwise."""
    if not (isinstance(timeout, (int, float)) and math.isfinite(timeout) and timeout > 0):
        raise InputError(f"timeout: expected a positive number of seconds, got {timeout!r}")
    start = time.monotonic()
    try:
        done = work.wait(timeout=timedelta(seconds=timeout))
    except Exception as e:   # NCCL and Gloo raise (DistBackendError, RuntimeError) on a timeout
        text = str(e).lower()
        if "time" in text or time.monotonic() - start >= 0.9 * timeout:
            raise CollectiveTimeoutError(f"{what}: no answer from every rank within {timeout:g} s "
                                         f"(a rank did not call, or died): {str(e).splitlines()[0]}") from None
        raise DistributedError(f"{what} failed: {type(e).__name__}: {str(e).splitlines()[0]}") from None
    if done is False:
        raise CollectiveTimeoutError(f"{what}: no answer from every rank within {timeout:g} s")


def _signature(error: int, *fields: int) -> tuple[int, ...]:
    out = (error, *fields)
    return out + (0,) * (len(FIELDS) - len(out))


def _with_error(sig: tuple[int, ...], error: int) -> tuple[int, ...]:
    return (error,) + sig[1:]


def _float_bits(x: float) -> int:
    return struct.unpack("<q", struct.pack("<d", float(x)))[0]


def _show(field: str, value: int) -> str:
    if field == "scale":
        return f"{struct.unpack('<d', struct.pack('<q', value))[0]:g}"
    if field == "dtype":
        return {v: k.split(".")[1] for k, v in DTYPES.items()}.get(value, str(value))
    if field == "layout":
        return LAYOUTS[value] if 0 <= value < len(LAYOUTS) else str(value)
    return str(value)
