// The warp-specialized Hopper backward's epilogue: BwdConsumerBase's (bwd_consumer_base.cuh) store_dk_dv, a member
// defined here as fa2_bwd's is in sm80/bwd_epilogue.cuh.
#pragma once

#include "flashkit/hopper/bwd_consumer_base.cuh"
#include "flashkit/tile_store.cuh"

namespace flashkit {
namespace hopper {

// dK = scale dK, dV of the consumer's keys < seqlen_k and its columns < head_dim (dV's: < head_dim_v,
// bwd_passes.cuh's BwdVColumns), 16-bit, through the K and V tiles: once every consumer's last products have read
// them (the barrier), each consumer writes its rows x columns of dK and dV into the tiles' places of the same keys
// and columns (a warp's 4 B stores of 8 rows of one 16 B chunk fall on 32 banks under the 128 B swizzle), then
// copies them out as whole 16 B chunks, two 256 B rows a warp instruction at hd128 (store_tile_rows). Stored
// straight from the accumulators, each warp instruction wrote 16 B pieces of 8 rows, and the epilogue took ~9,700
// cycles of a CTA, 7% of its time at hd128 with 2048 queries (clock64 stamps, BENCHMARKS.md).
template <class Kt, class Mask, class Share_>
__device__ __forceinline__ void BwdConsumerBase<Kt, Mask, Share_>::store_dk_dv(const BwdCta<Kt>& cta) const {
    typedef typename Kt::VTile VTile;
    constexpr int kChunkElems = kChunkBytes / Kt::kElemBytes;
    const u32 k_tile = cta.smem + Kt::kKOffset;
    const u32 v_tile = cta.smem + Kt::kVOffset;
    const int row0 = s_key_row0();   // the consumer's rows of the tiles
    named_sync<kAlignedBarriers>(kBwdDsReadyBarrier, Kt::kConsumerThreads);   // no product reads K or V any more
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int row = row0 + warp_row + h * kFragRowHalf;
#pragma unroll
        for (int nd = 0; nd < Share::kAccTiles; ++nd) {
            if (nd < Share::kDkTiles)
                st_shared_b32(k_tile + KTile::chunk_offset(row, own_col0() / kChunkElems + nd) +
                              col2 * Kt::kElemBytes,
                              pack_float2<Element>(acc_dk[nd][2 * h] * p.softmax_scale,
                                                   acc_dk[nd][2 * h + 1] * p.softmax_scale));
            if (nd < Share::kDvTiles)
                st_shared_b32(v_tile + VTile::chunk_offset(row, own_col0_v() / kChunkElems + nd) +
                              col2 * Kt::kElemBytes,
                              pack_float2<Element>(acc_dv[nd][2 * h], acc_dv[nd][2 * h + 1]));
        }
    }
    named_sync<kAlignedBarriers>(kBwdConsumerBarrier + consumer, gmma::kWarpgroupThreads);
    // a padded call's columns past its head dim (a multiple of 8) hold zeros and are not stored; nor are dV's past
    // head_dim_v (v's own columns where v is narrower, or the column split's V tiles wider than v's class)
    const int dk_chunks = FLASHKIT_HEAD_DIM_PADDED ? p.head_dim / kChunkElems : kD / kChunkElems;
    const int dv_chunks = BwdVColumns::kPadded || BwdVColumns::kNarrower ? BwdVColumns::call(p) / kChunkElems
                                                                         : Kt::kHeadDimV / kChunkElems;
    const int rows = min(Kt::kConsumerKeys, p.seqlen_k - key0);
    const BwdGradRows<Element> grads(p, batch, kv_head, static_cast<index_t>(key0));
    store_tile_rows<KTile, Share::kDkTiles, gmma::kWarpgroupThreads>(
        k_tile, row0, rows, own_col0() / kChunkElems, dk_chunks, grads.dk, p.bwd.dk_row_stride, tid);
    store_tile_rows<VTile, Share::kDvTiles, gmma::kWarpgroupThreads>(
        v_tile, row0, rows, own_col0_v() / kChunkElems, dv_chunks, grads.dv, p.bwd.dv_row_stride, tid);
}

}  // namespace hopper
}  // namespace flashkit
