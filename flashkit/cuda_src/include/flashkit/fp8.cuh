// FP8 (e4m3) device primitives both fp8 kernels share (fp8.cu on mma.sync, fa3_fp8.cu on wgmma):
// the scale constants, the key permutation of P V with the packing of P into an e4m3 A fragment,
// and the online softmax with per-tile descaling. The mma.sync side (byte tiles, the m16n8k32 mma,
// the byte transpose of V) is sm80/fp8_mma.cuh.
//
// Fragments of mma.m16n8k32 (8-bit operands, PTX ISA), g = lane / 4, t = lane % 4:
//   A (16x32, row): a0 = A[g][4t..4t+3]  a1 = A[g+8][4t..4t+3]  a2 = A[g][16+4t..]  a3 = A[g+8][16+4t..]
//   B (32x8, col):  b0 = B[4t..4t+3][g]  b1 = B[16+4t..16+4t+3][g]
//   C (16x8, f32):  as m16n8k16: c0,c1 = C[g][2t..2t+1], c2,c3 = C[g+8][2t..2t+1]
//
// Key permutation of P V. The C layout of S gives a thread keys {2t, 2t+1, 2t+8, 2t+9} of each
// 16 keys, while the A layout wants 4 consecutive k-indices {4t..4t+3}. Rather than shuffle P
// across lanes, the k-index of P V is permuted: logical index 16 q + 4 t + i is physical key
//   16 q + 2 t + (i & 1) + 8 (i >> 1)
// and Vt stores its columns in that logical order (the transpose writes them so).
#pragma once

#include "flashkit/softmax.cuh"

namespace flashkit {
namespace fp8 {

constexpr float kLog2PScale = 8.807354922057604f;   // log2(448): P is quantized as 448 * exp(s - m)
// Rows per scale block are a power of two >= this (flashkit/features/fp8.py MIN_SCALE_BLOCK), so that a
// K/V tile of kBlockN <= kMinScaleBlock keys never straddles two scale blocks.
constexpr int kMinScaleBlock = 64;

// ---- the P V key permutation ---------------------------------------------------------------
constexpr int kPermKeys = 16;   // the permutation acts within groups of 16 keys

// Physical key (within its group of 16) of logical k-index l = 4 t + i: 2 t + (i & 1) + 8 (i >> 1).
__device__ __forceinline__ int pv_physical_key(int l) {
    const int t = l / 4, i = l % 4;
    return 2 * t + (i & 1) + 8 * (i >> 1);
}

// The permutation over a whole key range, as the V pre-pass (hopper/v_transpose.cuh) takes it.
struct PvKeys {
    __device__ __forceinline__ static int physical(int l) { return l / kPermKeys * kPermKeys + pv_physical_key(l % kPermKeys); }
};

// The e4m3 A fragment of P V k-step kk from P in the S accumulator layout (p[ni] = column tile ni):
// it covers column tiles 4 kk .. 4 kk + 3 (32 keys); a0 = P[g][keys 2t, 2t+1, 2t+8, 2t+9] (logical
// k-indices 4t .. 4t+3), a1 the same of row g + 8, a2 / a3 the same 16 keys later.
template <int kNTiles>
__device__ __forceinline__ void pack_p_fragment(u32 (&a)[4], const float (&p)[kNTiles][4], int kk) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const float(&lo)[4] = p[4 * kk + 2 * half];
        const float(&hi)[4] = p[4 * kk + 2 * half + 1];
        a[2 * half] = pack_e4m3x4(lo[0], lo[1], hi[0], hi[1]);       // row g
        a[2 * half + 1] = pack_e4m3x4(lo[2], lo[3], hi[2], hi[3]);   // row g + 8
    }
}

// ---- online softmax on descaled scores --------------------------------------------------
// x = S_raw * q_scale * k_scale * softmax_scale * log2(e): the scores in log2 units, already
// masked (-inf), so softmax.cuh's OnlineSoftmax runs with c = 1 and P scaled by 448 (E4m3P: P fills
// the e4m3 range; l carries the same factor, which O / l cancels), O kept in units of the current
// tile's V scale:
//   m_new = max(m, rowmax(x));  P = exp2(x - m_new + log2(448))  in [0, 448]
//   alpha = exp2(m - m_new);    l = alpha l + rowsum(P);  O *= alpha * v_scale_prev / v_scale
// finalize(o, 1, lse, v_scale): O *= v_scale / l;  LSE = (m + log2(l) - log2(448)) ln(2).
struct E4m3P {
    static constexpr float kLog2 = kLog2PScale;
};
template <int kMTiles>
using Softmax = OnlineSoftmax<kMTiles, E4m3P>;
constexpr float kScoresInLog2 = 1.f;   // the c the fp8 loops pass: their scores are already x

}  // namespace fp8
}  // namespace flashkit
