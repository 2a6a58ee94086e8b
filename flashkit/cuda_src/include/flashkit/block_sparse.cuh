// The block-sparse mask type: the K/V tiles a query block visits come from a compressed block
// mask (flashkit.BlockMask, docs/kernel-contract.md), intersected with an element mask Inner (mask.cuh's NoMask,
// CausalMask or LocalMask: the variant's causal / window_size / attention_chunk).
//
// Compressed form, per (mask batch, mask head, query block r):
//   kv_block_count[r]        how many K/V blocks of mask_block_k keys query block r keeps
//   kv_block_index[r][0..c)  their indices, ascending (entries past the count are unread)
// Geometry: the kernel's tiles must nest in the mask's blocks: kBlockM divides mask_block_q and
// kBlockN divides mask_block_k (flashkit.BlockMask allows multiples of kMaskBlockMultiple, 128).
// Mask block b covers kernel tiles [b * tpb, (b + 1) * tpb), tpb = mask_block_k / kBlockN, so the
// listed tiles, in ascending order, are tile(pos) = index[pos / tpb] * tpb + pos % tpb.
//
// Inner lets each row see one interval of keys, [key_begin(row), key_end(row)), both ends non-decreasing in the row
// (mask.cuh). So the listed tiles that hold a key some row of the block sees are the list positions [a, b) of the
// tiles in [key_begin(m0) / N, ceil(key_end(m1) / N)), and those every row sees whole the positions [af, bf) of the
// tiles in [ceil(key_begin(m1) / N), key_end(m0) / N): each position a lower bound over the ascending index list
// (tiles_below). The masked positions are [a, af) (the window's left edge) and [bf, b) (the right edge, the
// diagonal, the ragged tail). Visiting order (it = num_kv_blocks() - 1 down to 0, fwd_block and the Hopper consumers
// descend) as LocalMask's: the left edge, the right edge, then the whole ones, so that the masked visits come first.
// Without a window nothing is masked on the left (a = af = 0) and visit it is list position it.
// A row whose kept blocks are all dropped (count 0, or every kept key hidden by Inner) keeps
// m = -inf, l = 0 and ends with O = 0, LSE = -inf (softmax.cuh).
#pragma once

#include "flashkit/mask.cuh"

namespace flashkit {

// BlockMask block sizes are multiples of this; the kernel tiles (kBlockM, kBlockN) divide it.
constexpr int kMaskBlockMultiple = 128;

template <int kBlockM, int kBlockN, class Inner>
struct BlockSparseMask {
    static_assert(kMaskBlockMultiple % kBlockM == 0, "query tiles nest in mask blocks");
    static_assert(kMaskBlockMultiple % kBlockN == 0, "key tiles nest in mask blocks");
    static constexpr bool kLeftEdge = IsLocalMask<Inner>::value;   // a window's rows may start past key 0

    // Register economy (the main loop runs at the register limit): geometry is re-read from the
    // kernel's parameter block (constant bank) instead of being held; only the list offsets are.
    const Params& p;
    int list;   // offset of this query block's index list in kv_block_index
    int n_blocks, n_full;   // visited tiles; the last n_full of them visited are seen whole
    int full0, n_right, left0;   // with kLeftEdge: the list positions af, b - bf (the right edge's count) and a

    __device__ __forceinline__ BlockSparseMask(const Params& p_, int m_block, int head, int batch)
        : p(p_) {
        const int m0 = m_block * kBlockM;
        const int mask_b = p.mask_batch == 1 ? 0 : batch;   // broadcast over batch / heads
        const int mask_h = p.mask_heads == 1 ? 0 : head;
        const int row = (mask_b * p.mask_heads + mask_h) * p.mask_q_blocks + m0 / p.mask_block_q;
        const int count = p.kv_block_count[row];
        list = row * p.mask_k_blocks;

        const Inner inner(p, m_block);
        const int m1 = min(m0 + kBlockM, p.seqlen_q) - 1;   // last row of the block
        // Keys [lo, hi) may be visible to some row of the tile, [all_lo, all_hi) to every row.
        const int lo = inner_key_begin(inner, m0), hi = max(lo, inner.key_end(m1));
        const int all_lo = max(lo, inner_key_begin(inner, m1)), all_hi = min(hi, max(0, inner.key_end(m0)));
        const int f0 = ceil_div(all_lo, kBlockN), f1 = all_hi / kBlockN;   // the tiles every row sees whole
        if constexpr (kLeftEdge) {
            const int a = tiles_below(lo / kBlockN, count);
            const int b = hi > lo ? tiles_below(ceil_div(hi, kBlockN), count) : a;   // no row sees a key: no tile
            const int af = f1 > f0 ? tiles_below(f0, count) : a;
            const int bf = f1 > f0 ? tiles_below(f1, count) : a;
            n_blocks = b - a;
            n_full = bf - af;
            full0 = af, n_right = b - bf, left0 = a;
        } else {   // lo = all_lo = 0: the whole tiles are a prefix of the list
            n_blocks = tiles_below(ceil_div(hi, kBlockN), count);
            n_full = tiles_below(f1, count);
        }
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
    __device__ __forceinline__ int num_masked_blocks() const { return n_blocks - n_full; }
    // The list position of visit it (LocalMask's order), then its tile index[pos / tpb] * tpb + pos % tpb.
    __device__ __forceinline__ int kv_block(int it) const {
        int pos = it;
        if constexpr (kLeftEdge) {
            const int k = it - n_full;
            pos = it < n_full ? full0 + it : (k < n_right ? full0 + n_full + k : left0 + (k - n_right));
        }
        const int tpb = tiles_per_block();
        const int b = pos / tpb;
        return p.kv_block_index[list + b] * tpb + (pos - b * tpb);
    }
    // Inner's element mask (its key_begin / key_end do not depend on the query block).
    __device__ __forceinline__ Inner element_mask() const { return Inner(p, 0); }
};

// A masked visit: Inner's element mask (the ragged tail, the causal diagonal, the window's edges).
template <int kBlockM, int kBlockN, class Inner, int kMTiles, int kNTiles>
__device__ __forceinline__ void apply_mask(const BlockSparseMask<kBlockM, kBlockN, Inner>& mask,
                                           float (&s)[kMTiles][kNTiles][4], int row0, int col0) {
    apply_mask(mask.element_mask(), s, row0, col0);
}

}  // namespace flashkit
