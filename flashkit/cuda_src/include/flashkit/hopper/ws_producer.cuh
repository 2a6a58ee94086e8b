// The producer of the warp-specialized Hopper forward: one thread of the producer warpgroup
// issues every TMA load of a query block. Q once (one box a 128 B panel of the head dim,
// kBlockM rows), then, per visited tile i, K_i and V_i into stage i % kStages of their rings,
// each as soon as the consumers have handed that stage back. Rows past seqlen_k read as zeros
// (TMA's out-of-bounds fill): no ragged-tail code here.
#pragma once

#include "flashkit/hopper/ws_traits.cuh"

namespace flashkit {
namespace hopper {

// Every panel of a kRows-row tile at `dst` (panel p at dst + p * kPanelSize), completing on `bar`.
template <class Kt, class Tile>
__device__ __forceinline__ void load_tile(u32 dst, const TensorMap& map, u32 bar, const TileCoords& at) {
#pragma unroll
    for (int p = 0; p < Kt::kPanels; ++p)
        tma_load(dst + p * Tile::kPanelSize, map, bar, p * Kt::kPanelElems, at.row, at.head, at.batch);
}

template <class Kt, class Mask>
__device__ __forceinline__ void produce(const Mask& mask, int n_blocks, u32 smem, u32 q_full,
                                        const typename Kt::Ring& k_ring, const typename Kt::Ring& v_ring,
                                        const TensorMap& q_map, const TensorMap& k_map, const TensorMap& v_map,
                                        const TileCoords& q_at, const TileCoords& k_origin) {
    prefetch_tensor_map(q_map);
    prefetch_tensor_map(k_map);
    prefetch_tensor_map(v_map);
    mbarrier_arrive_expect_tx(q_full, Kt::QTile::kBytes);
    load_tile<Kt, typename Kt::QTile>(smem + Kt::kQOffset, q_map, q_full, q_at);
    for (int i = 0; i < n_blocks; ++i) {
        const TileCoords kv_at{k_origin.row + mask.kv_block(n_blocks - 1 - i) * Kt::kBlockN, k_origin.head,
                               k_origin.batch};
        const int stage_offset = Kt::Ring::stage(i) * Kt::kStageBytes;
        load_tile<Kt, typename Kt::KTile>(smem + Kt::kKOffset + stage_offset, k_map,
                                          k_ring.acquire(i, Kt::KTile::kBytes), kv_at);
        load_tile<Kt, typename Kt::KTile>(smem + Kt::kVOffset + stage_offset, v_map,
                                          v_ring.acquire(i, Kt::KTile::kBytes), kv_at);
    }
}

}  // namespace hopper
}  // namespace flashkit
