// The FlashAttention-2 backward's warp products (sm80/bwd_mainloop.cuh's BwdMainloop): mma.sync.m16n8k16 over
// operands read from shared memory with ldmatrix (ldsm_lane.cuh), both ways round. Members of the main loop
// defined here, as its dQ is in sm80/bwd_dq.cuh (the same inlined code).
#pragma once

#include "flashkit/sm80/bwd_mainloop.cuh"

namespace flashkit {

// c[mi][2 np + j] += A_mi B_(2 np + j) over kSteps k-steps of 16: each A tile by load_a(a, mi, kk) (an ldmatrix x4, or
// registers held over the walk), each pair of B tiles (b0, b1 of tile 2 np, then of 2 np + 1) by load_b(b, np, kk).
// Every warp product below.
template <int kSteps, class Element, int kATiles, int kBTiles, class LoadA, class LoadB>
__device__ __forceinline__ void mma_tile_pairs(float (&c)[kATiles][kBTiles][4], const LoadA& load_a,
                                               const LoadB& load_b) {
#pragma unroll
    for (int kk = 0; kk < kSteps; ++kk) {
        u32 a[kATiles][4];
#pragma unroll
        for (int mi = 0; mi < kATiles; ++mi) load_a(a[mi], mi, kk);
#pragma unroll
        for (int np = 0; np < kBTiles / 2; ++np) {
            u32 b[4];
            load_b(b, np, kk);
#pragma unroll
            for (int mi = 0; mi < kATiles; ++mi) {
                mma_16816<Element>(c[mi][2 * np], a[mi], b[0], b[1]);
                mma_16816<Element>(c[mi][2 * np + 1], a[mi], b[2], b[3]);
            }
        }
    }
}

// C = A B^T over kCols columns for this warp's tile: A the warp's kWarpKeys rows (keys) by load_a (of a [key][d] tile,
// K or V, or V's fragments held in registers), B its kWarpQueries rows of a [query][d] tile (Q or dO): S^T = K Q^T,
// dP^T = V dO^T. c[mi][ni]: keys key_row0() + 16 mi + (g, g + 8) x queries query_col0() + 8 ni + (2t, 2t + 1).
template <class Kt, class Mask, class Mod>
template <int kCols, class LoadA>
__device__ __forceinline__ void BwdMainloop<Kt, Mask, Mod>::gemm_by_queries(
    float (&c)[Kt::kKeyTiles][Kt::kQueryTiles][4], const LoadA& load_a, u32 sB, int chunk_q) const {
    const LdsmLane<kCols> lb = ldsm_rows8x2<kCols>(lane);
    const int q0 = query_col0() + chunk_q;
    zero_fragments(c);
    mma_tile_pairs<kCols / kMmaK, Element>(
        c, load_a, [&](u32(&b)[4], int np, int kk) { ldsm_x4(b, lb.addr(sB, q0 + np * 2 * kMmaN, kk)); });
}

// A from a [key][d] tile of kCols columns at sA (K, or V in shared memory).
template <class Kt, class Mask, class Mod>
template <int kCols>
__device__ __forceinline__ void BwdMainloop<Kt, Mask, Mod>::gemm_keys_by_queries(
    float (&c)[Kt::kKeyTiles][Kt::kQueryTiles][4], u32 sA, u32 sB, int chunk_q) const {
    const LdsmLane<kCols> la = ldsm_rows16<kCols>(lane);
    const int r0 = key_row0();
    gemm_by_queries<kCols>(c, [&](u32(&a)[4], int mi, int kk) { ldsm_x4(a, la.addr(sA, r0 + mi * kMmaM, kk)); }, sB,
                           chunk_q);
}

// dP^T = V dO^T over v's head dim with V's A fragments held in registers (Kt::kVInRegs: hold_v).
template <class Kt, class Mask, class Mod>
__device__ __forceinline__ void BwdMainloop<Kt, Mask, Mod>::gemm_held_v_by_queries(
    float (&c)[Kt::kKeyTiles][Kt::kQueryTiles][4], u32 sB, int chunk_q) const {
    gemm_by_queries<kDv>(c,
                         [&](u32(&a)[4], int mi, int kk) {
#pragma unroll
                             for (int r = 0; r < 4; ++r) a[r] = v_frag[mi][kk][r];
                         },
                         sB, chunk_q);
}

// acc += A B over the queries 16 kk .. 16 kk + 15 for this warp's columns: A a 16-key A fragment in registers
// (P^T or dS^T of the warp's own queries), B a [query][d] tile read transposed (dO or Q).
template <class Kt, class Mask, class Mod>
template <int kTiles>
__device__ __forceinline__ void BwdMainloop<Kt, Mask, Mod>::mma_fragment_by_cols(float (&acc)[kTiles][4],
                                                                                 const FragmentA& a, u32 sB,
                                                                                 int kk) const {
    constexpr int kCols = kTiles * kMmaN * Kt::kPartWarps;   // of the B tile (dO's or Q's)
    const LdsmLane<kCols> lb = ldsm_rows16<kCols>(lane);
    const int s0 = cols0<kCols>() / kMmaK;
#pragma unroll
    for (int dp = 0; dp < kTiles / 2; ++dp) {
        u32 b[4];   // b0, b1 of column tile 2 dp, then of 2 dp + 1
        ldsm_x4_trans(b, lb.addr(sB, kk * kMmaK, s0 + dp));
        mma_16816<Element>(acc[2 * dp], a.r, b[0], b[1]);
        mma_16816<Element>(acc[2 * dp + 1], a.r, b[2], b[3]);
    }
}

// acc += X B for this warp's keys and columns over the block's queries: X a [key][query] tile in shared
// memory (P^T or dS^T), B a [query][d] tile read transposed (dO or Q): dV += P^T dO, dK += dS^T Q.
template <class Kt, class Mask, class Mod>
template <int kTiles>
__device__ __forceinline__ void BwdMainloop<Kt, Mask, Mod>::mma_keys_by_cols(float (&acc)[Kt::kKeyTiles][kTiles][4],
                                                                             u32 sX, u32 sB) const {
    constexpr int kCols = kTiles * kMmaN * Kt::kPartWarps;   // of the B tile (dO's or Q's)
    const LdsmLane<kM> la = ldsm_rows16<kM>(lane);
    const LdsmLane<kCols> lb = ldsm_rows16<kCols>(lane);
    const int r0 = key_row0(), s0 = cols0<kCols>() / kMmaK;
    mma_tile_pairs<Kt::kMSteps, Element>(
        acc, [&](u32(&a)[4], int mi, int kk) { ldsm_x4(a, la.addr(sX, r0 + mi * kMmaM, kk)); },
        [&](u32(&b)[4], int dp, int kk) { ldsm_x4_trans(b, lb.addr(sB, kk * kMmaK, s0 + dp)); });
}

}  // namespace flashkit
