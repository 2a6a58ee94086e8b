// Epilogue of a consumer warpgroup of the warp-specialized Hopper forward: O (already divided by
// l; kHeadDimV columns) -> output type -> its own 64 rows of the O staging tile (Kt::kOOffset: a tile of its
// own, or the Q tile, no longer read once the consumer's last S product has completed), in the swizzled panel
// layout TMA's 128 B swizzle reads (Kt::OTile, kOPanels panels); then one thread stores the
// rows with TMA, which clips rows past seqlen_q (and columns past head_dim_v). The LSE goes straight from
// registers.
// A packed varlen sequence (varlen.cuh) ends inside the tensor TMA sees, so the 64-row group holding its
// last row is stored by the warpgroup's threads instead, 16 B chunks of the rows < seqlen_q only (and of the
// columns < head_dim_v only: a call below its head-dim class, FLASHKIT_HEAD_DIM_V_PADDED, whose last class columns
// would reach into the next head's row).
// With a tile of its own (kOwnOTile) the store is left to drain under the next tile: the next epilogue
// (and the kernel's end, drain_output_stores) waits for it to have read the rows. Else, when
// store_output_tma returns to the warpgroup's thread 0, nothing reads the staged rows any more: the
// caller may hand the Q tile back to the producer (q_empty).
#pragma once

#include "flashkit/tile_store.cuh"
#include "flashkit/hopper/ws_traits.cuh"
#include "flashkit/traits.cuh"   // FLASHKIT_HEAD_DIM_V_PADDED
#include "flashkit/varlen.cuh"

namespace flashkit {
namespace hopper {

// The first `rows` (< 64) rows of the staged group at tile row group_row0, from the swizzled O tile to O
// (rows of the sequence at `origin`), one 16 B chunk a thread at a time (tile_store.cuh).
template <class Kt>
__device__ __forceinline__ void store_rows(u32 tile, int group_row0, int rows, const Params& p, const TileCoords& q_at,
                                           const SeqOrigin& origin, int tid_in_group) {
    typedef typename Kt::OutT OutT;
    constexpr int kChunkElems = kChunkBytes / sizeof(OutT);
    constexpr int kRowChunks = Kt::kHeadDimV / kChunkElems;   // an O row of the class
    const int row_chunks = FLASHKIT_HEAD_DIM_V_PADDED ? p.head_dim_v / kChunkElems : kRowChunks;   // of the call
    OutT* o = static_cast<OutT*>(p.o) + origin.batch * p.o_batch_stride + q_at.head * p.o_head_stride +
              static_cast<index_t>(origin.q_row + q_at.row + group_row0) * p.o_row_stride;
    store_tile_rows<typename Kt::OTile, kRowChunks, gmma::kWarpgroupThreads>(tile, group_row0, rows, 0, row_chunks, o,
                                                                             p.o_row_stride, tid_in_group);
}

template <class Kt>
__device__ __forceinline__ void store_output_tma(const float (&o)[1][Kt::kDTiles][4], const float (&lse)[1][2],
                                                 u32 smem, int consumer, const TensorMap& o_map, const Params& p,
                                                 const TileCoords& q_at, const SeqOrigin& origin,
                                                 int tid_in_group) {
    typedef typename Kt::OutT OutT;
    typedef typename Kt::OTile OTile;
    const int warp = tid_in_group / kWarpSize;
    const int lane = tid_in_group % kWarpSize;
    const int g = lane / kQuadLanes;
    const int t = lane % kQuadLanes;
    const int group_row0 = consumer * gmma::kWarpgroupRows;   // tile row of this consumer's first row
    const u32 o_tile = smem + Kt::kOOffset;
    if constexpr (Kt::kOwnOTile) {   // the previous tile's store may still be reading these rows
        if (tid_in_group == 0) bulk_wait_read();
        named_sync(kEpilogueBarrierBase + consumer, gmma::kWarpgroupThreads);
    }
    float* lse_gmem = p.lse == nullptr
                          ? nullptr
                          : p.lse + origin.batch * p.lse_batch_stride + q_at.head * p.lse_head_stride +
                                origin.q_row + q_at.row;
#pragma unroll
    for (int h = 0; h < 2; ++h) {   // rows g, g + 8 of the warp's 16
        const int row = group_row0 + warp * Kt::kWarpRows + h * kFragRowHalf + g;
#pragma unroll
        for (int nd = 0; nd < Kt::kDTiles; ++nd) {   // column tile nd: 8 elements = one 16 B chunk
            const u32 addr = o_tile + OTile::chunk_offset(row, nd) + t * kFragCols * sizeof(OutT);
            st_shared_b32(addr, pack_float2<OutT>(o[0][nd][2 * h], o[0][nd][2 * h + 1]));
        }
        if (lse_gmem != nullptr && t == 0 && q_at.row + row < p.seqlen_q) lse_gmem[row] = lse[0][h];
    }
    gmma::fence_proxy_async();   // the generic-proxy stores, before TMA (the async proxy) reads them
    named_sync(kEpilogueBarrierBase + consumer, gmma::kWarpgroupThreads);
    const int rows_left = p.seqlen_q - (q_at.row + group_row0);   // rows of the group inside the sequence
    if (FLASHKIT_VARLEN && rows_left < gmma::kWarpgroupRows) {
        store_rows<Kt>(o_tile, group_row0, rows_left, p, q_at, origin, tid_in_group);
        named_sync(kEpilogueBarrierBase + consumer, gmma::kWarpgroupThreads);   // every read of the rows done
        return;
    }
    if (tid_in_group == 0 && rows_left > 0) {
#pragma unroll
        for (int pnl = 0; pnl < Kt::kOPanels; ++pnl)
            tma_store(o_map, o_tile + pnl * OTile::kPanelSize + group_row0 * OTile::kPanelBytes,
                      pnl * Kt::kOPanelElems, origin.q_row + q_at.row + group_row0, q_at.head, origin.batch);
        bulk_commit();
        if constexpr (!Kt::kOwnOTile) bulk_wait_read();
    }
}

// At a consumer's end (kOwnOTile): the last store has read its rows before the CTA's shared memory goes.
template <class Kt>
__device__ __forceinline__ void drain_output_stores(int tid_in_group) {
    if (Kt::kOwnOTile && tid_in_group == 0) bulk_wait_read();
}

}  // namespace hopper
}  // namespace flashkit
