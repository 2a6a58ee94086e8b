// Attention masks as types. A mask answers, for one query block (rows [m0, m0 + kBlockM)):
//   num_kv_blocks()      how many K/V tiles the block visits; they are visited in the order
//                        it = num_kv_blocks() - 1 down to 0, tile kv_block(it)
//   num_masked_blocks()  the first that many visited tiles need the element mask (tails,
//                        diagonal); the rest are fully visible (every key below seqlen_k) and skip it
//   kv_block(it)         the K/V tile index (block index, in units of kBlockN keys)
//   key_end(row)         keys [0, key_end(row)) may be visible to query row `row`
// A BlockSparse mask fits the same shape: kv_block(it) reads the index list, num_kv_blocks()
// its count, num_masked_blocks() = num_kv_blocks() when its blocks do not align with tiles.
#pragma once

#include "flashkit/params.cuh"
#include "flashkit/traits.cuh"

namespace flashkit {

__device__ __forceinline__ int ceil_div(int a, int b) { return (a + b - 1) / b; }

// States of a classified (query tile, key tile): written by a mask_mod's classifier (functor.cuh) or by a block mask's
// array code (flashkit/features/bwd_lists.py), read by the tile lists of the forward and the backward.
constexpr unsigned char kTileEmpty = 0;     // no row sees a key of it: never loaded
constexpr unsigned char kTilePartial = 1;   // some rows see some keys: the element mask applies
constexpr unsigned char kTileFull = 2;      // every valid row sees every key

// Every key < seqlen_k is visible; only the ragged last tile needs masking.
template <int kBlockM, int kBlockN>
struct NoMask {
    int seqlen_k;
    int n_blocks, n_masked;
    __device__ __forceinline__ NoMask(const Params& p, int m_block) : seqlen_k(p.seqlen_k) {
        n_blocks = ceil_div(seqlen_k, kBlockN);
        n_masked = n_blocks - seqlen_k / kBlockN;
    }
    __device__ __forceinline__ int num_kv_blocks() const { return n_blocks; }
    __device__ __forceinline__ int num_masked_blocks() const { return n_masked; }
    __device__ __forceinline__ int kv_block(int it) const { return it; }
    __device__ __forceinline__ int key_end(int row) const { return seqlen_k; }
};

// Causal, aligned to the bottom-right corner: query i sees key j iff j <= i + seqlen_k - seqlen_q.
// Tiles wholly above the diagonal are never visited; tiles crossing it (or the ragged tail)
// come first in visiting order and are the only ones masked.
template <int kBlockM, int kBlockN>
struct CausalMask {
    int seqlen_k;
    int offset;   // seqlen_k - seqlen_q: the diagonal's key index at query row 0
    int n_blocks, n_masked;
    __device__ __forceinline__ CausalMask(const Params& p, int m_block)
        : seqlen_k(p.seqlen_k), offset(p.seqlen_k - p.seqlen_q) {
        const int m0 = m_block * kBlockM;
        const int last_row = min(m0 + kBlockM, p.seqlen_q) - 1;
        // Keys [0, last_row + offset + 1) are visible to some row of the block.
        const int key_hi = min(seqlen_k, last_row + offset + 1);
        n_blocks = key_hi > 0 ? ceil_div(key_hi, kBlockN) : 0;
        // Keys [0, m0 + offset + 1) are visible to every row: whole tiles there need no mask.
        const int key_all = min(seqlen_k, m0 + offset + 1);
        const int n_full = key_all > 0 ? key_all / kBlockN : 0;
        n_masked = n_blocks - min(n_full, n_blocks);
    }
    __device__ __forceinline__ int num_kv_blocks() const { return n_blocks; }
    __device__ __forceinline__ int num_masked_blocks() const { return n_masked; }
    __device__ __forceinline__ int kv_block(int it) const { return it; }
    __device__ __forceinline__ int key_end(int row) const {
        return min(seqlen_k, row + offset + 1);
    }
};

// How many of the first visited tiles (num_kv_blocks() > 0) no row of a part of the block sees (rows [row_lo,
// row_lo + rows): one consumer warpgroup's of a Hopper query tile), so that the part may pass them by: causal, the
// tiles past the part's last visible key, which come first in visiting order; at most all but one, so that a part
// still runs a main loop (O = 0 on rows that see nothing). Every visit passed by is a masked one (but for a part
// wholly past seqlen_q, whose rows are never stored). Other masks: none.
// The count is the same in every lane of a warp, and is returned through a warp reduction, whose result ptxas keeps in
// a uniform register: the ring slots formed from it then stay uniform, as the wgmma descriptors need them (formed in
// ordinary registers, the causal hd128 kernel measured 8% slower).
template <class Mask>
__device__ __forceinline__ int unseen_leading_visits(const Mask&, int, int, int) {
    return 0;
}
template <int kBlockM, int kBlockN>
__device__ __forceinline__ int unseen_leading_visits(const CausalMask<kBlockM, kBlockN>& mask, int row_lo, int rows,
                                                     int seqlen_q) {
    const int key_hi = row_lo >= seqlen_q ? 0 : mask.key_end(min(row_lo + rows, seqlen_q) - 1);   // keys [0, key_hi)
    return static_cast<int>(
        __reduce_min_sync(kFullWarp, static_cast<unsigned>(mask.num_kv_blocks() - max(ceil_div(key_hi, kBlockN), 1))));
}

// The mask of a dense variant: CausalMask when it is built causal (FLASHKIT_CAUSAL), else NoMask.
template <bool kCausal, int kBlockM, int kBlockN>
struct DenseMask {
    typedef NoMask<kBlockM, kBlockN> type;
};
template <int kBlockM, int kBlockN>
struct DenseMask<true, kBlockM, kBlockN> {
    typedef CausalMask<kBlockM, kBlockN> type;
};

// S[i][j] = -inf where key j is not visible to query i, on an mma C-layout S tile:
// s[mi][ni][2h + e] is row row0 + 16 mi + 8 h, column col0 + 8 ni + e, where row0 is the
// thread's row g (absolute) and col0 the tile's first key + 2t.
template <class Mask, int kMTiles, int kNTiles>
__device__ __forceinline__ void apply_mask(const Mask& mask, float (&s)[kMTiles][kNTiles][4],
                                           int row0, int col0) {
#pragma unroll
    for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
        for (int h = 0; h < 2; ++h) {   // rows g, g + 8
            const int end = mask.key_end(row0 + mi * kMmaM + h * kFragRowHalf);
#pragma unroll
            for (int ni = 0; ni < kNTiles; ++ni)
#pragma unroll
                for (int e = 0; e < 2; ++e)
                    if (col0 + ni * kMmaN + e >= end) s[mi][ni][2 * h + e] = FLASHKIT_NEG_INF;
        }
}


// Local attention, flash-attn's window_size = (left, right) and FlashAttention-3's attention_chunk, with
// off = seqlen_k - seqlen_q (bottom-right aligned): query i sees key j iff
//   i + off - left <= j <= i + off + right                  (an open side arrives as seqlen_q + seqlen_k)
//   and, when chunk > 0, floor((i + off) / chunk) == floor(j / chunk).
// Causal is (left, 0) with no chunk limit. Each row sees one interval [key_begin(row), key_end(row)),
// both ends non-decreasing in the row, so query block rows [m0, m1] visit tiles
//   [key_begin(m0) / N, ceil(key_end(m1) / N))        (every other tile is never loaded),
// of which tiles inside [key_begin(m1), key_end(m0)) are visible to every row and skip the element mask.
// Visiting order (it = num_kv_blocks() - 1 down to 0): the masked tiles of the left edge, of the right
// edge, then the fully visible ones, so that the loop's "masked first" split holds.
// The intervals themselves (the backward's BwdLocal reads them too).
struct LocalWindow {
    const Params& p;
    __device__ __forceinline__ explicit LocalWindow(const Params& p_) : p(p_) {}

