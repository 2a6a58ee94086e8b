// The producer of the warp-specialized Hopper forward: one thread of the producer warpgroup issues every
// TMA load of a query tile. Visit i of the tile loads K_i and V_i into ring slot ring_pos + i as soon as
// the consumers have handed that stage back; Q loads once per tile, into its stage of the Q ring, once the
// consumers are done with the tile that used the stage before. With one Q stage, K_0 and V_0 go first:
// their stages were freed during the previous tile's main loop, so with the persistent scheduler they land
// under its epilogue.
// Rows past seqlen_k read as zeros (TMA's out-of-bounds fill): no ragged-tail code here.
#pragma once

#include "flashkit/hopper/ws_cta.cuh"

namespace flashkit {
namespace hopper {

// Every panel of a tile at `dst` (panel p at dst + p * kPanelSize), completing on `bar`.
template <class Kt, class Tile>
__device__ __forceinline__ void load_tile(u32 dst, const TensorMap& map, u32 bar, const TileCoords& at) {
#pragma unroll
    for (int p = 0; p < Tile::kPanels; ++p)
        tma_load(dst + p * Tile::kPanelSize, map, bar, p * Kt::kPanelElems, at.row, at.head, at.batch);
}

// One query tile's loads; n_blocks == 0 (no key visible to the tile): no loads, the Q stage's "full" is announced alone.
template <class Kt, class Mask>
__device__ __forceinline__ void produce(const WsCta<Kt>& cta, const Mask& mask, int n_blocks, const ForwardMaps& maps,
                                        const TileCoords& q_at, const TileCoords& k_origin) {
    if (cta.tiles == 0) {
        prefetch_tensor_map(maps.q);
        prefetch_tensor_map(maps.k);
        prefetch_tensor_map(maps.v);
    }
    const auto load_kv = [&](int i) {
        const int slot = cta.ring_pos + i;
        const TileCoords kv_at{k_origin.row + mask.kv_block(n_blocks - 1 - i) * Kt::kBlockN, k_origin.head,
                               k_origin.batch};
        const int stage = Kt::Ring::stage(slot);
        load_tile<Kt, typename Kt::KTile>(cta.smem + Kt::kKOffset + stage * Kt::kKStageBytes, maps.k,
                                          cta.k_ring.acquire(slot, Kt::KTile::kBytes), kv_at);
        load_tile<Kt, typename Kt::VTile>(cta.smem + Kt::kVOffset + stage * Kt::kVStageBytes, maps.v,
                                          cta.v_ring.acquire(slot, Kt::VTile::kBytes), kv_at);
    };
    // Q into its stage once that is free (slot `tiles` of the Q ring, ws_cta.cuh; the first round passes at
    // once). With one Q stage it frees only as the previous tile ends, so K_0 and V_0 go first; with two,
    // Q goes first.
    const auto load_q = [&]() {
        if (n_blocks > 0) {
            load_tile<Kt, typename Kt::QTile>(cta.q_tile(), maps.q, cta.q_ring.acquire(cta.tiles, Kt::QTile::kBytes),
                                              q_at);
        } else {
            cta.q_ring.wait_empty(cta.tiles);
            mbarrier_arrive(cta.q_ring.full(cta.tiles));
        }
    };
    if constexpr (Kt::kQStages > 1) load_q();
    if (n_blocks > 0) load_kv(0);
    if constexpr (Kt::kQStages == 1) load_q();
    for (int i = 1; i < n_blocks; ++i) load_kv(i);
}

}  // namespace hopper
}  // namespace flashkit
