"""The backward's visit lists for a block mask or a mask_mod (include/flashkit/bwd_lists.cuh).

A key tile's CTA of the backward visits the query tiles that see a key of it. Without a mask those come from the
mask's intervals (causal, window); with a block mask or a drop-in mask_mod they are listed before the main kernel,
on the GPU, in three steps on the call's stream:
  tile states  (list batch, list head, query tile, key tile) uint8, 0 empty / 1 partial / 2 full: a mask_mod's
               from its classifier (functor.cuh's classify_tiles, at the backward's tiles, over the call's causal
               or window mask); a block mask's from its block array here (a kept block full, cut to the tiles
               that hold a causally visible key)
  columns      per (list batch, list head, key tile) the visiting query tiles, the partial ones (which get the
               mask_mod's element mask) first: bwd_list_columns
  ranks        per (list batch, list head, query tile) each key tile's rank among those visiting it (the
               deterministic dQ order): bwd_list_ranks
The lists broadcast over batch and heads where the mask does (a block array of batch or heads 1; a mask_mod whose
manifest says it does not vary with them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .functors import launch_classifier

LIST_THREADS = 128   # bwd_lists.cuh: kListThreads
TILE_FULL = 2        # mask.cuh: kTileFull


@dataclass(frozen=True)
class ListGeometry:
    """Rows of the lists: batch / heads 1 (broadcast) or the call's; tiles of the build's block_m x block_n."""

    batch: int
    heads: int
    q_tiles: int
    k_tiles: int

    @property
    def groups(self) -> int:
        return self.batch * self.heads


def geometry(problem, launch: dict[str, int], batch: int, heads: int) -> ListGeometry:
    return ListGeometry(batch, heads, -(-problem.seqlen_q // launch["block_m"]),
                        -(-problem.seqlen_k // launch["block_n"]))


@dataclass
class VisitLists:
    """One call's buffers (CuPy) and the Params fields that name them."""

    geo: ListGeometry
    state: Any    # (groups, q_tiles, k_tiles) uint8
    count: Any    # (groups, k_tiles, 2) int32
    order: Any    # (groups, k_tiles, q_tiles) int32: the lists
    rank: Any     # (groups, q_tiles, k_tiles) int32

    @classmethod
    def allocate(cls, geo: ListGeometry, cupy) -> "VisitLists":
        g, qt, kt = geo.groups, geo.q_tiles, geo.k_tiles
        return cls(geo, cupy.empty((g, qt, kt), dtype=cupy.uint8), cupy.empty((g, kt, 2), dtype=cupy.int32),
                   cupy.empty((g, kt, qt), dtype=cupy.int32), cupy.empty((g, qt, kt), dtype=cupy.int32))

    def fields(self) -> dict:
        """Params fields: bwd_lists, and the tile state / geometry a mask_mod's classifier writes (Params.mods)."""
        geo = self.geo
        return {"bwd_lists": {"count": self.count.data.ptr, "list": self.order.data.ptr, "rank": self.rank.data.ptr,
                              "batch": geo.batch, "heads": geo.heads, "q_tiles": geo.q_tiles,
                              "k_tiles": geo.k_tiles},
                "mods": {"tile_state": self.state.data.ptr, "tile_batch": geo.batch, "tile_heads": geo.heads,
                         "q_tiles": geo.q_tiles, "k_tiles": geo.k_tiles}}

    def block_mask_states(self, mask, problem, launch: dict[str, int], causal: bool, mods, cupy) -> None:
        """The states of a block mask: a tile is full where its mask block is kept and some query of it may see some
        key of it under the call's causal mask and window (keys [begin(first row), end(last row)): key_interval);
        else empty. The kernel masks the diagonal and the window's edges itself."""
        bm, bn = launch["block_m"], launch["block_n"]
        geo = self.geo
        m = cupy.arange(geo.q_tiles)
        n = cupy.arange(geo.k_tiles)
        blocks = mask.device_blocks()
        kept = blocks[:, :, (m * bm // mask.block_q)[:, None], (n * bn // mask.block_k)[None, :]]
        lo, _ = key_interval(m * bm, problem, causal, mods, cupy)
        _, hi = key_interval(cupy.minimum(m * bm + bm, problem.seqlen_q) - 1, problem, causal, mods, cupy)
        kept = kept & ((n * bn)[None, :] < hi[:, None]) & ((n * bn + bn)[None, :] > lo[:, None])
        self.state[...] = (kept.reshape(geo.groups, geo.q_tiles, geo.k_tiles) * TILE_FULL).astype(cupy.uint8)

    def classify(self, aux: dict, params_block) -> None:
        """A mask_mod's states, by its classifier at the backward's tiles (functor.cuh)."""
        launch_classifier(aux, params_block, self.geo.groups, self.geo.q_tiles, self.geo.k_tiles)

    def compact(self, aux: dict, params_block) -> None:
        """The lists and ranks from the states (bwd_lists.cuh)."""
        geo = self.geo
        aux["flashkit_bwd_list_columns"]((-(-geo.groups * geo.k_tiles // LIST_THREADS), 1, 1), (LIST_THREADS, 1, 1),
                                         (params_block,))
        aux["flashkit_bwd_list_ranks"]((-(-geo.groups * geo.q_tiles // LIST_THREADS), 1, 1), (LIST_THREADS, 1, 1),
                                       (params_block,))


def key_interval(rows, problem, causal: bool, mods, xp):
    """Keys [begin, end) query rows may see (mask.cuh's LocalWindow, with causal's end), both non-decreasing in the
    row: diag = row + seqlen_k - seqlen_q; begin = diag - left (a window's left side), the row's chunk start; end =
    diag + right + 1 (its right side; causal: right = 0), the chunk's end, at most seqlen_k."""
    diag = rows + (problem.seqlen_k - problem.seqlen_q)
    begin = xp.zeros_like(diag)
    end = xp.full_like(diag, problem.seqlen_k)
    if mods.window_left >= 0:
        begin = xp.maximum(begin, diag - mods.window_left)
    right = 0 if causal else mods.window_right
    if right >= 0:
        end = xp.minimum(end, diag + right + 1)
    if mods.chunk > 0:
        start = xp.floor_divide(diag, mods.chunk) * mods.chunk
        begin = xp.maximum(begin, start)
        end = xp.minimum(end, start + mods.chunk)
    return begin, end
