// GQA packing: the query heads of one KV group, and the query rows of a short query, share the rows of
// one tile, so that one CTA reads each K/V tile once for the whole group.
//
// Packed row R of kv head kvh (R < rows = seqlen_q * group, group = heads / kv_heads):
//   query row qi = R / group,  query head = kvh * group + R % group
// Consecutive rows are consecutive heads of one query row: adjacent in the (batch, seqlen, heads, D)
// layout, so a packed tile gathers whole 16-byte chunks.
#pragma once

#include "flashkit/tile.cuh"

namespace flashkit {

struct PackedRows {
    int group;   // query heads per kv head
    int rows;    // seqlen_q * group packed rows of one kv head
    int kv_head;

    __device__ __forceinline__ PackedRows(const Params& p, int kv_head_)
        : group(p.heads / p.kv_heads), rows(p.seqlen_q * (p.heads / p.kv_heads)), kv_head(kv_head_) {}
    __device__ __forceinline__ int query_row(int r) const { return r / group; }
    __device__ __forceinline__ int head(int r) const { return kv_head * group + r % group; }
};

// Keys [0, key_end) a query row sees: all seqlen_k, or, causal (bottom-right aligned), keys
// j <= qi + seqlen_k - seqlen_q; 0 when it sees none.
template <bool kCausal>
__device__ __forceinline__ int row_key_end(int qi, int seqlen_k, int seqlen_q) {
    if (!kCausal) return seqlen_k;
    const int end = qi + seqlen_k - seqlen_q + 1;
    return end < 0 ? 0 : (end < seqlen_k ? end : seqlen_k);
}

// cp.async of packed rows [row0, row0 + kRows) of one (batch, kv head) into a swizzled Q tile; rows past
// `rows`, and 16 B chunks from chunks_valid on (a head dim below its compiled class), are zero-filled. One
// commit group; all kThreads threads call it.
template <int kRows, int kHeadDim, int kThreads, typename T>
__device__ __forceinline__ void load_packed_q_async(const Params& p, const PackedRows& pack, u32 sQ, int batch,
                                                    int row0, int tid, int chunks_valid) {
    constexpr int kChunkElems = kChunkBytes / static_cast<int>(sizeof(T));
    constexpr int kRowChunks = kHeadDim / kChunkElems;
    const T* q = static_cast<const T*>(p.q);
    for (int idx = tid; idx < kRows * kRowChunks; idx += kThreads) {
        const int r = idx / kRowChunks;
        const int c = idx % kRowChunks;
        const int row = row0 + r;
        const bool valid = row < pack.rows && c < chunks_valid;
        const T* src = valid ? q + batch * p.q_batch_stride + pack.query_row(row) * p.q_row_stride +
                                   pack.head(row) * p.q_head_stride + c * kChunkElems
                             : q;
        cp_async_16(sQ + SwizzledTile<kHeadDim, T>::chunk_offset(r, c), src, valid);
    }
    cp_async_commit();
}

}  // namespace flashkit
