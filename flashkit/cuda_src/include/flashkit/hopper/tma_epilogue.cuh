// Epilogue of a consumer warpgroup of the warp-specialized Hopper forward: O (already divided by
// l) -> output type -> its own 64 rows of the Q tile (no longer read: its last S product has
// completed), in the swizzled panel layout TMA's 128 B swizzle reads; then one thread stores the
// rows with TMA, which clips rows past seqlen_q. The LSE goes straight from registers.
#pragma once

#include "flashkit/hopper/ws_traits.cuh"

namespace flashkit {
namespace hopper {

template <class Kt>
__device__ __forceinline__ void store_output_tma(const float (&o)[1][Kt::kDTiles][4], const float (&lse)[1][2],
                                                 u32 smem, int consumer, const TensorMap& o_map, const Params& p,
                                                 const TileCoords& q_at, int tid_in_group) {
    typedef typename Kt::OutT OutT;
    typedef typename Kt::QTile QTile;
    const int warp = tid_in_group / kWarpSize;
    const int lane = tid_in_group % kWarpSize;
    const int g = lane / kQuadLanes;
    const int t = lane % kQuadLanes;
    const int group_row0 = consumer * gmma::kWarpgroupRows;   // tile row of this consumer's first row
    float* lse_gmem = p.lse == nullptr
                          ? nullptr
                          : p.lse + (static_cast<index_t>(q_at.batch) * p.heads + q_at.head) * p.seqlen_q + q_at.row;
#pragma unroll
    for (int h = 0; h < 2; ++h) {   // rows g, g + 8 of the warp's 16
        const int row = group_row0 + warp * Kt::kWarpRows + h * kFragRowHalf + g;
#pragma unroll
        for (int nd = 0; nd < Kt::kDTiles; ++nd) {   // column tile nd: 8 elements = one 16 B chunk
            const u32 addr = smem + Kt::kQOffset + QTile::chunk_offset(row, nd) + t * kFragCols * sizeof(OutT);
            asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(pack_float2<OutT>(o[0][nd][2 * h], o[0][nd][2 * h + 1]))
                         : "memory");
        }
        if (lse_gmem != nullptr && t == 0 && q_at.row + row < p.seqlen_q) lse_gmem[row] = lse[0][h];
    }
    gmma::fence_proxy_async();   // the generic-proxy stores, before TMA (the async proxy) reads them
    named_sync(kEpilogueBarrierBase + consumer, gmma::kWarpgroupThreads);
    if (tid_in_group == 0 && q_at.row + group_row0 < p.seqlen_q) {
#pragma unroll
        for (int pnl = 0; pnl < Kt::kPanels; ++pnl)
            tma_store(o_map, smem + Kt::kQOffset + pnl * QTile::kPanelSize + group_row0 * QTile::kPanelBytes,
                      pnl * Kt::kPanelElems, q_at.row + group_row0, q_at.head, q_at.batch);
        tma_store_commit();
        tma_store_wait_read();
    }
}

}  // namespace hopper
}  // namespace flashkit
