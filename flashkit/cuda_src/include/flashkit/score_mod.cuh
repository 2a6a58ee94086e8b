// Score modifications as types, applied by a main loop between S = Q K^T and the softmax, on raw
// scores s = q.k (the softmax multiplies by softmax_scale afterwards, so each modification works in
// raw-score units: f(scale * s) / scale).
//   NoScoreMod        s
//   Softcap           c tanh(scale s / c)                    (Gemma 2's logit cap; flash-attn's softcap)
//   Alibi             s - slope |i + seqlen_k - seqlen_q - j|  (bias on the scaled score, flash-attn's sign)
//   ComposeMods<A, B> B(A(s)): softcap first, then the bias, as flash-attn orders them
// Interface: constructed once per CTA from (Params, head, batch); `score(s, row, col, col_f)` maps one
// element of absolute query row `row`, key `col` (col_f: the same key as a float, formed by a float add
// per element instead of a conversion). apply_score_mod runs it over an mma C-layout S tile (the
// layout apply_mask reads), so any main loop with that layout (sm80's, Hopper's wgmma fragments) can
// call it before apply_mask; a main loop that knows a tile's keys all lie below seqlen_k (an unmasked visit:
// mask.cuh) says so with kTailTile = false, and a drop-in functor then skips clamping its key index
// (functor.cuh's modified_score). The runtime values live in Params::mods (params.cuh).
// Selection at compile time: ScoreModOf<FLASHKIT_SOFTCAP, FLASHKIT_ALIBI>::type.
// The backward multiplies dS by d mod(s) / ds at each element (1 wherever kUnitGrad, else `grad(m, row, col)`),
// taken where it recomputes the scores, at the fp32 modified score m (RecomputedSlopes, below; bwd_mask.cuh's
// apply_score_mod_transposed with slopes).
// kIndexed: the modification reads each score's query and key index (ALiBi's distance, a functor's arguments),
// which the kernels with little register room to spare take into account (hopper/bwd_traits.cuh).
// MonotoneMod<Mod>: the modification commutes with a row's max (softcap), so a forward may take the max first;
// LinearBias<Mod>: a bias linear in the key left of the diagonal (ALiBi), the same with its row term set apart.
// kHeldGrad: grad(m) reads m alone and lies in [0, 1] (softcap's 1 - tanh^2), so a backward may hold each slope as
// half of an f16 pair.
#pragma once

#include "flashkit/numeric.cuh"
#include "flashkit/params.cuh"
#include "flashkit/traits.cuh"

#ifndef FLASHKIT_WINDOW
#define FLASHKIT_WINDOW 0
#endif
#ifndef FLASHKIT_SOFTCAP
#define FLASHKIT_SOFTCAP 0
#endif
#ifndef FLASHKIT_ALIBI
#define FLASHKIT_ALIBI 0
#endif

