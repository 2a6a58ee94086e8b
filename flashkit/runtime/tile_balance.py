"""Whether the persistent grid's static tile order balances a call's work (include/flashkit/hopper/tile_scheduler.cuh).

The persistent kernel hands tile t of round r to CTA t mod G (even rounds) or G - 1 - (t mod G) (odd rounds), tiles
numbered query block fastest, causal heaviest first. That "snake" balances the causal weights n, n - 1, ..., 1 of a
head when a head's blocks are few against the G CTAs, but not when they are about as many: at 16k causal tokens
(128 query blocks, 132 CTAs) the busiest CTA gets 1.5x the mean work. A grid of one CTA a tile then does better: the
hardware hands out tiles as SMs free up, in the same order (heaviest first), which balances like a dynamic queue.
The same kernel runs either grid, so the host picks: persistent unless the static order's makespan is more than
MAX_IMBALANCE of the ideal.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

MAX_IMBALANCE = 1.10
TILE_OVERHEAD = 1.0   # a tile's fixed cost (Q load, epilogue) in units of one K/V tile's work


def causal_tile_work(seqlen_q: int, seqlen_k: int, block_m: int, block_n: int) -> np.ndarray:
    """K/V tiles visited by each query block under the bottom-right aligned causal mask, heaviest first."""
    m = np.arange(-(-seqlen_q // block_m))[::-1]
    last_row = np.minimum((m + 1) * block_m, seqlen_q) - 1
    keys = np.clip(last_row + 1 + seqlen_k - seqlen_q, 0, seqlen_k)
    return -(-keys // block_n)


def snake_imbalance(work_per_head: np.ndarray, heads_batches: int, ctas: int) -> float:
    """Makespan of the snake order over `ctas` CTAs against the ideal (mean work, or the largest tile)."""
    work = np.tile(work_per_head + TILE_OVERHEAD, heads_batches)
    t = np.arange(work.size)
    rounds, slot = np.divmod(t, ctas)
    cta = np.where(rounds % 2 == 0, slot, ctas - 1 - slot)
    makespan = np.bincount(cta, weights=work, minlength=ctas).max()
    ideal = max(work.sum() / ctas, work.max())
    return float(makespan / ideal)


@lru_cache(maxsize=256)
def static_order_imbalance(seqlen_q: int, seqlen_k: int, heads_batches: int, block_m: int, block_n: int,
                           causal: bool, ctas: int) -> float:
    """The snake order's makespan over the ideal for a call (1.0 non-causal: every tile weighs the same)."""
    if not causal:
        return 1.0
    return snake_imbalance(causal_tile_work(seqlen_q, seqlen_k, block_m, block_n), heads_batches, ctas)


def persistent_balances(seqlen_q: int, seqlen_k: int, heads_batches: int, block_m: int, block_n: int, causal: bool,
                        ctas: int) -> bool:
    """True when the persistent grid's static order is within MAX_IMBALANCE of the ideal for this call."""
    return static_order_imbalance(seqlen_q, seqlen_k, heads_batches, block_m, block_n, causal,
                                  ctas) <= MAX_IMBALANCE


def grid_note(spec, req, sms: int | None = None) -> str:
    """The explain line of a `tiles` grid: persistent or one CTA a tile for this request, and why."""
    from .kv_split import DEFAULT_SMS
    assumed = "" if sms else f" (assumed: {DEFAULT_SMS} SMs, no device)"
    ctas = sms or DEFAULT_SMS
    cfg = spec.launch_config(req.cc, req.head_dim, req.build_mods, req.causal, req.seqlen_q)
    hb = req.batch * req.heads
    tiles = -(-req.seqlen_q // cfg["block_m"]) * hb
    if not cfg.get("persistent"):
        return f"grid: one CTA a tile ({tiles} tiles; the build for this head dim, mask and length is not persistent)"
    if not req.causal:
        return f"grid: persistent, {min(tiles, ctas)} CTAs walk {tiles} tiles of equal work{assumed}"
    imbalance = static_order_imbalance(req.seqlen_q, req.seqlen_k, hb, cfg["block_m"],
                                       cfg.get("block_n", cfg["block_m"]), True, ctas)
    if imbalance <= MAX_IMBALANCE:
        return (f"grid: persistent, {min(tiles, ctas)} CTAs walk {tiles} causal tiles (static order "
                f"{imbalance:.2f}x the ideal makespan){assumed}")
    return (f"grid: one CTA a tile ({tiles} tiles): the persistent static order would take {imbalance:.2f}x the "
            f"ideal makespan{assumed}")
