"""The ring's per-step work plan: every visible (query, key) pair exactly once, balanced across ranks."""

from __future__ import annotations

import numpy as np
import pytest

from flashkit.errors import InputError
from flashkit.distributed import Block, ring_plan, source_rank, step_blocks
from flashkit.distributed.plan import global_rows


def covered(world: int, local: int, causal: bool, layout: str) -> np.ndarray:
    """How many times each (global query, global key) pair is computed over the whole ring."""
    n = world * local
    count = np.zeros((n, n), dtype=np.int64)
    for rank in range(world):
        qpos = np.array(global_rows(rank, world, local, layout))
        for step, blocks in enumerate(ring_plan(rank, world, local, local, causal, layout)):
            kpos = np.array(global_rows(source_rank(rank, step, world), world, local, layout))
            for b in blocks:
                qi, kj = qpos[b.q0:b.q1], kpos[b.k0:b.k1]
                vis = np.ones((len(qi), len(kj)), dtype=bool)
                if b.causal:   # bottom-right aligned inside the block
                    vis = np.arange(len(kj))[None, :] <= np.arange(len(qi))[:, None] + len(kj) - len(qi)
                count[np.ix_(qi, kj)] += vis
    return count


@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
@pytest.mark.parametrize("world", [1, 2, 3, 4, 5, 8])
@pytest.mark.parametrize("causal", [False, True])
def test_every_visible_pair_exactly_once(world, causal, layout):
    local = 6
    n = world * local
    want = np.tril(np.ones((n, n), dtype=np.int64)) if causal else np.ones((n, n), dtype=np.int64)
    np.testing.assert_array_equal(covered(world, local, causal, layout), want)


@pytest.mark.parametrize("world", [2, 3, 4, 8, 16, 64])
def test_zigzag_causal_work_is_balanced(world):
    """Every rank does the same work at every step after the first (half a full block), none skips a step."""
    local = 2 * 64
    for step in range(world):
        work = [sum(b.pairs for b in step_blocks(r, step, world, local, local, True)) for r in range(world)]
        if step == 0:   # the local causal block: the triangle of the shard, diagonal included
            assert set(work) == {local * (local + 1) // 2}
        else:
            assert set(work) == {local * local // 2}
    total = [sum(b.pairs for s in range(world) for b in step_blocks(r, s, world, local, local, True))
             for r in range(world)]
    assert max(total) == min(total)


def test_contiguous_causal_is_unbalanced():
    """Why zigzag: with contiguous shards the last rank does W times the first rank's work."""
    local, world = 64, 4
    total = [sum(b.pairs for s in range(world) for b in step_blocks(r, s, world, local, local, True, "contiguous"))
             for r in range(world)]
    assert total[0] < total[-1] and total[-1] > 3 * total[0]


def test_zigzag_step_kinds():
    n = 8
    assert step_blocks(1, 0, 4, n, n, True) == (Block(0, 8, 0, 8, True),)    # own shard: causal
    assert step_blocks(2, 1, 4, n, n, True) == (Block(0, 8, 0, 4, False),)   # src 1 < 2: first K/V chunk
    assert step_blocks(1, 2, 4, n, n, True) == (Block(4, 8, 0, 8, False),)   # src 3 > 1: second Q chunk
    assert step_blocks(0, 1, 2, n, 10, False) == (Block(0, 8, 0, 10, False),)
    assert source_rank(0, 1, 4) == 3 and source_rank(3, 3, 4) == 0


def test_plan_rejects_what_it_cannot_do():
    with pytest.raises(InputError, match="even"):
        step_blocks(0, 0, 2, 7, 7, True)
    with pytest.raises(InputError, match="equal"):
        step_blocks(0, 0, 2, 8, 6, True)
    with pytest.raises(InputError, match="layout"):
        step_blocks(0, 0, 2, 8, 8, True, "striped")
