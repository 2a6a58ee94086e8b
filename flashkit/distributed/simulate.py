"""The ring's schedule run in one process: every rank's steps, with any local attention function.

It checks the plan, the sharding and the merge together with no GPU and no process group (the CPU
tests use NumPy's float64 reference as the local attention), and, on one GPU, with flashkit's kernel.
"""

from __future__ import annotations

from typing import Any, Callable

from .merge import merge_all
from .plan import source_rank, step_blocks
from .sharding import shard_zigzag, unshard_zigzag

# local_attention(q, k, v, causal, scale) -> (out (b, n, h, d), lse (b, h, n))
LocalAttention = Callable[[Any, Any, Any, bool, float], tuple[Any, Any]]


def simulate_ring(q: Any, k: Any, v: Any, world_size: int, causal: bool, scale: float,
                  local_attention: LocalAttention) -> tuple[Any, Any]:
    """Full-sequence (out, lse) computed the ring's way over zigzag shards of q, k, v."""
    shards = [tuple(shard_zigzag(x, r, world_size) for x in (q, k, v)) for r in range(world_size)]
    outs, lses = [], []
    for rank in range(world_size):
        q_r = shards[rank][0]
        n = q_r.shape[1]
        parts = []
        for step in range(world_size):
            _, k_s, v_s = shards[source_rank(rank, step, world_size)]
            for b in step_blocks(rank, step, world_size, n, k_s.shape[1], causal):
                o, l = local_attention(q_r[:, b.q0:b.q1], k_s[:, b.k0:b.k1], v_s[:, b.k0:b.k1], b.causal, scale)
                parts.append((b.q0, b.q1, o, l))
        out, lse = _merge_rows(parts, n)
        outs.append(out)
        lses.append(lse)
    return unshard_zigzag(outs, dim=1), unshard_zigzag(lses, dim=2)


def _merge_rows(parts: list[tuple[int, int, Any, Any]], n: int):
    """Merge partials that each cover a row range; the first covers every row (the ring's step 0)."""
    q0, q1, out, lse = parts[0]
    assert (q0, q1) == (0, n), "step 0 must cover every local row"
    out, lse = merge_all([(out, lse)])
    for q0, q1, o, l in parts[1:]:
        merged, merged_lse = merge_all([(out[:, q0:q1], lse[:, :, q0:q1]), (o, l)])
        out[:, q0:q1] = merged
        lse[:, :, q0:q1] = merged_lse
    return out, lse
