// Online softmax over the register tile of S (FlashAttention-2, exp2-based, deferred
// normalization). Each thread owns two rows per 16-row tile (g and g + 8, mma C layout) and
// a quarter of their columns; the 4 lanes of a quad share those rows.
//
// Per K/V tile, with raw scores s and c = softmax_scale * log2(e) (softmax_scale_log2):
//   m_new = max(m, rowmax(s))
//   p     = exp2(s * c - m_new * c)             (one FFMA + ex2 per element)
//   alpha = exp2((m - m_new) * c)               (rescale of the old state)
//   l     = alpha * l + rowsum(p),  O = alpha * O  (then O += P V outside)
// At the end: O /= l,  LSE = m * softmax_scale + ln(l) = (m * c + log2(l)) * ln(2).
// PScale scales P by 2^PScale::kLog2 (folded into the exponent; l carries the same factor, which
// O / l cancels and the LSE subtracts): UnitP for 16-bit P, fp8's E4m3P (448) to fill e4m3's range.
// Callers whose scores are already in log2 units (fp8: the scales folded in) pass c = 1.
// A row that saw no key keeps m = -inf, l = 0: every p and alpha is exp2(-inf) = 0 (the -inf
// max is replaced by 0 before subtracting, so never -inf - -inf), and it ends with O = 0,
// LSE = -inf.
#pragma once

#include "flashkit/fragment.cuh"

namespace flashkit {

// m * c with the convention that a row with no visible key yet subtracts 0, not -inf.
__device__ __forceinline__ float scaled_row_max(float m, float scale_log2) {
    return m == FLASHKIT_NEG_INF ? 0.f : m * scale_log2;
}

struct UnitP {
    static constexpr float kLog2 = 0.f;
};

template <int kMTiles, class PScale = UnitP>
struct OnlineSoftmax {
    static constexpr int kRowsPerTile = 2;   // rows g and g + 8 of each 16-row tile
    float row_max[kMTiles][kRowsPerTile];   // m: running max of the raw scores
    float row_sum[kMTiles][kRowsPerTile];   // l: this thread's partial sum (quad-reduced late)

    __device__ __forceinline__ void init() {
#pragma unroll
        for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
            for (int h = 0; h < kRowsPerTile; ++h) {
                row_max[mi][h] = FLASHKIT_NEG_INF;
                row_sum[mi][h] = 0.f;
            }
    }

    // Folds one S tile into {m, l}: s becomes P in place, and O is rescaled by alpha (times
    // o_rescale: a change of the unit O is kept in, as fp8's V scales).
    template <int kNTiles, int kDTiles>
    __device__ __forceinline__ void update(float (&s)[kMTiles][kNTiles][4],
                                           float (&o)[kMTiles][kDTiles][4], float scale_log2,
                                           float o_rescale = 1.f) {
        float alpha[kMTiles][kRowsPerTile];
        to_probabilities(s, alpha, scale_log2);
#pragma unroll
        for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
            for (int h = 0; h < kRowsPerTile; ++h) alpha[mi][h] *= o_rescale;
        rescale(o, alpha);
    }

    // The softmax half of update: s becomes P, and alpha what O owes (O *= alpha) before the
    // next O += P V. Split from rescale for main loops whose O is busy in an asynchronous product.
    template <int kNTiles>
    __device__ __forceinline__ void to_probabilities(float (&s)[kMTiles][kNTiles][4],
                                                     float (&alpha)[kMTiles][kRowsPerTile], float scale_log2) {
        update_max(s, alpha, scale_log2);
        exponentiate(s, scale_log2);
    }

    // First half: m_new = max(m, rowmax(s)) over the quad (the only cross-lane step) and
    // alpha = exp2((m_old - m_new) * c) (exp2(-inf) = 0 for a first visible tile).
    template <int kNTiles, int kChains = (kNTiles % 4 == 0 ? 4 : 1)>
    __device__ __forceinline__ void update_max(const float (&s)[kMTiles][kNTiles][4],
                                               float (&alpha)[kMTiles][kRowsPerTile], float scale_log2) {
#pragma unroll
        for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
            for (int h = 0; h < kRowsPerTile; ++h) {
                const float m_new = quad_max(row_tile_max<kChains>(s, mi, h, row_max[mi][h]));
                alpha[mi][h] = raise_max(mi, h, m_new, scaled_row_max(m_new, scale_log2), scale_log2);
            }
    }

