// The FlashAttention-2 backward's epilogue (sm80/bwd_mainloop.cuh's BwdMainloop): dK and dV of the block's keys from
// the warps' fp32 registers to the gradients, 16-bit. A member of the main loop defined here, as its dQ is in
// sm80/bwd_dq.cuh (the same inlined code).
#pragma once

#include "flashkit/sm80/bwd_mainloop.cuh"
#include "flashkit/tile_store.cuh"

namespace flashkit {

// dK = scale dK, dV of the block's keys < seqlen_k and columns < head_dim (dV's: < head_dim_v), through shared memory:
// once every warp is done with the tiles (the barrier; the walk's last dQ read K and dS^T), each warp writes its keys x
// columns of dK and dV into two swizzled tiles at the buffer's start (dK's kN x kD, then dV's kN x kDv: a warp's 4 B
// stores of 8 rows of one 16 B chunk fall on 32 banks), then all threads copy them out as whole 16 B chunks, a warp
// instruction two 256 B rows at hd128 (tile_store.cuh). Stored straight from the accumulators, each warp instruction
// wrote 16 B pieces of 8 rows (as fa3_bwd's epilogue did, at ~9,700 cycles of a CTA; BENCHMARKS.md).
template <class Kt, class Mask, class Mod>
__device__ __forceinline__ void BwdMainloop<Kt, Mask, Mod>::store_dk_dv() const {
    typedef SwizzledTile<kD, Element> DkTile;
    typedef SwizzledTile<kDv, Element> DvTile;
    constexpr int kChunkElems = kChunkBytes / Kt::kElemBytes;
    static_assert(kN * (kD + kDv) * Kt::kElemBytes <= Kt::kTileBytes, "dK and dV staged in the tiles' buffer");
    const u32 dk_tile = sQ;   // the buffer's start (Q, dO, K, ...: none is read any more)
    const u32 dv_tile = sQ + kN * kD * Kt::kElemBytes;
    const int g = lane / kQuadLanes;
    const int c2 = kFragCols * (lane % kQuadLanes);
    cp_async_wait<0>();   // (a key block without visits never waited for its K and V)
    __syncthreads();
#pragma unroll
    for (int mi = 0; mi < Kt::kKeyTiles; ++mi)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = key_row0() + mi * kMmaM + g + h * kFragRowHalf;
#pragma unroll
            for (int nd = 0; nd < Kt::kColTiles; ++nd) {
                st_shared_b32(dk_tile + DkTile::chunk_offset(row, col0() / kChunkElems + nd) + c2 * Kt::kElemBytes,
                              pack_float2<Element>(acc_dk[mi][nd][2 * h] * p.softmax_scale,
                                                   acc_dk[mi][nd][2 * h + 1] * p.softmax_scale));
                if (nd < Kt::kColTilesV)
                    st_shared_b32(dv_tile + DvTile::chunk_offset(row, cols0<kDv>() / kChunkElems + nd) +
                                      c2 * Kt::kElemBytes,
                                  pack_float2<Element>(acc_dv[mi][nd][2 * h], acc_dv[mi][nd][2 * h + 1]));
            }
        }
    __syncthreads();
    int k_row = k_row0, seqlen_k = p.seqlen_k;
    if constexpr (FLASHKIT_VARLEN != 0) reload_range(p.varlen.cu_seqlens_k, batch, k_row, seqlen_k);   // not live
    // a padded call's columns past its head dim (a multiple of 8) hold zeros and are not stored; nor are dV's past
    // head_dim_v (bwd_passes.cuh's BwdVColumns)
    const int dk_chunks = kPadded ? p.head_dim / kChunkElems : kD / kChunkElems;
    const int dv_chunks = kVPadded ? BwdVColumns::call(p) / kChunkElems : kDv / kChunkElems;
    const int rows = min(kN, seqlen_k - n0);
    const BwdGradRows<Element> grads(p, t_batch, kv_head, static_cast<index_t>(k_row + n0));
    const int tid = threadIdx.x;
    store_tile_rows<DkTile, kD / kChunkElems, Kt::kThreads>(dk_tile, 0, rows, 0, dk_chunks, grads.dk,
                                                             p.bwd.dk_row_stride, tid);
    store_tile_rows<DvTile, kDv / kChunkElems, Kt::kThreads>(dv_tile, 0, rows, 0, dv_chunks, grads.dv,
                                                              p.bwd.dv_row_stride, tid);
}

}  // namespace flashkit
