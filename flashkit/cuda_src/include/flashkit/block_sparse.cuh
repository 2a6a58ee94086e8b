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

    const int* index;   // this query block's ascending kept K/V block indices
    int tiles_per_block;   // tpb = mask_block_k / kBlockN
    int seqlen_k;
    int offset;   // seqlen_k - seqlen_q: the causal diagonal's key at query row 0
    int n_blocks, n_masked;   // visited tiles; the first n_masked of them visited are masked

    __device__ __forceinline__ BlockSparseMask(const Params& p, int m_block, int head, int batch)
        : seqlen_k(p.seqlen_k), offset(p.seqlen_k - p.seqlen_q) {
        const int m0 = m_block * kBlockM;
        const int mask_b = p.mask_batch == 1 ? 0 : batch;   // broadcast over batch / heads
        const int mask_h = p.mask_heads == 1 ? 0 : head;
        const int q_block = m0 / p.mask_block_q;
        const index_t row = (static_cast<index_t>(mask_b) * p.mask_heads + mask_h) *
                                p.mask_q_blocks + q_block;
        const int count = p.kv_block_count[row];
        index = p.kv_block_index + row * p.mask_k_blocks;
        tiles_per_block = p.mask_block_k / kBlockN;

        // Keys [0, key_hi) may be visible to some row of the tile, [0, key_all) to every row.
        int key_hi = seqlen_k, key_all = seqlen_k;
        if constexpr (kCausal) {
            const int last_row = min(m0 + kBlockM, p.seqlen_q) - 1;
            key_hi = max(0, min(seqlen_k, last_row + offset + 1));
            key_all = max(0, min(seqlen_k, m0 + offset + 1));
        }
        n_blocks = tiles_below(ceil_div(key_hi, kBlockN), count);   // tiles holding a visible key
        n_masked = n_blocks - tiles_below(key_all / kBlockN, count);   // tiles not seen whole
    }

    // How many listed tiles have a tile index < tile_limit: a prefix of the ascending list.
    __device__ __forceinline__ int tiles_below(int tile_limit, int count) const {
        // Blocks [0, nb) of the list start below tile_limit (lower bound over ascending indices).
        const int block_limit = ceil_div(tile_limit, tiles_per_block);
        int lo = 0, hi = count;
        while (lo < hi) {
            const int mid = (lo + hi) / 2;
            if (index[mid] < block_limit) lo = mid + 1;
            else hi = mid;
        }
        if (lo == 0) return 0;
        // Every block but the last is whole; the last may straddle tile_limit.
        const int last_tiles = min(tiles_per_block, tile_limit - index[lo - 1] * tiles_per_block);
        return (lo - 1) * tiles_per_block + last_tiles;
    }

    __device__ __forceinline__ int num_kv_blocks() const { return n_blocks; }
    __device__ __forceinline__ int num_masked_blocks() const { return n_masked; }
    // tile(it) = index[it / tpb] * tpb + it % tpb.
    __device__ __forceinline__ int kv_block(int it) const {
        const int b = it / tiles_per_block;
        return index[b] * tiles_per_block + (it - b * tiles_per_block);
    }
    __device__ __forceinline__ int key_end(int row) const {
        if constexpr (kCausal) return min(seqlen_k, row + offset + 1);
        return seqlen_k;
    }
};

}  // namespace flashkit
