// The producer of the warp-specialized Hopper forward: one thread of the producer warpgroup issues every
// TMA load of a query tile. Visit i of the tile loads K_i and V_i into ring slot ring_pos + i as soon as
// the consumers have handed that stage back, K a visit ahead of V; Q loads once per tile, into the Q tile, once
// every consumer has stored the previous tile's O from it (q_empty). K_0 goes first: its stage was freed during
// the previous tile's main loop, so with the persistent scheduler it lands under its epilogue.
// Rows past seqlen_k read as zeros (TMA's out-of-bounds fill): no ragged-tail code here.
#pragma once

#include "flashkit/hopper/stage_scales.cuh"
#include "flashkit/hopper/timeline.cuh"
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

// The V operand of K/V tile `at`: V's rows as they are, or (kVTransposed) the Vt tile of the workspace, whose
// map (runtime/tma.py: vt) is (keys, head-dim rows, kv heads, batch) with a box of the tile's keys by every row.
template <class Kt>
__device__ __forceinline__ void load_v_tile(u32 dst, const TensorMap& map, u32 bar, const TileCoords& at) {
    if constexpr (Kt::kVTransposed) tma_load(dst, map, bar, at.row, 0, at.head, at.batch);
    else load_tile<Kt, typename Kt::VTile>(dst, map, bar, at);
}

// One query tile's loads; n_blocks == 0 (no key visible to the tile): no loads, q_full is announced alone.
// (8-bit inputs: each K stage also gets its tile's scales, stage_scales.cuh; kv_batch: their batch.)
template <class Kt, class Mask>
__device__ __forceinline__ void produce(const WsCta<Kt>& cta, const Params& p, const Mask& mask, int n_blocks,
                                        const ForwardMaps& maps, const TileCoords& q_at, const TileCoords& k_origin,
                                        int kv_batch) {
    if (cta.tiles == 0) {
        prefetch_tensor_map(maps.q);
        prefetch_tensor_map(maps.k);
        prefetch_tensor_map(maps.v);
    }
    const auto coords = [&](int i) {
        return TileCoords{k_origin.row + mask.kv_block(n_blocks - 1 - i) * Kt::kBlockN, k_origin.head, k_origin.batch};
    };
    const auto load_k = [&](int i) {
        const int slot = cta.ring_pos + i;
        const int stage = Kt::Ring::stage(slot);
        if constexpr (Kt::kStagedScales) {
            float scales[4];
            StagedScales<Kt>::load(p, k_origin.head, kv_batch, mask.kv_block(n_blocks - 1 - i), scales);
            cta.k_ring.wait_empty(slot);
            st_shared_v4(StagedScales<Kt>::slot(cta.smem, stage), scales);   // published by announce's arrive
        }
        load_tile<Kt, typename Kt::KTile>(cta.smem + Kt::kKOffset + stage * Kt::kKStageBytes, maps.k,
                                          Kt::kStagedScales ? cta.k_ring.announce(slot, Kt::KTile::kBytes)
                                                            : cta.k_ring.acquire(slot, Kt::KTile::kBytes),
                                          coords(i));
        timeline_stamp(i, kKIssued);
    };
    const auto load_v = [&](int i) {
        const int slot = cta.ring_pos + i;
        load_v_tile<Kt>(cta.smem + Kt::kVOffset + Kt::Ring::stage(slot) * Kt::kVStageBytes, maps.v,
                        cta.v_ring.acquire(slot, Kt::VTile::kBytes), coords(i));
        timeline_stamp(i, kVIssued);
    };
    if (n_blocks > 0) load_k(0);
    // Q is free again (round `tiles` of q_empty, ws_cta.cuh; the first passes at once).
    mbarrier_wait(cta.q_empty, (static_cast<u32>(cta.tiles) & 1u) ^ 1u);
    if (n_blocks > 0) {
        mbarrier_arrive_expect_tx(cta.q_full, Kt::QTile::kBytes);
        load_tile<Kt, typename Kt::QTile>(cta.smem + Kt::kQOffset, maps.q, cta.q_full, q_at);
    } else {
        mbarrier_arrive(cta.q_full);
    }
    // K runs a visit ahead of V (FlashAttention-3's order): a K stage comes back once S has read it, a V stage only
    // after P V, so K_{i+1} does not queue behind V_i's stage. (K_i after V_i, K_{i+1} landed just in time: bf16 hd128
    // consumers waited 140-250 of a 2700-cycle visit for it in a clock64 timeline.)
    for (int i = 0; i < n_blocks; ++i) {
        if (i + 1 < n_blocks) load_k(i + 1);
        load_v(i);
    }
}

}  // namespace hopper
}  // namespace flashkit
