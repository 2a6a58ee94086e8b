// The V pre-pass of the fp8 wgmma kernel: V (batch, seqlen_k, kv_heads, D) e4m3 ->
// Vt (batch, kv_heads, D, keys) in the workspace, keys padded with zeros to whole kBlockN tiles.
// e4m3 wgmma reads both operands K-major, and for O += P V the k-index is the key: each row of Vt
// holds one head-dim column of V. Within every 16 keys the columns are stored in the P V
// permutation of fp8.cuh: logical key 16 q + 4 t + i holds physical key 16 q + 2 t + (i & 1) + 8 (i >> 1),
// so that the S accumulator's columns are P's A fragment with no shuffle.
// One CTA per (key tile, kv head, batch): the tile is staged row-major in shared memory, then each
// thread writes 16 logical keys of one Vt row with a 16 B store.
#pragma once

#include "flashkit/fp8.cuh"
#include "flashkit/mask.cuh"

namespace flashkit {
namespace fp8 {

template <int kHeadDim, int kBlockN, int kThreads>
__device__ __forceinline__ void transpose_v_block(const Params& p, u8* staging, int n_block, int kv_head,
                                                  int batch) {
    constexpr int kRowChunks = kHeadDim / kChunkBytes;
    constexpr int kStageRow = kHeadDim + kChunkBytes;   // padded: rows 1 apart start 4 banks apart
    constexpr int kKeyChunks = kBlockN / kPermKeys;
    const int tid = threadIdx.x;
    const int key0 = n_block * kBlockN;
    const u8* v = static_cast<const u8*>(p.v) + batch * p.v_batch_stride + kv_head * p.v_head_stride;
    for (int idx = tid; idx < kBlockN * kRowChunks; idx += kThreads) {
        const int r = idx / kRowChunks, c = idx % kRowChunks;
        uint4 val = make_uint4(0u, 0u, 0u, 0u);
        if (key0 + r < p.seqlen_k) val = *reinterpret_cast<const uint4*>(v + (key0 + r) * p.v_row_stride + c * kChunkBytes);
        *reinterpret_cast<uint4*>(staging + r * kStageRow + c * kChunkBytes) = val;
    }
    __syncthreads();
    const index_t vt_row_stride = static_cast<index_t>(ceil_div(p.seqlen_k, kBlockN)) * kBlockN;
    u8* vt = static_cast<u8*>(p.workspace) + static_cast<index_t>(batch * p.kv_heads + kv_head) * kHeadDim * vt_row_stride + key0;
    for (int idx = tid; idx < kHeadDim * kKeyChunks; idx += kThreads) {
        const int d = idx / kKeyChunks, q = idx % kKeyChunks;
        const u8* col = staging + q * kPermKeys * kStageRow + d;
        u32 w[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            w[j] = 0u;
#pragma unroll
            for (int b = 0; b < 4; ++b) w[j] |= static_cast<u32>(col[pv_physical_key(4 * j + b) * kStageRow]) << (8 * b);
        }
        *reinterpret_cast<uint4*>(vt + d * vt_row_stride + q * kPermKeys) = make_uint4(w[0], w[1], w[2], w[3]);
    }
}

}  // namespace fp8
}  // namespace flashkit