    // m = m_new for row h of tile mi (scaled_new: m_new c, or 0 for a row with no visible key yet); l owes
    // alpha = exp2(m c - m_new c), which it pays here and which is returned for O.
    __device__ __forceinline__ float raise_max(int mi, int h, float m_new, float scaled_new, float scale_log2) {
        const float a = fast_exp2(row_max[mi][h] * scale_log2 - scaled_new);
        row_max[mi][h] = m_new;
        row_sum[mi][h] *= a;
        return a;
    }

    // update_max over raw scores s for a modification that commutes with the row max (score_mod.cuh's MonotoneMod):
    //   m_new = max(m, mod(rowmax(s)))   = max(m, rowmax(mod(s)))
    // one mod a row, so the row maxima need not wait for every element's mod (the caller applies it to S after).
    // Where the mod is an approximation that is not exactly monotone (tanh.approx), m_new may differ from the
    // largest modified score by its error: m is only the exponent's offset, which O / l and the LSE cancel.
    template <class Mod, int kNTiles, int kChains = (kNTiles % 4 == 0 ? 4 : 1)>
    __device__ __forceinline__ void update_max_mapped(const float (&s)[kMTiles][kNTiles][4],
                                                      float (&alpha)[kMTiles][kRowsPerTile], float scale_log2,
                                                      const Mod& mod) {
#pragma unroll
        for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
            for (int h = 0; h < kRowsPerTile; ++h) {
                const float m_new =
                    fmaxf(row_max[mi][h], mod.score(quad_max(row_tile_max<kChains>(s, mi, h)), 0, 0, 0.f));
                alpha[mi][h] = raise_max(mi, h, m_new, scaled_row_max(m_new, scale_log2), scale_log2);
            }
    }

    // update_max and exponentiate for scores held as v = true score + offset, one offset a row of this lane (ALiBi's
    // row term left out: score_mod.cuh's apply_linear_bias):
    //   m_new = max(m, quad max(rowmax(v) - offset)),   p = exp2(v c - (m_new + offset) c + PScale::kLog2)
    // {m, l} stay in true-score units (the LSE needs nothing more). For visits with a visible key in every row (m_new
    // finite): an unmasked tile.
    template <int kNTiles, int kChains = (kNTiles % 4 == 0 ? 4 : 1)>
    __device__ __forceinline__ void update_max_offset(const float (&s)[kMTiles][kNTiles][4],
                                                      float (&alpha)[kMTiles][kRowsPerTile], float scale_log2,
                                                      const float (&offset)[kMTiles][kRowsPerTile]) {
#pragma unroll
        for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
            for (int h = 0; h < kRowsPerTile; ++h) {
                const float m_new =
                    fmaxf(row_max[mi][h], quad_max(row_tile_max<kChains>(s, mi, h) - offset[mi][h]));
                alpha[mi][h] = raise_max(mi, h, m_new, m_new * scale_log2, scale_log2);   // (m_new is finite)
            }
    }
    template <int kNTiles, int kChains = (kNTiles % 4 == 0 ? 4 : 1)>
    __device__ __forceinline__ void exponentiate_offset(float (&s)[kMTiles][kNTiles][4], float scale_log2,
                                                        const float (&offset)[kMTiles][kRowsPerTile]) {
#pragma unroll
        for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
            for (int h = 0; h < kRowsPerTile; ++h) {
                const float bias = (row_max[mi][h] + offset[mi][h]) * scale_log2 - PScale::kLog2;
                row_sum[mi][h] += exp2_row<kChains>(s, mi, h, scale_log2, bias);
            }
    }

