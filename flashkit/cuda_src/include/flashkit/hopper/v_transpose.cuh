// The V pre-pass of fa3_fp8.cu: V (batch, seqlen_k, kv_heads, D) -> Vt (batch, kv_heads, D, keys)
// in the workspace, keys padded with zeros to whole kBlockN tiles. e4m3 wgmma reads both operands
// K-major (16-bit wgmma can transpose B and reads V as it is: hopper.cu), and for O += P V the
// k-index is the key: each row of Vt holds one head-dim column of V. KeyOrder::physical(l) is the key
// whose value the stored (logical) key l holds: fp8's PvKeys, the P V permutation of fp8.cuh.
// One CTA per (key tile, kv head, batch): the tile is staged row-major in shared memory, then each
// thread writes one 16 B chunk (16 / sizeof(Element) keys) of one Vt row.
#pragma once

#include "flashkit/mask.cuh"
#include "flashkit/tile.cuh"

namespace flashkit {

// Staging rows of a V tile: a V row padded by one 16 B chunk, so that rows 1 apart start 4 banks apart.
template <typename Element, int kHeadDim>
__host__ __device__ constexpr int transpose_v_stage_row() {
    return kHeadDim * static_cast<int>(sizeof(Element)) + kChunkBytes;
}
// The dynamic shared memory the pre-pass launches with (FLASHKIT_EXPORT_ENTRY_SMEM_BYTES): one staged tile.
template <typename Element, int kHeadDim, int kBlockN>
__host__ __device__ constexpr int transpose_v_smem_bytes() {
    return kBlockN * transpose_v_stage_row<Element, kHeadDim>();
}

template <typename Element, class KeyOrder, int kHeadDim, int kBlockN, int kThreads>
__device__ __forceinline__ void transpose_v_block(const Params& p, u8* staging, int n_block, int kv_head,
                                                  int batch) {
    constexpr int kElemBytes = static_cast<int>(sizeof(Element));
    constexpr int kRowBytes = kHeadDim * kElemBytes;
    constexpr int kRowChunks = kRowBytes / kChunkBytes;
    constexpr int kStageRow = transpose_v_stage_row<Element, kHeadDim>();
    constexpr int kChunkKeys = kChunkBytes / kElemBytes;  // keys in 16 B of a Vt row
    constexpr int kWordKeys = 4 / kElemBytes;              // keys in a 32-bit word
    constexpr int kKeyChunks = kBlockN / kChunkKeys;
    static_assert(kElemBytes == 1 || kElemBytes == 2, "8- or 16-bit elements");
    const int tid = threadIdx.x;
    const int key0 = n_block * kBlockN;
    const Element* v = static_cast<const Element*>(p.v) + batch * p.v_batch_stride + kv_head * p.v_head_stride;
    for (int idx = tid; idx < kBlockN * kRowChunks; idx += kThreads) {
        const int r = idx / kRowChunks, c = idx % kRowChunks;
        uint4 val = make_uint4(0u, 0u, 0u, 0u);
        if (key0 + r < p.seqlen_k)
            val = *reinterpret_cast<const uint4*>(reinterpret_cast<const u8*>(v + (key0 + r) * p.v_row_stride) +
                                                  c * kChunkBytes);
        *reinterpret_cast<uint4*>(staging + r * kStageRow + c * kChunkBytes) = val;
    }
    __syncthreads();
    const index_t vt_row_stride = static_cast<index_t>(ceil_div(p.seqlen_k, kBlockN)) * kBlockN;   // elements
    Element* vt = static_cast<Element*>(p.workspace) +
                  static_cast<index_t>(batch * p.kv_heads + kv_head) * kHeadDim * vt_row_stride + key0;
    for (int idx = tid; idx < kHeadDim * kKeyChunks; idx += kThreads) {
        const int d = idx / kKeyChunks, q = idx % kKeyChunks;
        const u8* col = staging + d * kElemBytes;   // V column d, key 0
        u32 w[4] = {0u, 0u, 0u, 0u};
#pragma unroll
        for (int j = 0; j < kChunkKeys; ++j) {
            const u8* src = col + KeyOrder::physical(q * kChunkKeys + j) * kStageRow;
            u32 bits;
            if constexpr (kElemBytes == 1) bits = *src;
            else bits = *reinterpret_cast<const u16*>(src);
            w[j / kWordKeys] |= bits << (8 * kElemBytes * (j % kWordKeys));
        }
        *reinterpret_cast<uint4*>(vt + d * vt_row_stride + q * kChunkKeys) = make_uint4(w[0], w[1], w[2], w[3]);
    }
}

}  // namespace flashkit
