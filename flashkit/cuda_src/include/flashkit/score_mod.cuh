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

// tanh.approx.f32 (sm_75+): one MUFU operation, relative error ~2^-11 (fp16's rounding of the score),
// flash-attn's choice. The softmax's exp2 is the other MUFU operation of each score, so this one
// decides softcap's cost.
__device__ __forceinline__ float fast_tanh(float x) {
    float y;
    asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

struct NoScoreMod {
    __device__ __forceinline__ NoScoreMod(const Params&, int, int) {}
    __device__ __forceinline__ float score(float s, int, int, float) const { return s; }
};

// s -> (c / scale) tanh(s * scale / c); the two factors come from the parameter block (constant bank).
struct Softcap {
    const Params& p;
    __device__ __forceinline__ Softcap(const Params& p_, int, int) : p(p_) {}
    __device__ __forceinline__ float score(float s, int, int, float) const {
        return p.mods.softcap_out * fast_tanh(s * p.mods.softcap_in);
    }
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
        const float diag = static_cast<float>(row + p.seqlen_k - p.seqlen_q);   // one conversion per row
        return fmaf(-slope, fabsf(diag - col_f), s);
    }
};

template <class A, class B>
struct ComposeMods {
    A a;
    B b;
    __device__ __forceinline__ ComposeMods(const Params& p, int head, int batch)
        : a(p, head, batch), b(p, head, batch) {}
    __device__ __forceinline__ float score(float s, int row, int col, float col_f) const {
        return b.score(a.score(s, row, col, col_f), row, col, col_f);
    }
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