    // Second half, lane-local: p = exp2(s * c - m_new * c + PScale::kLog2) in place; l += rowsum(p).
    template <int kNTiles, int kChains = (kNTiles % 4 == 0 ? 4 : 1)>
    __device__ __forceinline__ void exponentiate(float (&s)[kMTiles][kNTiles][4], float scale_log2) {
#pragma unroll
        for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
            for (int h = 0; h < kRowsPerTile; ++h) {
                const float bias = scaled_row_max(row_max[mi][h], scale_log2) - PScale::kLog2;
                row_sum[mi][h] += exp2_row<kChains>(s, mi, h, scale_log2, bias);
            }
    }

    // to_probabilities for scores x = c s with a positive factor c per row, folded into the exponent (fp8: the
    // row's q scale, the tile's k scale and softmax_scale log2(e)); {m, l} are kept in x's units, as the
    // callers that pass scale_log2 = 1 keep them:
    //   m_new = max(m, c rowmax(s)),  alpha = exp2(m - m_new),  p = exp2(c s - m_new + PScale::kLog2)
    // one FFMA per element, where scaling s first costs an FMUL more. (c > 0: c rowmax(s) = rowmax(c s), and a
    // masked -inf stays -inf.)
    template <int kNTiles, int kChains = (kNTiles % 4 == 0 ? 4 : 1)>
    __device__ __forceinline__ void to_probabilities_scaled(float (&s)[kMTiles][kNTiles][4],
                                                            float (&alpha)[kMTiles][kRowsPerTile],
                                                            const float (&c)[kMTiles][kRowsPerTile]) {
#pragma unroll
        for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
            for (int h = 0; h < kRowsPerTile; ++h) {
                const float m_new =
                    fmaxf(row_max[mi][h], quad_max(row_tile_max<kChains>(s, mi, h)) * c[mi][h]);
                alpha[mi][h] = fast_exp2(row_max[mi][h] - scaled_row_max(m_new, 1.f));
                row_max[mi][h] = m_new;
                const float bias = scaled_row_max(m_new, 1.f) - PScale::kLog2;
                // (The exponent loop stays written out here: through exp2_row, ptxas schedules fa3_fp8 otherwise,
                // and this is the code its GPU tier ran.)
                float sum[kChains];
#pragma unroll
                for (int k = 0; k < kChains; ++k) sum[k] = 0.f;
#pragma unroll
                for (int ni = 0; ni < kNTiles; ++ni)
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        float& x = s[mi][ni][2 * h + e];
                        x = fast_exp2(fmaf(x, c[mi][h], -bias));
                        sum[ni % kChains] += x;
                    }
#pragma unroll
                for (int k = 1; k < kChains; ++k) sum[0] += sum[k];
                row_sum[mi][h] = row_sum[mi][h] * alpha[mi][h] + sum[0];
            }
    }

    // max(init, this lane's entries of row h of tile mi), in kChains independent chains (short dependency chains).
    template <int kChains, int kNTiles>
    __device__ __forceinline__ static float row_tile_max(const float (&s)[kMTiles][kNTiles][4], int mi, int h,
                                                         float init) {
        float chain[kChains];
#pragma unroll
        for (int c = 0; c < kChains; ++c) chain[c] = init;
        return fold_row_max<0>(chain, s, mi, h);
    }

    // The same without an initial value: each chain starts from its first pair (to_probabilities_scaled, whose
    // chains started from -inf, four instructions a row for nothing). (update_max keeps the form above: folding
    // row_max in after the chains made ptxas spill fa2's fp16 hd192 kernel, 16 B.)
    template <int kChains, int kNTiles>
    __device__ __forceinline__ static float row_tile_max(const float (&s)[kMTiles][kNTiles][4], int mi, int h) {
        static_assert(kNTiles >= kChains, "a pair for every chain");
        float chain[kChains];
#pragma unroll
        for (int c = 0; c < kChains; ++c) chain[c] = fmaxf(s[mi][c][2 * h], s[mi][c][2 * h + 1]);
        return fold_row_max<kChains>(chain, s, mi, h);
    }

