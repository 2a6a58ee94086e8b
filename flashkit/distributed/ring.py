"""ring_attention: sequence-parallel (context-parallel) attention over a torch.distributed NCCL group.

Each rank holds a shard of the sequence (zigzag by default: flashkit.distributed.shard_zigzag); K/V
shards travel around the ring (comm.RingExchange) while flashkit's kernel computes on the one already
there; the partial (O, LSE) pairs merge exactly in fp32 (merge.merge_into). The backward runs the same
plan: K/V travel forward again, each block's dQ stays, and its dK/dV (fp32) travel with the K/V shard
they belong to and come home after the last step (ring_backward). ring_attention is differentiable.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

from ._torch import require_torch
from .plan import step_blocks
from .validation import agree_across_ranks, check_local

DEFAULT_TIMEOUT_S = 120.0


def ring_attention(q: Any, k: Any, v: Any, *, group: Any = None, causal: bool = False,
                   softmax_scale: float | None = None, return_lse: bool = False, layout: str = "zigzag",
                   timeout: float = DEFAULT_TIMEOUT_S, variant: str | None = None):
    """Attention over the whole sequence, each rank holding one shard of q, k, v (batch, local_seqlen, heads, d).

    causal=True expects zigzag shards (layout="zigzag", the default: shard_zigzag) or, less balanced,
    contiguous ones (layout="contiguous": rank r holds the r-th slice). Returns this rank's rows of the
    output (torch, q's dtype) and, with return_lse=True, their LSE (float32, (batch, heads, local_seqlen)).
    Every rank checks its inputs and all ranks agree on shapes (a timed all-gather) before any transfer.
    With a group of one rank (or torch.distributed not initialized) this is local flashkit attention.
    Differentiable: with q, k or v requiring grad, the backward runs around the ring too (ring_backward).
    variant= forces flashkit's kernel for every local step (as in flashkit.attention).
    """
    torch = require_torch()
    dist = torch.distributed
    distributed = dist.is_available() and dist.is_initialized()
    rank = dist.get_rank(group) if distributed else 0
    if rank < 0:
        from ..errors import InputError
        raise InputError("group: this process is not a member of the group it passed")
    world_size = dist.get_world_size(group) if distributed else 1
    current = torch.cuda.current_device() if torch.cuda.is_available() else None
    local = check_local(q, k, v, causal, layout, softmax_scale, current, variant)
    device = _signature_device(torch, group, distributed, current)
    if world_size > 1 and device.type == "cuda":
        from .comm import comm_stream
        with torch.cuda.stream(comm_stream(device)):   # an idle stream: the check need not wait for compute
            agree_across_ranks(local, group, rank, world_size, device, timeout)
    else:
        agree_across_ranks(local, group, rank, world_size, device, timeout)
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    ring = dict(group=group, rank=rank, world_size=world_size, causal=causal, scale=scale, layout=layout,
                variant=variant)
    if torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v)):
        out, lse = _ring_function(torch).apply(q, k, v, ring)
    else:
        out, lse = _forward(q, k, v, ring)
    return (out, lse) if return_lse else out


def _forward(q: Any, k: Any, v: Any, ring: dict):
    """(out, lse) of this rank's rows: the ring loop, or local flashkit attention for a group of one."""
    if ring["world_size"] == 1:
        return local_attention(q, k, v, causal=ring["causal"], scale=ring["scale"], variant=ring["variant"])
    return ring_forward(q, k, v, **ring)


def ring_forward(q: Any, k: Any, v: Any, *, group: Any, rank: int, world_size: int, causal: bool, scale: float,
                 layout: str = "zigzag", exchange: Any = None, compute: bool = True, variant: str | None = None,
                 attend: Any = None):
    """The ring loop on validated inputs: W steps, W-1 transfers overlapped with the compute.

    `exchange` replaces the NCCL exchange (comm.LocalExchange times the loop with communication off);
    compute=False runs the transfers alone; `attend(q, k, v, causal, scale) -> (out, lse)` replaces
    flashkit's kernel (the CPU tests run the loop on a Gloo group). Returns (out, lse) of this rank's rows.
    """
    torch = require_torch()
    from .comm import RingExchange, comm_stream
    from .merge import merge_into
    if exchange is None:
        streams = (torch.cuda.current_stream(q.device), comm_stream(q.device)) if q.is_cuda else (None, None)
        exchange = RingExchange(group, rank, world_size, *streams)
    if attend is None:
        def attend(q_, k_, v_, causal_, scale_):
            return local_attention(q_, k_, v_, causal=causal_, scale=scale_, variant=variant)
    held = (k.contiguous(), v.contiguous())   # NCCL sends contiguous buffers
    acc_o = acc_lse = None
    for step in range(world_size):
        last = step == world_size - 1
        if not last:
            exchange.start(held, step)
        if compute:
            for block in step_blocks(rank, step, world_size, q.shape[1], k.shape[1], causal, layout):
                k_s, v_s = held[0][:, block.k0:block.k1], held[1][:, block.k0:block.k1]
                o, l = attend(q[:, block.q0:block.q1], k_s, v_s, block.causal, scale)
                if acc_o is None and block.q0 == 0 and block.q1 == q.shape[1]:
                    acc_o, acc_lse = o.float(), l   # the first partial covers every row (step 0)
                else:
                    merge_into(acc_o, acc_lse, o, l, row0=block.q0)
        if not last:
            held = exchange.finish()
    if acc_o is None:   # compute=False
        return None, None
    return acc_o.to(q.dtype), acc_lse


def local_attention(q: Any, k: Any, v: Any, *, causal: bool, scale: float, out: Any = None,
                    variant: str | None = None):
    """flashkit.attention on torch tensors, launched on torch's current stream: (out, lse) as torch tensors."""
    torch = require_torch()
    import cupy
    from .. import attention
    dev = q.device.index
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    stream = torch.cuda.current_stream(q.device)
    with cupy.cuda.Device(dev), cupy.cuda.ExternalStream(stream.cuda_stream, dev):
        _, lse = attention(q, k, v, causal=causal, softmax_scale=scale, return_lse=True, out=out, variant=variant)
        lse = torch.from_dlpack(lse)   # consumed on the stream that produced it
    return out, lse


def _signature_device(torch, group: Any, distributed: bool, current: int | None):
    """Where the all-gather of signatures lives: the current CUDA device for NCCL, the CPU otherwise."""
    if distributed and "nccl" in str(torch.distributed.get_backend(group)) and current is not None:
        return torch.device("cuda", current)
    return torch.device("cpu")


def ring_backward(dout: Any, q: Any, k: Any, v: Any, out: Any, lse: Any, *, group: Any, rank: int,
                  world_size: int, causal: bool, scale: float, layout: str = "zigzag", exchange: Any = None,
                  grad_exchange: Any = None, attend_backward: Any = None):
    """Gradients of this rank's shards: (dq, dk, dv) in q, k, v's dtypes.

    The forward's plan, step for step. With the merged O and LSE of the forward, each block's
    P = exp(scale q k^T - lse) is its slice of the whole row's softmax and D = rowsum(dO * O) the whole
    row's, so the blocks' gradients add up to the full ones exactly: dQ accumulates here; dK / dV of the
    visiting shard accumulate in fp32 buffers that travel with it (one hop after every step, so after W steps
    each rank holds its own shard's). K / V move as in the forward, overlapped with the compute. So does the
    gradient hop: a step's blocks add into a local buffer, and only then does the rank take the visiting
    shard's gradients from the previous rank (their hop ran under this step's compute), add its part and pass
    them on; the last hop lands after the loop. `attend_backward(dout, q, k, v, out, lse, causal, scale) ->
    (dq, dk, dv)` replaces flashkit's backward kernel (the CPU tests run the loop on a Gloo group).
    """
    torch = require_torch()
    from .comm import RingExchange, comm_stream
    streams = (torch.cuda.current_stream(q.device), comm_stream(q.device)) if q.is_cuda else (None, None)
    exchange = exchange or RingExchange(group, rank, world_size, *streams)
    grad_exchange = grad_exchange or RingExchange(group, rank, world_size, *streams)
    attend_backward = attend_backward or local_backward
    held = (k.contiguous(), v.contiguous())
    fp32_like = lambda x: torch.zeros(x.shape, dtype=torch.float32, device=x.device)  # noqa: E731
    part = (fp32_like(k), fp32_like(v))   # this step's dK, dV of the visiting shard (never sent)
    dq = fp32_like(q)
    for step in range(world_size):
        last = step == world_size - 1
        if not last:
            exchange.start(held, step)
        for t in part:
            t.zero_()
        for block in step_blocks(rank, step, world_size, q.shape[1], k.shape[1], causal, layout):
            rows, keys = slice(block.q0, block.q1), slice(block.k0, block.k1)
            dq_b, dk_b, dv_b = attend_backward(dout[:, rows], q[:, rows], held[0][:, keys], held[1][:, keys],
                                               out[:, rows], lse[:, :, rows].contiguous(), block.causal, scale)
            dq[:, rows] += dq_b.float()
            part[0][:, keys] += dk_b.float()
            part[1][:, keys] += dv_b.float()
        # The visiting shard's gradients so far (none at step 0), plus this rank's part, on to the next rank with
        # the K/V shard they belong to.
        grads = tuple(t.clone() for t in part) if step == 0 else tuple(
            g.add_(t) for g, t in zip(grad_exchange.finish(), part))
        grad_exchange.start(grads, step)
        if not last:
            held = exchange.finish()
    grads = grad_exchange.finish()   # this rank's own shard, complete
    return dq.to(q.dtype), grads[0].to(k.dtype), grads[1].to(v.dtype)


def local_backward(dout: Any, q: Any, k: Any, v: Any, out: Any, lse: Any, causal: bool, scale: float):
    """flashkit.attention_backward on torch tensors, on torch's current stream and allocator."""
    from ..torch import attention_bwd
    return attention_bwd(dout, q, k, v, out, lse, causal, scale, False)


@lru_cache(maxsize=1)
def _ring_function(torch):
    """The autograd Function of ring attention (defined on first use: torch loads lazily)."""
    class RingAttention(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, ring):
            out, lse = _forward(q.detach(), k.detach(), v.detach(), ring)   # flashkit's kernels see plain tensors
            ctx.save_for_backward(q, k, v, out, lse)
            ctx.ring = ring
            ctx.mark_non_differentiable(lse)
            return out, lse

        @staticmethod
        def backward(ctx, dout, _dlse):
            q, k, v, out, lse = ctx.saved_tensors
            ring = {key: val for key, val in ctx.ring.items() if key != "variant"}
            if ring["world_size"] == 1:
                dq, dk, dv = local_backward(dout, q, k, v, out, lse, ring["causal"], ring["scale"])
            else:
                dq, dk, dv = ring_backward(dout.contiguous(), q, k, v, out, lse, **ring)
            return dq, dk, dv, None

    return RingAttention
