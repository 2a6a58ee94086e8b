// Drop-in functors (docs/functors.md): a mods/*.cu file defines, at global scope,
//   __device__ float score_mod(float score, int batch, int head, int q_idx, int kv_idx, const flashkit::ModArgs& args)
//   __device__ float score_mod_grad(float modded, int batch, int head, int q_idx, int kv_idx,
//                                   const flashkit::ModArgs& args)   (optional: the backward of a score_mod)
//   __device__ bool  mask_mod(int batch, int head, int q_idx, int kv_idx, const flashkit::ModArgs& args)
// (FlexAttention's semantics: score is the SCALED score softmax_scale * q.k; mask_mod true keeps the key), and
// flashkit builds it into a fast kernel with -DFLASHKIT_MOD_FILE="<path>" and FLASHKIT_SCORE_MOD / _MASK_MOD.
//   FunctorScoreMod    score_mod as a score_mod.cuh type. It returns scaled scores, so a functor build runs its
//                      softmax with softmax_scale_log2 = log2(e) (the runtime passes it): one multiply per score.
//   FunctorMask<Inner> a mask.cuh type: the K/V tiles a query block visits come from lists classified on the
//                      GPU before the launch (classify_tiles, compact_tiles: empty tiles are never loaded, full
//                      ones skip the element mask); partial tiles get Inner's element mask (causal, window, the
//                      ragged tail) and then mask_mod.
// Indices handed to a functor always lie in [0, seqlen): rows and keys of a ragged tile are clamped (their
// scores are masked anyway), so a functor may index its arrays without bounds checks.
#pragma once

#include "flashkit/mask.cuh"
#include "flashkit/score_mod.cuh"

#ifndef FLASHKIT_SCORE_MOD_GRAD
#define FLASHKIT_SCORE_MOD_GRAD 0   // (FLASHKIT_SCORE_MOD, FLASHKIT_MASK_MOD: traits.cuh)
#endif
#ifndef FLASHKIT_SCORE_MOD_BIAS
#define FLASHKIT_SCORE_MOD_BIAS 0   // the manifest's bias: true (score_mod adds a term that does not read the score)
#endif


#ifdef FLASHKIT_MOD_FILE
#include FLASHKIT_MOD_FILE
#endif

