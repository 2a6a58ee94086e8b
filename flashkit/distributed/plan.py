"""The ring's work plan: at each step, which rows of the local queries meet which rows of the visiting K/V.

At step s rank r holds the K/V shard of rank (r - s) mod W. Without a causal mask every step is one full
block. With one, chunk pairs are fully visible (key chunk before query chunk), diagonal (the same chunk:
causal within it) or skipped (key chunk after). Under zigzag sharding (shard r = chunks r, 2W-1-r) this
leaves, per rank and step, work of half a full block:
  s = 0        local Q x local K/V, causal (two diagonal chunks and one full pair);
  src < rank   all of Q x the first K/V chunk (a chunk before both of ours), full;
  src > rank   the second Q chunk x all of K/V (both its chunks lie before our late chunk), full.
The backward uses the same plan (the same blocks, transposed roles for dK/dV).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InputError

LAYOUTS = ("zigzag", "contiguous")


@dataclass(frozen=True)
class Block:
    """One local attention call: local query rows [q0, q1) against visiting K/V rows [k0, k1)."""

    q0: int
    q1: int
    k0: int
    k1: int
    causal: bool

    @property
    def pairs(self) -> int:
        """Query-key pairs computed (the work): a causal block counts its bottom-right-aligned triangle."""
        nq, nk = self.q1 - self.q0, self.k1 - self.k0
        if not self.causal:
            return nq * nk
        return sum(max(0, min(nk, i + 1 + nk - nq)) for i in range(nq)) if nq != nk else nq * (nq + 1) // 2


def source_rank(rank: int, step: int, world_size: int) -> int:
    """The rank whose K/V shard `rank` holds at `step` (shards travel rank -> rank + 1)."""
    return (rank - step) % world_size


def step_blocks(rank: int, step: int, world_size: int, seqlen_q: int, seqlen_k: int, causal: bool,
                layout: str = "zigzag") -> tuple[Block, ...]:
    """The blocks rank computes at step (empty when the visiting shard is entirely masked)."""
    if layout not in LAYOUTS:
        raise InputError(f"layout: expected one of {', '.join(LAYOUTS)}, got {layout!r}")
    if not causal:
        return (Block(0, seqlen_q, 0, seqlen_k, False),)
    if seqlen_q != seqlen_k:
        raise InputError(f"causal ring attention needs equal local q and k lengths, got {seqlen_q} and {seqlen_k}")
    src = source_rank(rank, step, world_size)
    n = seqlen_q
    if layout == "contiguous":
        if src == rank:
            return (Block(0, n, 0, n, True),)
        return (Block(0, n, 0, n, False),) if src < rank else ()
    if n % 2:
        raise InputError(f"causal zigzag shards hold two equal chunks, so the local length must be even, got {n}")
    c = n // 2
    if src == rank:
        return (Block(0, n, 0, n, True),)
    if src < rank:
        return (Block(0, n, 0, c, False),)
    return (Block(c, n, 0, n, False),)


def ring_plan(rank: int, world_size: int, seqlen_q: int, seqlen_k: int, causal: bool,
              layout: str = "zigzag") -> list[tuple[Block, ...]]:
    """step_blocks for every step 0..W-1."""
    return [step_blocks(rank, s, world_size, seqlen_q, seqlen_k, causal, layout) for s in range(world_size)]


def global_rows(rank: int, world_size: int, seqlen: int, layout: str) -> list[int]:
    """Global positions of a rank's local rows (seqlen is the local length) under a layout."""
    if layout == "contiguous":
        return list(range(rank * seqlen, (rank + 1) * seqlen))
    c = seqlen // 2
    a, b = rank, 2 * world_size - 1 - rank
    return list(range(a * c, (a + 1) * c)) + list(range(b * c, (b + 1) * c))
