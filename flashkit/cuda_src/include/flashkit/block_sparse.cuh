// The block-sparse mask type: the K/V tiles a query block visits come from a compressed block
// mask (flashkit.BlockMask, docs/kernel-contract.md), optionally intersected with causal.
//
// Compressed form, per (mask batch, mask head, query block r):
//   kv_block_count[r]        how many K/V blocks of mask_block_k keys query block r keeps
//   kv_block_index[r][0..c)  their indices, ascending (entries past the count are unread)
// Geometry: the kernel's tiles must nest in the mask's blocks: kBlockM divides mask_block_q and
// kBlockN divides mask_block_k (flashkit.BlockMask allows multiples of kMaskBlockMultiple, 128).
// Mask block b covers kernel tiles [b * tpb, (b + 1) * tpb), tpb = mask_block_k / kBlockN, so the
// visited tiles, in ascending order, are tile(it) = index[it / tpb] * tpb + it % tpb.
//
// The visited list is cut to the tiles that can hold a visible key (< seqlen_k, and with causal
// <= last row + seqlen_k - seqlen_q): since the list ascends, that is a prefix of it, found by
// binary search over the index list. Likewise the tiles that every row of the block sees whole
// (no ragged tail, wholly below the causal diagonal) are a prefix; the rest, visited first by
// fwd_block (it descends), are the only ones masked element-wise through key_end(row).
// A row whose kept blocks are all dropped (count 0, or every kept key causally hidden) keeps
// m = -inf, l = 0 and ends with O = 0, LSE = -inf (softmax.cuh).
#pragma once

#include "flashkit/mask.cuh"

namespace flashkit {

// BlockMask block sizes are multiples of this; the kernel tiles (kBlockM, kBlockN) divide it.
constexpr int kMaskBlockMultiple = 128;

template <int kBlockM, int kBlockN, bool kCausal>
struct BlockSparseMask {
    static_assert(kMaskBlockMultiple % kBlockM == 0, "query tiles nest in mask blocks");
    static_assert(kMaskBlockMultiple % kBlockN == 0, "key tiles nest in mask blocks");

    // Register economy (the main loop runs at the register limit): geometry is re-read from the
    // kernel's parameter block (constant bank) instead of being held; only the list offset is.
    const Params& p;
    int list;   // offset of this query block's index list in kv_block_index
    int n_blocks, n_masked;   // visited tiles; the first n_masked of them visited are masked

    __device__ __forceinline__ BlockSparseMask(const Params& p_, int m_block, int head, int batch)
        : p(p_) {
        const int m0 = m_block * kBlockM;
        const int mask_b = p.mask_batch == 1 ? 0 : batch;   // broadcast over batch / heads
        const int mask_h = p.mask_heads == 1 ? 0 : head;
        const int row = (mask_b * p.mask_heads + mask_h) * p.mask_q_blocks + m0 / p.mask_block_q;
        const int count = p.kv_block_count[row];
        list = row * p.mask_k_blocks;

        // Keys [0, key_hi) may be visible to some row of the tile, [0, key_all) to every row.
        int key_hi = p.seqlen_k, key_all = p.seqlen_k;
        if constexpr (kCausal) {
            const int offset = p.seqlen_k - p.seqlen_q;
            const int last_row = min(m0 + kBlockM, p.seqlen_q) - 1;
            key_hi = max(0, min(p.seqlen_k, last_row + offset + 1));
            key_all = max(0, min(p.seqlen_k, m0 + offset + 1));
        }
        n_blocks = tiles_below(ceil_div(key_hi, kBlockN), count);   // tiles holding a visible key
        n_masked = n_blocks - tiles_below(key_all / kBlockN, count);   // tiles not seen whole
    }

    // tpb: kernel tiles per mask block.
    __device__ __forceinline__ int tiles_per_block() const { return p.mask_block_k / kBlockN; }

    // How many listed tiles have a tile index < tile_limit: a prefix of the ascending list.
    __device__ __forceinline__ int tiles_below(int tile_limit, int count) const {
        const int tpb = tiles_per_block();
        const int* index = p.kv_block_index + list;
        // Blocks [0, lo) of the list start below tile_limit (lower bound over ascending indices).
        const int block_limit = ceil_div(tile_limit, tpb);
        int lo = 0, hi = count;
        while (lo < hi) {
            const int mid = (lo + hi) / 2;
            if (index[mid] < block_limit) lo = mid + 1;
            else hi = mid;
        }
        if (lo == 0) return 0;
        // Every block but the last is whole; the last may straddle tile_limit.
        return (lo - 1) * tpb + min(tpb, tile_limit - index[lo - 1] * tpb);
    }

    __device__ __forceinline__ int num_kv_blocks() const { return n_blocks; }
    __device__ __forceinline__ int num_masked_blocks() const { return n_masked; }
    // tile(it) = index[it / tpb] * tpb + it % tpb.
    __device__ __forceinline__ int kv_block(int it) const {
        const int tpb = tiles_per_block();
        const int b = it / tpb;
        return p.kv_block_index[list + b] * tpb + (it - b * tpb);
    }
    // Causal: query `row` sees keys j <= row + seqlen_k - seqlen_q.
    __device__ __forceinline__ int key_end(int row) const {
        if constexpr (kCausal) return min(p.seqlen_k, row + p.seqlen_k - p.seqlen_q + 1);
        return p.seqlen_k;
    }
};

}  // namespace flashkit