namespace flashkit {

#if FLASHKIT_SCORE_MOD
// S = score_mod(scale * s) on raw scores s = q.k; the softmax then takes scaled scores (log2(e) as its factor).
// The backward (score_mod.cuh's interface) multiplies dS by d score_mod / d score: nothing for a bias (the manifest's
// bias: true, FLASHKIT_SCORE_MOD_BIAS: slope 1), else the file's score_mod_grad at the modified score m
// (FLASHKIT_SCORE_MOD_GRAD), taken where the backward recomputes m (RecomputedSlopes, below).
struct FunctorScoreMod {
    const Params& p;
    int head, batch;
    static constexpr bool kUnitGrad = FLASHKIT_SCORE_MOD_BIAS != 0;
    static constexpr bool kIndexed = true;
    static constexpr bool kHeldGrad = false;   // a file's slope may exceed f16's range and read the indices
    __device__ __forceinline__ FunctorScoreMod(const Params& p_, int head_, int batch_)
        : p(p_), head(head_), batch(batch_) {}
    // Both indices clamped (the generic form: either may lie past its sequence).
    __device__ __forceinline__ float score(float s, int row, int col, float) const {
        return score_at<true, true>(s, row, col);
    }
#if FLASHKIT_SCORE_MOD_GRAD
    template <bool kClampRow, bool kClampCol>   // indices clamped as score_at's
    __device__ __forceinline__ float grad_at(float m, int row, int col) const {
        return ::score_mod_grad(m, batch, head, kClampRow ? min(row, p.seqlen_q - 1) : row,
                                kClampCol ? min(col, p.seqlen_k - 1) : col, p.mods.args);
    }
#endif
    // Indices clamped into the sequences where they may lie past them (such rows and keys are masked afterwards,
    // but a functor may index arrays with them): modified_score (the forward) and apply_score_mod_transposed (the
    // backward) say where.
    template <bool kClampRow, bool kClampCol>
    __device__ __forceinline__ float score_at(float s, int row, int col) const {
        return ::score_mod(s * p.softmax_scale, batch, head, kClampRow ? min(row, p.seqlen_q - 1) : row,
                           kClampCol ? min(col, p.seqlen_k - 1) : col, p.mods.args);
    }
};

#if FLASHKIT_SCORE_MOD_GRAD
// A functor with its score_mod_grad has its slopes taken where the backward recomputes the scores, at the fp32
// modified score (read back from the 16-bit P, m's rounding there, 2^-9 ln 2 with bf16, moves a slope such as
// 1 - (m / c)^2 by most of itself beside a small c), held in the element type (SlopeElement).
template <>
struct RecomputedSlopes<FunctorScoreMod> {
    static constexpr bool value = true;
};
template <>
struct SlopeElement<FunctorScoreMod> {
    typedef Element type;
};
#endif

// The backward's S^T = score_mod(S^T) (bwd_mask.cuh's layout: st[ni][2h + e] is key row key0 + 8 h, query
// query0 + 8 ni + e), and with kSlopes each element's slope score_mod_grad(m) as pairs of SlopeElement
// (slope[ni][h]: st[ni][2h], st[ni][2h + 1]). The key is clamped once a row; the queries, which vary by element, only
// where the thread's reach past seqlen_q (the last query block of a ragged call): elsewhere the clamp would be an
// instruction a score.
template <bool kClampQueries, bool kSlopes, int kTiles, int kSlopeTiles>
__device__ __forceinline__ void apply_functor_transposed(const FunctorScoreMod& mod, float (&st)[kTiles][4],
                                                         u32 (&slope)[kSlopeTiles][2], int key0, int query0) {
    const int keys[2] = {min(key0, mod.p.seqlen_k - 1), min(key0 + kFragRowHalf, mod.p.seqlen_k - 1)};
#pragma unroll
    for (int ni = 0; ni < kTiles; ++ni)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float g[2];
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int query = query0 + ni * kMmaN + e;
                st[ni][2 * h + e] = mod.template score_at<kClampQueries, false>(st[ni][2 * h + e], query, keys[h]);
#if FLASHKIT_SCORE_MOD_GRAD
                if constexpr (kSlopes)
                    g[e] = mod.template grad_at<kClampQueries, false>(st[ni][2 * h + e], query, keys[h]);
#endif
            }
            if constexpr (kSlopes)
                slope[ni][h] = pack_float2<typename SlopeElement<FunctorScoreMod>::type, SaturateFinite>(g[0], g[1]);
        }
}
template <bool kSlopes, int kTiles, int kSlopeTiles>
__device__ __forceinline__ void apply_functor_transposed(const FunctorScoreMod& mod, float (&st)[kTiles][4],
                                                         u32 (&slope)[kSlopeTiles][2], int key0, int query0) {
    if (query0 + kTiles * kMmaN <= mod.p.seqlen_q)   // every query of the thread's lies in the sequence
        apply_functor_transposed<false, kSlopes>(mod, st, slope, key0, query0);
    else
        apply_functor_transposed<true, kSlopes>(mod, st, slope, key0, query0);
}
template <int kTiles>
__device__ __forceinline__ void apply_score_mod_transposed(const FunctorScoreMod& mod, float (&st)[kTiles][4],
                                                           int key0, int query0) {
    u32 none[1][2];
    apply_functor_transposed<false>(mod, st, none, key0, query0);
}
template <int kTiles>
__device__ __forceinline__ void apply_score_mod_transposed(const FunctorScoreMod& mod, float (&st)[kTiles][4],
                                                           u32 (&slope)[kTiles][2], int key0, int query0) {
    apply_functor_transposed<true>(mod, st, slope, key0, query0);
}

// The forward clamps its row (once a row) and, on a tail tile, its keys: off the tail tiles every key is below
// seqlen_k (mask.cuh's unmasked visits), and the per-score clamp is skipped (it kept hd128 causal from fitting the
// deferred P V wait's registers: 8 bytes spilled).
template <bool kTailTile>
__device__ __forceinline__ float modified_score(const FunctorScoreMod& mod, float s, int row, int col, float) {
    return mod.template score_at<true, kTailTile>(s, row, col);
}

#endif

// The score modification of a variant: the functor's when built with one, else Otherwise (BuildScoreMod).
template <bool kFunctor, class Otherwise>
struct ScoreFunctorOr {
    typedef Otherwise type;
};
#if FLASHKIT_SCORE_MOD
template <class Otherwise>
struct ScoreFunctorOr<true, Otherwise> {
    typedef FunctorScoreMod type;
};
#endif
typedef ScoreFunctorOr<FLASHKIT_SCORE_MOD != 0, BuildScoreMod>::type KernelScoreMod;