    // floor(x / c) * c for any sign of x (c > 0).
    static __device__ __forceinline__ int chunk_floor(int x, int c) {
        return (x >= 0 ? x / c : -((c - 1 - x) / c)) * c;
    }
    __device__ __forceinline__ int key_begin(int row) const {
        const int diag = row + p.seqlen_k - p.seqlen_q;
        int lo = max(0, diag - p.mods.window_left);
        if (p.mods.chunk > 0) lo = max(lo, chunk_floor(diag, p.mods.chunk));
        return lo;
    }
    __device__ __forceinline__ int key_end(int row) const {
        const int diag = row + p.seqlen_k - p.seqlen_q;
        int hi = min(p.seqlen_k, diag + p.mods.window_right + 1);
        if (p.mods.chunk > 0) hi = min(hi, chunk_floor(diag, p.mods.chunk) + p.mods.chunk);
        return hi;
    }
};

template <int kBlockM, int kBlockN>
struct LocalMask : LocalWindow {
    int n_blocks, n_masked;
    int n_full;    // fully visible tiles: it < n_full is tile full0 + it
    int full0;     // first fully visible tile
    int right0;    // first masked tile of the right edge (n_right of them, then the left edge)
    int n_right;
    int left0;     // first visited tile (the left edge's masked tiles start here)