namespace flashkit {

static constexpr float kTwoLog2e = 2.8853900817779268f;   // 2 log2(e): e^(2x) = 2^(2 log2(e) x)

// tanh(x) = 1 - 2 / (e^(2x) + 1): ex2.approx and rcp.approx keep ~1e-7 absolute error, at two MUFU
// operations per score; saturates to +-1 at +-inf.
__device__ __forceinline__ float accurate_tanh(float x) {
    return 1.f - 2.f * fast_rcp(fast_exp2(x * kTwoLog2e) + 1.f);
}

// tanh.approx.f32 (sm_75+): one MUFU operation, relative error at most ~2^-11 by the PTX manual (measured on the
// H200 over [-12, 12]: 7.7e-6 absolute, 1.05e-5 relative), flash-attn's choice. The softmax's exp2 is the other MUFU
// operation of each score. (The f16x2 / bf16x2 forms are two MUFU operations a pair, at the same rate: nothing gained.)
__device__ __forceinline__ float fast_tanh(float x) {
    float y;
    asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// Whether a modification commutes with a row's max: nondecreasing in s and index-free, so that
// rowmax(mod(s)) = mod(rowmax(s)) (softcap; not ALiBi, whose bias depends on the key). A main loop may then take
// the row max over the raw scores and map it once (OnlineSoftmax::update_max_mapped).
template <class Mod>
struct MonotoneMod {
    static constexpr bool value = false;
};

struct NoScoreMod {
    static constexpr bool kUnitGrad = true;
    static constexpr bool kIndexed = false;
    static constexpr bool kHeldGrad = true;
    __device__ __forceinline__ NoScoreMod(const Params&, int, int) {}
    __device__ __forceinline__ float score(float s, int, int, float) const { return s; }
};

// s -> (c / scale) tanh(s * scale / c); the two factors come from the parameter block (constant bank).
// d/ds: m = softcap_out tanh(softcap_in s) has slope softcap_out softcap_in (1 - tanh^2) = 1 - (m softcap_in)^2.
struct Softcap {
    static constexpr bool kUnitGrad = false;
    static constexpr bool kIndexed = false;
    static constexpr bool kHeldGrad = true;
    const Params& p;
    __device__ __forceinline__ Softcap(const Params& p_, int, int) : p(p_) {}
    __device__ __forceinline__ float score(float s, int, int, float) const {
        return p.mods.softcap_out * fast_tanh(s * p.mods.softcap_in);
    }
    __device__ __forceinline__ float grad(float m, int, int) const {
        const float t = m * p.mods.softcap_in;
        return fmaf(-t, t, 1.f);
    }
};

template <>
struct MonotoneMod<Softcap> {
    static constexpr bool value = true;   // c tanh(x / c) increases with x (c > 0)
};

// s -> s - (slope / scale) |row + seqlen_k - seqlen_q - col|; one slope per (batch, head), read once.
// The distance is taken in float (exact below 2^24 keys): an int-to-float conversion per score runs at
// the MUFU's quarter rate, float adds at full rate.
struct Alibi {
    const Params& p;
    float slope;   // in raw-score units: slope / softmax_scale
    __device__ __forceinline__ Alibi(const Params& p_, int head, int batch) : p(p_) {
        slope = p.mods.alibi_slopes[batch * p.mods.alibi_batch_stride + head * p.mods.alibi_head_stride] *
                p.mods.inv_softmax_scale;
    }
    __device__ __forceinline__ float score(float s, int row, int, float col_f) const {
        return biased(s, distance(row, col_f));
    }
    __device__ __forceinline__ float biased(float s, float dist) const { return fmaf(-slope, dist, s); }
    // A bias: slope 1 in s.
    static constexpr bool kUnitGrad = true;
    static constexpr bool kIndexed = true;
    static constexpr bool kHeldGrad = true;
    // The key on row's bottom-right-aligned diagonal.
    __device__ __forceinline__ int diagonal(int row) const { return row + p.seqlen_k - p.seqlen_q; }
    __device__ __forceinline__ float distance(int row, float col_f) const {
        return fabsf(static_cast<float>(diagonal(row)) - col_f);   // one conversion per row
    }
    // A tile whose keys all lie at or left of the diagonal of its first row (last_col <= first_row + seqlen_k -
    // seqlen_q; every unmasked causal tile): there the bias is linear in the key, s - slope (diag - col) = v - r with
    //   v = s + slope k        k = col - col0, a constant of the unrolled loop (one FFMA with an immediate a score)
    //   r = slope (diag - col0)  one value a row (row_offset), which the softmax takes instead (update_max_offset)
    __device__ __forceinline__ bool left_of_diagonal(int first_row, int last_col) const {
        return last_col <= diagonal(first_row);
    }
    __device__ __forceinline__ float row_offset(int row, float col0_f) const {
        return slope * (static_cast<float>(diagonal(row)) - col0_f);
    }
};

// Whether a modification is a bias linear in the key on tiles left of the diagonal (Alibi::left_of_diagonal), so a
// forward may take the row max over its key-linear part (apply_linear_bias).
template <class Mod>
struct LinearBias {
    static constexpr bool value = false;
};
template <>
struct LinearBias<Alibi> {
    static constexpr bool value = true;
};

// S = v (Alibi's linear form, above) on an mma C-layout tile of keys col0 + 8 ni + e (col0: the tile's first key +
// 2t), and each owned row's offset r: the true score is v - r.
template <int kMTiles, int kNTiles>
__device__ __forceinline__ void apply_linear_bias(const Alibi& mod, float (&s)[kMTiles][kNTiles][4], int row0,
                                                  int col0, float (&offset)[kMTiles][2]) {
    const float col0_f = static_cast<float>(col0);
#pragma unroll
    for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            offset[mi][h] = mod.row_offset(row0 + mi * kMmaM + h * kFragRowHalf, col0_f);
#pragma unroll
            for (int ni = 0; ni < kNTiles; ++ni)
#pragma unroll
                for (int e = 0; e < 2; ++e)
                    s[mi][ni][2 * h + e] = fmaf(mod.slope, static_cast<float>(ni * kMmaN + e), s[mi][ni][2 * h + e]);
        }
}

template <class A, class B>
struct ComposeMods {
    A a;
    B b;
    __device__ __forceinline__ ComposeMods(const Params& p, int head, int batch)
        : a(p, head, batch), b(p, head, batch) {}
    __device__ __forceinline__ float score(float s, int row, int col, float col_f) const {
        return b.score(a.score(s, row, col, col_f), row, col, col_f);
    }
    // The chain rule's slope, a's at b's input times b's, is taken between the two (RecomputedSlopes below: b's is 1).
    static constexpr bool kUnitGrad = A::kUnitGrad && B::kUnitGrad;
    static constexpr bool kIndexed = A::kIndexed || B::kIndexed;
    static constexpr bool kHeldGrad = false;   // its slope is not a function of its own output
};

// Whether a backward takes a modification's slopes d mod / ds where it recomputes the scores (bwd_mask.cuh's
// apply_score_mod_transposed with slopes): an index-free one that is not the identity (softcap), softcap followed
// by a bias (ALiBi: slope 1), whose slope is softcap's at the score between the two, or a drop-in functor with its
// score_mod_grad (functor.cuh). Every modification whose slope is not 1 is one of these: the other way, m read back
// from the P the kernel holds in 16 bits (m = (log2 P + lse2) ln 2 / scale), moved m by bf16's 2^-9 ln 2 / scale and
// softcap's t = m scale / c by 2^-9 ln 2 / c, which beside t ~ 1 (a cap below the scores) is most of the slope 1 - t^2.
template <class Mod>
struct RecomputedSlopes {
    static constexpr bool value = !Mod::kUnitGrad && Mod::kHeldGrad;
};
template <class A, class B>
struct RecomputedSlopes<ComposeMods<A, B>> {
    static constexpr bool value = RecomputedSlopes<A>::value && B::kUnitGrad;
};
// The 16-bit type those slopes are held in: f16 where they lie in [0, 1] (softcap's, 2^-11 relative); a drop-in
// functor's (functor.cuh), which may be any finite number, in the kernel's element type, whose rounding dS itself
// takes for its products.
template <class Mod>
struct SlopeElement {
    typedef half_t type;
};

// One modified score: Mod::score. kTailTile: the tile may hold keys at or past seqlen_k (the built-ins
// ignore it; FunctorScoreMod overloads this to clamp the indices it hands a functor only there).
template <bool kTailTile, class Mod>
__device__ __forceinline__ float modified_score(const Mod& mod, float s, int row, int col, float col_f) {
    return mod.score(s, row, col, col_f);
}

// S = mod(S) on an mma C-layout tile: s[mi][ni][2h + e] is row row0 + 16 mi + 8 h, column
// col0 + 8 ni + e (row0: the thread's absolute row g; col0: the tile's first key + 2t).
template <bool kTailTile = true, class Mod, int kMTiles, int kNTiles>
__device__ __forceinline__ void apply_score_mod(const Mod& mod, float (&s)[kMTiles][kNTiles][4],
                                                int row0, int col0) {
    const float col0_f = static_cast<float>(col0);
#pragma unroll
    for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = row0 + mi * kMmaM + h * kFragRowHalf;
#pragma unroll
            for (int ni = 0; ni < kNTiles; ++ni)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int c = ni * kMmaN + e;
                    s[mi][ni][2 * h + e] = modified_score<kTailTile>(mod, s[mi][ni][2 * h + e], row, col0 + c,
                                                                     col0_f + static_cast<float>(c));
                }
        }
}
// NoScoreMod: nothing to do (not even the index arithmetic).
template <bool kTailTile = true, int kMTiles, int kNTiles>
__device__ __forceinline__ void apply_score_mod(const NoScoreMod&, float (&)[kMTiles][kNTiles][4], int, int) {}

template <bool kSoftcap, bool kAlibi>
struct ScoreModOf {
    typedef NoScoreMod type;
};
template <>
struct ScoreModOf<true, false> {
    typedef Softcap type;
};
template <>
struct ScoreModOf<false, true> {
    typedef Alibi type;
};
template <>
struct ScoreModOf<true, true> {
    typedef ComposeMods<Softcap, Alibi> type;
};

// The score modification a build selects with -DFLASHKIT_SOFTCAP / -DFLASHKIT_ALIBI (0 or 1).
typedef ScoreModOf<FLASHKIT_SOFTCAP != 0, FLASHKIT_ALIBI != 0>::type BuildScoreMod;

}  // namespace flashkit