constexpr int kClassifyThreads = 128;
constexpr int kCompactThreads = 128;

// The tile-list row of (batch, head, query tile): mask_mod's broadcast dims read row 0.
__device__ __forceinline__ int tile_row(const Params& p, int m_block, int head, int batch) {
    const int tb = p.mods.tile_batch == 1 ? 0 : batch;
    const int th = p.mods.tile_heads == 1 ? 0 : head;
    return (tb * p.mods.tile_heads + th) * p.mods.q_tiles + m_block;
}

#if FLASHKIT_MASK_MOD
// Visits the tiles tile_list[row][0 .. full + partial): it < full are wholly visible (no element mask),
// the rest (visited first, fwd_block and the Hopper consumers descend) partly.
template <int kBlockM, int kBlockN, class Inner>
struct FunctorMask {
    const Params& p;
    const int* list;
    int m_block, head, batch;
    int n_blocks, n_full;
    __device__ __forceinline__ FunctorMask(const Params& p_, int m_block_, int head_, int batch_)
        : p(p_), m_block(m_block_), head(head_), batch(batch_) {
        const int row = tile_row(p, m_block, head, batch);
        n_full = p.mods.tile_count[2 * row];
        n_blocks = n_full + p.mods.tile_count[2 * row + 1];
        list = p.mods.tile_list + static_cast<index_t>(row) * p.mods.k_tiles;
    }
    __device__ __forceinline__ int num_kv_blocks() const { return n_blocks; }
    __device__ __forceinline__ int num_masked_blocks() const { return n_blocks - n_full; }
    __device__ __forceinline__ int kv_block(int it) const { return list[it]; }
};

// mask_mod over a row's columns, evaluated kMaskModUnroll at a time into a bit per column: a fully unrolled
// evaluation keeps every column's loads (a functor reading arrays) in flight at once, which pushes a main loop
// running at the register limit into spills.
constexpr int kMaskModUnroll = 4;

// A partial tile: Inner's element mask (causal / window / ragged tail), then S = -inf where !mask_mod.
// Column c = 2 ni + e of the thread's C fragment is key col0 + 8 ni + e (bit c of the row's mask).
template <int kBlockM, int kBlockN, class Inner, int kMTiles, int kNTiles>
__device__ __forceinline__ void apply_mask(const FunctorMask<kBlockM, kBlockN, Inner>& mask,
                                           float (&s)[kMTiles][kNTiles][4], int row0, int col0) {
    static_assert(2 * kNTiles <= 32, "a row's columns fit one 32-bit mask");
    const Params& p = mask.p;
    const Inner inner(p, mask.m_block);
    apply_mask(inner, s, row0, col0);
#pragma unroll
    for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
        for (int h = 0; h < 2; ++h) {   // rows g, g + 8
            const int row = min(row0 + mi * kMmaM + h * kFragRowHalf, p.seqlen_q - 1);
            unsigned keep = 0;
#pragma unroll kMaskModUnroll
            for (int c = 0; c < 2 * kNTiles; ++c) {
                const int col = min(col0 + (c >> 1) * kMmaN + (c & 1), p.seqlen_k - 1);
                keep |= static_cast<unsigned>(::mask_mod(mask.batch, mask.head, row, col, p.mods.args)) << c;
            }
#pragma unroll
            for (int ni = 0; ni < kNTiles; ++ni)
#pragma unroll
                for (int e = 0; e < 2; ++e)
                    if (!((keep >> (2 * ni + e)) & 1u)) s[mi][ni][2 * h + e] = FLASHKIT_NEG_INF;
        }
}