    // The chains' max after folding in the pairs of row h from column tile kFirst on (chain ni % kChains).
    template <int kFirst, int kChains, int kNTiles>
    __device__ __forceinline__ static float fold_row_max(float (&chain)[kChains], const float (&s)[kMTiles][kNTiles][4],
                                                         int mi, int h) {
#pragma unroll
        for (int ni = kFirst; ni < kNTiles; ++ni)
            chain[ni % kChains] = fmaxf(chain[ni % kChains], fmaxf(s[mi][ni][2 * h], s[mi][ni][2 * h + 1]));
        float m = chain[0];
#pragma unroll
        for (int c = 1; c < kChains; ++c) m = fmaxf(m, chain[c]);
        return m;
    }

    // This lane's entries x of row h of tile mi -> exp2(x * mult - bias) in place; returns their sum (kChains chains).
    template <int kChains, int kNTiles>
    __device__ __forceinline__ static float exp2_row(float (&s)[kMTiles][kNTiles][4], int mi, int h, float mult,
                                                     float bias) {
        float chain[kChains];
#pragma unroll
        for (int c = 0; c < kChains; ++c) chain[c] = 0.f;
#pragma unroll
        for (int ni = 0; ni < kNTiles; ++ni)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                float& x = s[mi][ni][2 * h + e];
                x = fast_exp2(fmaf(x, mult, -bias));
                chain[ni % kChains] += x;
            }
        float sum = chain[0];
#pragma unroll
        for (int c = 1; c < kChains; ++c) sum += chain[c];
        return sum;
    }

    // O *= alpha (deferred normalization: O is divided by l only at the end).
    template <int kDTiles>
    __device__ __forceinline__ static void rescale(float (&o)[kMTiles][kDTiles][4],
                                                   const float (&alpha)[kMTiles][kRowsPerTile]) {
#pragma unroll
        for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
            for (int h = 0; h < kRowsPerTile; ++h)
#pragma unroll
                for (int nd = 0; nd < kDTiles; ++nd) {
                    o[mi][nd][2 * h] *= alpha[mi][h];
                    o[mi][nd][2 * h + 1] *= alpha[mi][h];
                }
    }

    // rescale, skipped by a warp none of whose rows owes anything (alpha = 1 everywhere: once the
    // row maxima settle, most tiles).
    template <int kDTiles>
    __device__ __forceinline__ static void rescale_if_owed(float (&o)[kMTiles][kDTiles][4],
                                                           const float (&alpha)[kMTiles][kRowsPerTile]) {
        bool settled = true;
#pragma unroll
        for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
            for (int h = 0; h < kRowsPerTile; ++h) settled = settled && alpha[mi][h] == 1.f;
        if (!__all_sync(0xffffffffu, settled)) rescale(o, alpha);
    }

    // O *= o_scale / l (O = 0 where l = 0) and the natural-log LSE of each owned row (-inf where
    // l = 0). o_scale: the unit O is kept in (fp8's V scale), 1 otherwise.
    template <int kDTiles>
    __device__ __forceinline__ void finalize(float (&o)[kMTiles][kDTiles][4], float scale_log2,
                                             float (&lse)[kMTiles][kRowsPerTile], float o_scale = 1.f) {
#pragma unroll
        for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
            for (int h = 0; h < kRowsPerTile; ++h) {
                const float l = quad_sum(row_sum[mi][h]);
                const bool seen = l > 0.f;
                const float factor = seen ? o_scale / l : 0.f;
                lse[mi][h] = seen ? (row_max[mi][h] * scale_log2 + fast_log2(l) - PScale::kLog2) * kLn2
                                  : FLASHKIT_NEG_INF;
#pragma unroll
                for (int nd = 0; nd < kDTiles; ++nd) {
                    o[mi][nd][2 * h] *= factor;
                    o[mi][nd][2 * h + 1] *= factor;
                }
            }
    }
};

}  // namespace flashkit
