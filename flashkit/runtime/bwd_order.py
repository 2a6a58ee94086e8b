"""The order in which the Hopper backward's CTAs take their key blocks (include/flashkit/hopper/bwd_launch_order.cuh).

fa3_bwd's main kernel runs one CTA an SM, one CTA a (key block, kv head, batch), and the hardware hands CTAs to SMs
in launch order as they free up: a greedy list schedule. A causal key block's work falls with its index (key block
n is seen only by the queries at and below its diagonal), and a GQA CTA walks every query head of its group, so a
grid of a few waves ends with a tail: heavy CTAs that started late run alone. The kernel reorders its launch index
into groups of `order_pairs` (batch, kv head) pairs, within a group every pair's key block 0 first, then 1, ...
(order_pairs 1 is the plain launch order). Larger groups balance better (heaviest first over the whole grid is the
classic longest-processing-time order) but spread the CTAs that run together over more heads, which share no Q,
dO or dq_accum lines in L2: heaviest first over the whole grid measured 4-30% slower at 2-4k.

So the host simulates the greedy schedule of each candidate group size on the call's per-CTA work (query blocks
visited, times the group's query heads, plus a fixed cost) and takes the smallest group whose makespan is within
LOCALITY_TOLERANCE of the best. On the measured shapes the model predicted the change: hd128 GQA b8 s2048 8/2 heads,
plain order 0.62 of the ideal and one-wave groups 0.97, measured 0.655x -> 1.00x cuDNN.
"""

from __future__ import annotations

import heapq
from functools import lru_cache

import numpy as np

CTA_OVERHEAD = 2.0           # a CTA's fixed cost (K, V loads, the dK / dV epilogue) in query-block visits
LOCALITY_TOLERANCE = 0.03    # a smaller group (L2 locality) is taken while its makespan is within 3% of the best
MAX_SIMULATED_WAVES = 64     # past this many waves the tail is a small share: the one-wave group, unsimulated


def visits_per_key_block(seqlen_q: int, seqlen_k: int, block_m: int, block_n: int, causal: bool,
                         window: tuple[int, int] = (-1, -1)) -> np.ndarray:
    """Query blocks that see some key of each key block (bottom-right aligned: query i sees key j iff
    i + off - left <= j <= i + off + right, off = seqlen_k - seqlen_q; causal: right = 0; -1: unbounded)."""
    left, right = window
    if causal:
        right = 0 if right < 0 else min(right, 0)
    off = seqlen_k - seqlen_q
    m0 = np.arange(0, seqlen_q, block_m)
    m1 = np.minimum(m0 + block_m, seqlen_q) - 1          # last query row of each block
    n0 = np.arange(0, seqlen_k, block_n)[:, None]
    n1 = np.minimum(n0 + block_n, seqlen_k) - 1          # last key of each block
    seen = np.ones((n0.shape[0], m0.size), dtype=bool)
    if right >= 0:
        seen &= m1[None, :] + off + right >= n0           # the block's last query reaches the key block's first key
    if left >= 0:
        seen &= m0[None, :] + off - left <= n1            # the block's first query reaches back to its last key
    return seen.sum(axis=1)


def greedy_makespan(costs: np.ndarray, sms: int) -> float:
    """The finish time of CTAs of `costs`, in launch order, each taken by the SM that frees up first."""
    free = [0.0] * min(sms, costs.size)
    heapq.heapify(free)
    for c in costs.tolist():
        heapq.heappush(free, heapq.heappop(free) + c)
    return max(free) if free else 0.0


def launch_order_costs(work: np.ndarray, pairs: int, group: int) -> np.ndarray:
    """Per-CTA work in the kernel's order for groups of `group` pairs: key block fastest within a pair when the
    group is one pair, else every pair's key block 0, then 1, ... (bwd_launch_order.cuh)."""
    order = []
    for first in range(0, pairs, group):
        size = min(group, pairs - first)
        order.append(np.repeat(work, size))               # block 0 of the group's pairs, then block 1, ...
    return np.concatenate(order) if order else np.zeros(0)


@lru_cache(maxsize=256)
def order_pairs(batch: int, kv_heads: int, group_heads: int, seqlen_q: int, seqlen_k: int, block_m: int,
                block_n: int, causal: bool, window: tuple[int, int], sms: int) -> int:
    """The group size (in (batch, kv head) pairs) for a backward call; 1 where every key block weighs the same."""
    work = visits_per_key_block(seqlen_q, seqlen_k, block_m, block_n, causal, window)
    if work.size == 0 or np.all(work == work[0]):
        return 1
    pairs = batch * kv_heads
    one_wave = max(1, sms // work.size)
    if pairs * work.size > MAX_SIMULATED_WAVES * sms:
        return min(one_wave, pairs)
    costs = work * float(group_heads) + CTA_OVERHEAD
    candidates = sorted({min(g, pairs) for g in (1, 2, 4, 8, 16, 32, 64, 128, one_wave, 2 * one_wave, pairs)})
    spans = {g: greedy_makespan(launch_order_costs(costs, pairs, g), sms) for g in candidates}
    best = min(spans.values())
    return next(g for g in candidates if spans[g] <= best * (1 + LOCALITY_TOLERANCE))


__all__ = ["order_pairs", "visits_per_key_block", "greedy_makespan", "launch_order_costs"]
