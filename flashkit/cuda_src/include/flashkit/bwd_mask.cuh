// The backward's masks, seen from its CTA's key block: the query blocks the CTA visits, the key blocks before
// it that add to a query block's dQ (the deterministic order), and the element mask of a visit. Each key j is
// seen by one interval of queries [query_begin(j), query_end(j)), both ends non-decreasing in j:
//   BwdDense<kCausal>  every query, or (causal, bottom-right aligned) the queries from j - (seqlen_k - seqlen_q)
//                      on; the kernels mask the diagonal with their own causal test (BwdCausal, bwd_passes.cuh)
//   BwdLocal           window_size / attention_chunk, mask.cuh's LocalWindow transposed: with
//                      off = seqlen_k - seqlen_q, query i sees key j iff j - off - right <= i <= j - off + left
//                      and, with a chunk c, floor((i + off) / c) == floor(j / c) (causal arrives as right = 0)
// Rows past seqlen_q need no mask (their lse2 is +inf: P = 0), nor keys past seqlen_k (zero K and V rows,
// their dK and dV never stored, their dQ terms dS * 0 with P and dS packed saturated: numeric.cuh's SaturateFinite).
// Selection at compile time: BwdMaskOf<FLASHKIT_WINDOW, FLASHKIT_CAUSAL[, takes a chunk]>::type.
#pragma once

#include "flashkit/bwd_passes.cuh"
#include "flashkit/mask.cuh"
#include "flashkit/score_mod.cuh"

namespace flashkit {

template <bool kCausal_>
struct BwdDense {
    static constexpr bool kCausal = kCausal_;
    static constexpr bool kLocal = false;
    static constexpr bool kListed = false;   // visits from the mask's own intervals (bwd_lists.cuh: from lists)
    const Params& p;
    __device__ __forceinline__ explicit BwdDense(const Params& p_) : p(p_) {}
    // Query blocks [m_begin, m_end) see a key of [n0, n1), n1 <= seqlen_k (none where m_end <= m_begin).
    __device__ __forceinline__ int m_begin(int n0, int block_m) const {
        return BwdCausal<kCausal>::first_m_block(p, n0, block_m);
    }
    __device__ __forceinline__ int m_end(int /*n1*/, int block_m) const { return ceil_div(p.seqlen_q, block_m); }
    // The first key block that adds to the dQ of the query block at m0: block 0 (it sees every query of it).
    __device__ __forceinline__ int first_n_block(int /*m0*/, int /*block_n*/) const { return 0; }
};

// The queries [lo[h], hi[h]) that see a thread's two keys of an mma C-layout S^T tile (rows key, key + 8),
// kept over the CTA's visits (the keys never change).
struct BwdKeyRows {
    int lo[2], hi[2];
};

// kChunk = false: a kernel that takes no attention_chunk (fa3_bwd: its manifest declares none, so a call with one
// runs elsewhere), whose intervals need no division by the chunk (the dQ writers' deterministic turn, at the
// producer warpgroup's 24 registers, spilled 16-48 B with it).
template <bool kChunk = true>
struct BwdLocalMask : LocalWindow {
    static constexpr bool kCausal = false;
    static constexpr bool kLocal = true;
    static constexpr bool kListed = false;
    __device__ __forceinline__ explicit BwdLocalMask(const Params& p_) : LocalWindow(p_) {}

    __device__ __forceinline__ int query_begin(int j) const {
        const int off = p.seqlen_k - p.seqlen_q;
        int lo = j - off - p.mods.window_right;
        if (kChunk && p.mods.chunk > 0) lo = max(lo, j / p.mods.chunk * p.mods.chunk - off);   // j >= 0
        return max(lo, 0);
    }
    __device__ __forceinline__ int query_end(int j) const {
        const int off = p.seqlen_k - p.seqlen_q;
        int hi = j - off + p.mods.window_left + 1;
        if (kChunk && p.mods.chunk > 0) hi = min(hi, j / p.mods.chunk * p.mods.chunk + p.mods.chunk - off);
        return min(hi, p.seqlen_q);
    }
    __device__ __forceinline__ int m_begin(int n0, int block_m) const { return query_begin(n0) / block_m; }
    __device__ __forceinline__ int m_end(int n1, int block_m) const {
        return ceil_div(max(query_end(n1 - 1), 0), block_m);
    }
    // The first key block seeing a query of the block at m0: the one holding key_begin(m0) (the smallest key
    // whose queries reach m0); every block from it to the CTA's visits that query block.
    __device__ __forceinline__ int first_n_block(int m0, int block_n) const {
        if constexpr (kChunk) return key_begin(m0) / block_n;
        return max(0, m0 + p.seqlen_k - p.seqlen_q - p.mods.window_left) / block_n;
    }

    // Without a chunk, key j is seen by query i iff key_minus_query_min() <= j - i <= key_minus_query_max():
    // uniform limits on a difference (the fa3_bwd consumers' one-register form; chunks go to fa2_bwd).
    __device__ __forceinline__ int key_minus_query_min() const {
        return p.seqlen_k - p.seqlen_q - p.mods.window_left;
    }
    __device__ __forceinline__ int key_minus_query_max() const {
        return p.seqlen_k - p.seqlen_q + p.mods.window_right;
    }

