// The backward of a block mask or a mask_mod (FLASHKIT_BLOCK_SPARSE / FLASHKIT_MASK_MOD): which query tiles a
// key tile's CTA visits comes from lists built on the GPU before the main kernel (Params.bwd_lists), not from
// the mask's intervals. Per list row (list batch, list head, key tile n) the visiting query tiles, those that
// need the mask_mod's element mask (partial) first, each part ascending; per (list batch, list head, query tile m)
// the rank of each key tile among those visiting m (the deterministic dQ order).
//   tile states   Params.mods.tile_state[(lb, lh, m)][n], mask.cuh's kTile* states;
//                 a mask_mod's from its classifier (classify_tiles at the backward's tiles), a block mask's
//                 written by flashkit/features/bwd_lists.py (kept blocks full, causal ones cut to the diagonal)
//   bwd_list_columns, bwd_list_ranks   the two compactions (one thread a row), entries of the backward kernel
//   BwdListed<Inner>  the backward's mask: Inner (BwdDense / BwdLocal) masks each visited tile's elements
//                     (causal diagonal, window) as without lists; the lists say which tiles to visit
#pragma once

#include "flashkit/bwd_mask.cuh"

namespace flashkit {

constexpr int kListThreads = 128;   // threads a block of the compaction entries

// The list row of (batch, head, tile) among `tiles` per (list batch, list head): broadcast dims read row 0.
__device__ __forceinline__ int list_row(const BwdListParams& l, int batch, int head, int tile, int tiles) {
    const int lb = l.batch == 1 ? 0 : batch, lh = l.heads == 1 ? 0 : head;
    return (lb * l.heads + lh) * tiles + tile;
}

// One thread a (list batch, list head, key tile): the query tiles whose state is not empty, partial ones first.
__device__ __forceinline__ void bwd_list_columns(const Params& p) {
    const BwdListParams& l = p.bwd_lists;
    const int row = blockIdx.x * kListThreads + threadIdx.x;
    if (row >= l.batch * l.heads * l.k_tiles) return;
    const int n = row % l.k_tiles, group = row / l.k_tiles;
    const unsigned char* state = p.mods.tile_state + static_cast<index_t>(group) * l.q_tiles * l.k_tiles + n;
    int* list = const_cast<int*>(l.list) + static_cast<index_t>(row) * l.q_tiles;
    int count = 0;
    for (int m = 0; m < l.q_tiles; ++m)
        if (state[static_cast<index_t>(m) * l.k_tiles] == kTilePartial) list[count++] = m;
    const int partial = count;
    for (int m = 0; m < l.q_tiles; ++m)
        if (state[static_cast<index_t>(m) * l.k_tiles] == kTileFull) list[count++] = m;
    int* counts = const_cast<int*>(l.count) + 2 * row;
    counts[0] = partial;
    counts[1] = count;
}

// One thread a (list batch, list head, query tile): rank[n] = how many key tiles before n visit it.
__device__ __forceinline__ void bwd_list_ranks(const Params& p) {
    const BwdListParams& l = p.bwd_lists;
    const int row = blockIdx.x * kListThreads + threadIdx.x;
    if (row >= l.batch * l.heads * l.q_tiles) return;
    const unsigned char* state = p.mods.tile_state + static_cast<index_t>(row) * l.k_tiles;
    int* rank = const_cast<int*>(l.rank) + static_cast<index_t>(row) * l.k_tiles;
    int before = 0;
    for (int n = 0; n < l.k_tiles; ++n) {
        rank[n] = before;
        before += state[n] != kTileEmpty;
    }
}

template <class Inner>
struct BwdListed : Inner {
    static constexpr bool kListed = true;
    __device__ __forceinline__ explicit BwdListed(const Params& p_) : Inner(p_) {}
};

// The key tiles before n_block that visit m_block: n_block's rank in m_block's row (bwd_mask.cuh's dq_turn).
template <int kBlockM, int kBlockN, class Inner>
__device__ __forceinline__ int dq_turn(const BwdListed<Inner>& mask, int m_block, int n_block, int head, int batch) {
    const BwdListParams& l = mask.p.bwd_lists;
    return l.rank[static_cast<index_t>(list_row(l, batch, head, m_block, l.q_tiles)) * l.k_tiles + n_block];
}

// The backward's mask of a build: listed with a block mask or a mask_mod, else Inner.
template <bool kListedBuild, class Inner>
struct BwdListedOr {
    typedef Inner type;
};
template <class Inner>
struct BwdListedOr<true, Inner> {
    typedef BwdListed<Inner> type;
};

}  // namespace flashkit

// The two compactions as entries of a backward variant (the runtime's AUX_ENTRIES["bwd_lists"], launched by
// flashkit/features/bwd_lists.py before the passes): in a build with a block mask or a mask_mod.
#define FLASHKIT_BWD_LIST_ENTRIES                                                                              \
    extern "C" __global__ void __launch_bounds__(flashkit::kListThreads)                                      \
        flashkit_bwd_list_columns(const flashkit::Params params) {                                            \
        flashkit::bwd_list_columns(params);                                                                   \
    }                                                                                                         \
    extern "C" __global__ void __launch_bounds__(flashkit::kListThreads)                                      \
        flashkit_bwd_list_ranks(const flashkit::Params params) {                                              \
        flashkit::bwd_list_ranks(params);                                                                     \
    }