// Classify tile (blockIdx.x key tile, blockIdx.y query tile) of tile row group blockIdx.z = tb * tile_heads + th:
// empty (no row sees a key of it), full (every valid row sees every key), else partial. Rows past seqlen_q
// are ignored; keys past seqlen_k are never visible (they make a tile partial).
template <class Inner, int kBlockM, int kBlockN>
__device__ __forceinline__ void classify_tiles(const Params& p) {
    const int n_block = blockIdx.x, m_block = blockIdx.y;
    const int th = blockIdx.z % p.mods.tile_heads, tb = blockIdx.z / p.mods.tile_heads;
    const Inner inner(p, m_block);
    const int m0 = m_block * kBlockM, n0 = n_block * kBlockN;
    const int m1 = min(m0 + kBlockM, p.seqlen_q) - 1;
    // Inner's visible interval [begin(row), end(row)) never moves left as the row grows: a tile outside the
    // union of its rows' intervals is empty without looking at mask_mod.
    const bool outside = inner.key_end(m1) <= n0 || inner_key_begin(inner, m0) >= n0 + kBlockN;
    int any = 0, all = 1;
    if (!outside) {
        for (int e = threadIdx.x; e < kBlockM * kBlockN; e += kClassifyThreads) {
            const int row = m0 + e / kBlockN, col = n0 + e % kBlockN;
            if (row >= p.seqlen_q) continue;
            const bool visible = col < inner.key_end(row) && col >= inner_key_begin(inner, row) &&
                                 ::mask_mod(tb, th, row, col, p.mods.args);
            any |= visible;
            all &= visible;
        }
    }
    any = __syncthreads_or(any);
    all = __syncthreads_and(all && !outside);
    if (threadIdx.x == 0) {
        const int row = (tb * p.mods.tile_heads + th) * p.mods.q_tiles + m_block;
        p.mods.tile_state[static_cast<index_t>(row) * p.mods.k_tiles + n_block] =
            all ? kTileFull : (any ? kTilePartial : kTileEmpty);
    }
}

// One thread per tile row: the full tiles' indices, then the partial ones', and their counts (deterministic order).
__device__ __forceinline__ void compact_tiles(const Params& p) {
    const int rows = p.mods.tile_batch * p.mods.tile_heads * p.mods.q_tiles;
    const int row = blockIdx.x * kCompactThreads + threadIdx.x;
    if (row >= rows) return;
    const unsigned char* state = p.mods.tile_state + static_cast<index_t>(row) * p.mods.k_tiles;
    int* list = p.mods.tile_list + static_cast<index_t>(row) * p.mods.k_tiles;
    int n = 0;
    for (int t = 0; t < p.mods.k_tiles; ++t)
        if (state[t] == kTileFull) list[n++] = t;
    const int n_full = n;
    for (int t = 0; t < p.mods.k_tiles; ++t)
        if (state[t] == kTilePartial) list[n++] = t;
    p.mods.tile_count[2 * row] = n_full;
    p.mods.tile_count[2 * row + 1] = n - n_full;
}
#endif

// The mask of a variant: FunctorMask over Inner when built with a mask_mod, else Inner itself.
template <bool kFunctor, int kBlockM, int kBlockN, class Inner>
struct MaskFunctorOr {
    typedef Inner type;
};
#if FLASHKIT_MASK_MOD
template <int kBlockM, int kBlockN, class Inner>
struct MaskFunctorOr<true, kBlockM, kBlockN, Inner> {
    typedef FunctorMask<kBlockM, kBlockN, Inner> type;
};
#endif

// FunctorMask is built from (params, m_block, head, batch) (make_mask, mask.cuh).
#if FLASHKIT_MASK_MOD
template <int kBlockM, int kBlockN, class Inner>
struct MaskMaker<FunctorMask<kBlockM, kBlockN, Inner>> {
    static __device__ __forceinline__ FunctorMask<kBlockM, kBlockN, Inner> make(const Params& p, int m_block,
                                                                               int head, int batch) {
        return FunctorMask<kBlockM, kBlockN, Inner>(p, m_block, head, batch);
    }
};
#endif

}  // namespace flashkit

// The classifier entries of a mask_mod build (launched by flashkit/features/functors.py before the attention);
// nothing otherwise. Inner: the variant's own mask.
#if FLASHKIT_MASK_MOD
#define FLASHKIT_FUNCTOR_ENTRIES(Inner, kBlockM, kBlockN)                                                     \
    extern "C" __global__ void __launch_bounds__(flashkit::kClassifyThreads)                                  \
        flashkit_functor_classify(const flashkit::Params params) {                                            \
        flashkit::classify_tiles<Inner, kBlockM, kBlockN>(params);                                            \
    }                                                                                                         \
    extern "C" __global__ void __launch_bounds__(flashkit::kCompactThreads)                                   \
        flashkit_functor_compact(const flashkit::Params params) {                                             \
        flashkit::compact_tiles(params);                                                                      \
    }
#else
#define FLASHKIT_FUNCTOR_ENTRIES(Inner, kBlockM, kBlockN)
#endif
