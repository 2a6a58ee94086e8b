"""Zigzag sequence sharding: shard r of W holds chunks r and 2W-1-r of 2W equal chunks.

Works on NumPy, CuPy and torch arrays alike (the sequence dimension is `dim`, 1 in flashkit's
(batch, seqlen, heads, head_dim) layout). Causal work is balanced because every shard pairs an
early chunk (few keys visible) with a late one (many).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..errors import InputError
from ._torch import is_torch_tensor


def zigzag_chunks(rank: int, world_size: int) -> tuple[int, int]:
    """The two chunk indices (of 2 * world_size) that shard `rank` holds, in order."""
    _check_rank(rank, world_size)
    return rank, 2 * world_size - 1 - rank


def zigzag_positions(rank: int, world_size: int, seqlen: int) -> np.ndarray:
    """Global sequence positions of the rows of shard `rank` of a `seqlen`-long sequence."""
    chunk = _chunk_len(seqlen, world_size, "seqlen")
    a, b = zigzag_chunks(rank, world_size)
    return np.concatenate([np.arange(a * chunk, (a + 1) * chunk), np.arange(b * chunk, (b + 1) * chunk)])


def zigzag_permutation(seqlen: int, world_size: int) -> np.ndarray:
    """Global positions in shard order: full[perm] == concat(shard_0, ..., shard_{W-1})."""
    return np.concatenate([zigzag_positions(r, world_size, seqlen) for r in range(world_size)])


def shard_zigzag(x: Any, rank: int, world_size: int, dim: int = 1) -> Any:
    """Shard `rank` of a full sequence x: chunks rank and 2W-1-rank along `dim`, concatenated (a copy)."""
    _check_rank(rank, world_size)
    dim = _axis(x, dim)
    chunk = _chunk_len(x.shape[dim], world_size, f"x.shape[{dim}]")
    a, b = zigzag_chunks(rank, world_size)
    return _concat(x, [_slice(x, dim, a * chunk, (a + 1) * chunk), _slice(x, dim, b * chunk, (b + 1) * chunk)], dim)


def unshard_zigzag(shards: Sequence[Any], dim: int = 1) -> Any:
    """The full sequence from the W zigzag shards (shards[r] is rank r's), in position order."""
    world_size = len(shards)
    if world_size == 0:
        raise InputError("shards: expected one shard per rank, got none")
    dim = _axis(shards[0], dim)
    lengths = {s.shape[dim] for s in shards}
    if len(lengths) != 1:
        raise InputError(f"shards: every shard must have the same length along dim {dim}, got {sorted(lengths)}")
    local = lengths.pop()
    if local % 2:
        raise InputError(f"shards: a zigzag shard holds two equal chunks, so its length must be even, got {local}")
    chunk = local // 2
    pieces: list[Any] = [None] * (2 * world_size)
    for r, s in enumerate(shards):
        a, b = zigzag_chunks(r, world_size)
        pieces[a], pieces[b] = _slice(s, dim, 0, chunk), _slice(s, dim, chunk, local)
    return _concat(shards[0], pieces, dim)


def gather_zigzag(local: Any, group: Any = None, dim: int = 1, timeout: float = 60.0) -> Any:
    """All-gather every rank's zigzag shard (torch) and return the full sequence on every rank."""
    from .validation import wait_or_raise
    from ._torch import require_torch
    torch = require_torch()
    dist = torch.distributed
    world = dist.get_world_size(group)
    parts = [torch.empty_like(local) for _ in range(world)]
    wait_or_raise(dist.all_gather(parts, local.contiguous(), group=group, async_op=True), timeout, "gather_zigzag")
    return unshard_zigzag(parts, dim)


def _check_rank(rank: int, world_size: int) -> None:
    if not isinstance(world_size, (int, np.integer)) or world_size < 1:
        raise InputError(f"world_size: expected an integer >= 1, got {world_size!r}")
    if not isinstance(rank, (int, np.integer)) or not 0 <= rank < world_size:
        raise InputError(f"rank: expected an integer in [0, {world_size}), got {rank!r}")


def _chunk_len(seqlen: int, world_size: int, name: str) -> int:
    if seqlen % (2 * world_size):
        raise InputError(f"{name}: zigzag sharding cuts the sequence into 2 * world_size = {2 * world_size} "
                         f"equal chunks, so its length must be divisible by {2 * world_size}, got {seqlen}")
    return seqlen // (2 * world_size)


def _axis(x: Any, dim: int) -> int:
    ndim = len(x.shape)
    if not -ndim <= dim < ndim:
        raise InputError(f"dim: expected a dimension of a {ndim}-d array, got {dim}")
    return dim % ndim


def _slice(x: Any, dim: int, start: int, stop: int) -> Any:
    index = [slice(None)] * len(x.shape)
    index[dim] = slice(start, stop)
    return x[tuple(index)]


def _concat(like: Any, parts: list[Any], dim: int) -> Any:
    if is_torch_tensor(like):
        import torch
        return torch.cat(parts, dim=dim)
    if type(like).__module__.startswith("cupy"):
        import cupy
        return cupy.concatenate(parts, axis=dim)
    return np.concatenate(parts, axis=dim)