    __device__ __forceinline__ LocalMask(const Params& p_, int m_block) : LocalWindow(p_) {
        const int m0 = m_block * kBlockM;
        const int m1 = min(m0 + kBlockM, p.seqlen_q) - 1;   // last row of the block
        const int lo = key_begin(m0), hi = key_end(m1);
        left0 = lo / kBlockN;
        const int end = hi > lo ? ceil_div(hi, kBlockN) : left0;   // no row sees a key: no tile
        n_blocks = end - left0;
        // Keys [key_begin(m1), key_end(m0)) are visible to every row of the block.
        const int f0 = max(left0, ceil_div(max(key_begin(m1), 0), kBlockN));
        const int f1 = min(end, key_end(m0) / kBlockN);
        if (f1 > f0) {
            full0 = f0, n_full = f1 - f0, right0 = f1, n_right = end - f1;
        } else {
            full0 = left0, n_full = 0, right0 = left0, n_right = n_blocks;
        }
        n_masked = n_blocks - n_full;
    }
    __device__ __forceinline__ int num_kv_blocks() const { return n_blocks; }
    __device__ __forceinline__ int num_masked_blocks() const { return n_masked; }
    __device__ __forceinline__ int kv_block(int it) const {
        if (it < n_full) return full0 + it;
        const int k = it - n_full;
        return k < n_right ? right0 + k : left0 + (k - n_right);
    }
};

// One row half h of an mma C-layout tile (s[ni][2h + e]: column 8 ni + e): -inf outside columns [lo, hi).
template <int kNTiles>
__device__ __forceinline__ void mask_outside(float (&s)[kNTiles][4], int h, int lo, int hi) {
#pragma unroll
    for (int ni = 0; ni < kNTiles; ++ni)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const int c = ni * kMmaN + e;
            if (c < lo || c >= hi) s[ni][2 * h + e] = FLASHKIT_NEG_INF;
        }
}

// S[i][j] = -inf outside [key_begin(i), key_end(i)) (same C layout as the generic apply_mask above).
template <int kBlockM, int kBlockN, int kMTiles, int kNTiles>
__device__ __forceinline__ void apply_mask(const LocalMask<kBlockM, kBlockN>& mask,
                                           float (&s)[kMTiles][kNTiles][4], int row0, int col0) {
#pragma unroll
    for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
        for (int h = 0; h < 2; ++h) {   // rows g, g + 8
            const int row = row0 + mi * kMmaM + h * kFragRowHalf;
            mask_outside(s[mi], h, mask.key_begin(row) - col0, mask.key_end(row) - col0);
        }
}

// The first key an Inner mask lets row see (LocalMask's window; 0 for the others), and whether it is a window.
template <class Inner>
__device__ __forceinline__ int inner_key_begin(const Inner&, int) { return 0; }
template <int kBlockM, int kBlockN>
__device__ __forceinline__ int inner_key_begin(const LocalMask<kBlockM, kBlockN>& m, int row) {
    return m.key_begin(row);
}
template <class Inner>
struct IsLocalMask {
    static constexpr bool value = false;
};
template <int kBlockM, int kBlockN>
struct IsLocalMask<LocalMask<kBlockM, kBlockN>> {
    static constexpr bool value = true;
};

// A variant's mask with local attention selected at compile time (FLASHKIT_WINDOW): LocalMask when
// kLocal, else the variant's own (NoMask, CausalMask).
template <bool kLocal, int kBlockM, int kBlockN, class Otherwise>
struct LocalOr {
    typedef Otherwise type;
};
template <int kBlockM, int kBlockN, class Otherwise>
struct LocalOr<true, kBlockM, kBlockN, Otherwise> {
    typedef LocalMask<kBlockM, kBlockN> type;
};

// Construct a variant's mask: the masks here take (params, m_block); a mask that needs the head and batch
// too (functor.cuh's FunctorMask) specializes MaskMaker.
template <class Mask>
struct MaskMaker {
    static __device__ __forceinline__ Mask make(const Params& p, int m_block, int, int) { return Mask(p, m_block); }
};
template <class Mask>
__device__ __forceinline__ Mask make_mask(const Params& p, int m_block, int head, int batch) {
    return MaskMaker<Mask>::make(p, m_block, head, batch);
}

}  // namespace flashkit