    __device__ __forceinline__ BwdKeyRows key_rows(int key) const {
        BwdKeyRows r;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            r.lo[h] = query_begin(key + h * kFragRowHalf);
            r.hi[h] = query_end(key + h * kFragRowHalf);
        }
        return r;
    }
};

// S^T = -inf outside the queries of each key row: st[ni][2h + e] is key row h, query query0 + 8 ni + e.
template <int kTiles>
__device__ __forceinline__ void apply_key_mask(const BwdKeyRows& rows, float (&st)[kTiles][4], int query0) {
#pragma unroll
    for (int h = 0; h < 2; ++h) mask_outside(st, h, rows.lo[h] - query0, rows.hi[h] - query0);
}

// S^T = mod(S^T) on the same layout (score_mod.cuh's types take the query as the row, the key as the column).
template <class Mod, int kTiles>
__device__ __forceinline__ void apply_score_mod_transposed(const Mod& mod, float (&st)[kTiles][4], int key0,
                                                           int query0) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int key = key0 + h * kFragRowHalf;
        const float key_f = static_cast<float>(key);
#pragma unroll
        for (int ni = 0; ni < kTiles; ++ni)
#pragma unroll
            for (int e = 0; e < 2; ++e)
                st[ni][2 * h + e] = mod.score(st[ni][2 * h + e], query0 + ni * kMmaN + e, key, key_f);
    }
}
template <int kTiles>
__device__ __forceinline__ void apply_score_mod_transposed(const NoScoreMod&, float (&)[kTiles][4], int, int) {}
// ALiBi: |query + off - key| = |d_h + c| for column c = 8 ni + e, with one d_h = query0 + off - key a key row
// (a float add per score, not a conversion per query).
template <int kTiles>
__device__ __forceinline__ void apply_score_mod_transposed(const Alibi& mod, float (&st)[kTiles][4], int key0,
                                                           int query0) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const float d = static_cast<float>(query0 + mod.p.seqlen_k - mod.p.seqlen_q - key0 - h * kFragRowHalf);
#pragma unroll
        for (int ni = 0; ni < kTiles; ++ni)
#pragma unroll
            for (int e = 0; e < 2; ++e)
                st[ni][2 * h + e] = mod.biased(st[ni][2 * h + e], fabsf(d + static_cast<float>(ni * kMmaN + e)));
    }
}
// Softcap then ALiBi, each on the whole tile.
template <class A, class B, int kTiles>
__device__ __forceinline__ void apply_score_mod_transposed(const ComposeMods<A, B>& mod, float (&st)[kTiles][4],
                                                           int key0, int query0) {
    apply_score_mod_transposed(mod.a, st, key0, query0);
    apply_score_mod_transposed(mod.b, st, key0, query0);
}

// S^T = mod(S^T), and each element's slope d mod / ds held as f16 pairs (Mod::kHeldGrad: index-free, in [0, 1];
// SlopeElement's default):
// slope[ni][h] = the slopes of st[ni][2h], st[ni][2h + 1] (pack_float2's order).
template <class Mod, int kTiles>
__device__ __forceinline__ void apply_score_mod_transposed(const Mod& mod, float (&st)[kTiles][4],
                                                           u32 (&slope)[kTiles][2], int key0, int query0) {
    static_assert(Mod::kHeldGrad, "the modification's slopes cannot be held (score_mod.cuh's kHeldGrad)");
    apply_score_mod_transposed(mod, st, key0, query0);
#pragma unroll
    for (int ni = 0; ni < kTiles; ++ni)
#pragma unroll
        for (int h = 0; h < 2; ++h)
            slope[ni][h] = pack_float2<half_t>(mod.grad(st[ni][2 * h], 0, 0), mod.grad(st[ni][2 * h + 1], 0, 0));
}

// Softcap then ALiBi: softcap's slopes, taken between the two (ALiBi's is 1: score_mod.cuh's RecomputedSlopes).
template <class A, class B, int kTiles>
__device__ __forceinline__ void apply_score_mod_transposed(const ComposeMods<A, B>& mod, float (&st)[kTiles][4],
                                                           u32 (&slope)[kTiles][2], int key0, int query0) {
    static_assert(RecomputedSlopes<ComposeMods<A, B>>::value, "the second modification's slope is 1");
    apply_score_mod_transposed(mod.a, st, slope, key0, query0);
    apply_score_mod_transposed(mod.b, st, key0, query0);
}

// How many key blocks add to query block m_block's dQ before block n_block (the deterministic order): every block
// from the mask's first_n_block on (bwd_lists.cuh overloads it for listed visits).
template <int kBlockM, int kBlockN, class Mask>
__device__ __forceinline__ int dq_turn(const Mask& mask, int m_block, int n_block, int /*head*/, int /*batch*/) {
    return n_block - mask.first_n_block(m_block * kBlockM, kBlockN);
}

typedef BwdLocalMask<> BwdLocal;

// kChunk: whether the kernel takes attention_chunk (BwdLocalMask).
template <bool kLocal, bool kCausal, bool kChunk = true>
struct BwdMaskOf {
    typedef BwdDense<kCausal> type;
};
template <bool kCausal, bool kChunk>
struct BwdMaskOf<true, kCausal, kChunk> {
    typedef BwdLocalMask<kChunk> type;
};

}  // namespace flashkit
