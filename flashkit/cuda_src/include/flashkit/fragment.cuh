// The m16n8 fragment layout both tensor-core families use (mma.sync m16n8k16, and wgmma's register
// fragments, which repeat it per warp): ldmatrix loads into it, packing of P into an A fragment, and
// the quad reductions over the lanes that share a row.
//
// Fragment ownership of mma.m16n8k16 (PTX ISA), g = lane / 4, t = lane % 4:
//   A (16x16, row): a0 = A[g][2t..2t+1]   a1 = A[g+8][2t..2t+1]
//                   a2 = A[g][2t+8..+9]   a3 = A[g+8][2t+8..+9]
//   B (16x8, col):  b0 = B[2t..2t+1][g]   b1 = B[2t+8..+9][g]
//   C (16x8, f32):  c0,c1 = C[g][2t..2t+1]   c2,c3 = C[g+8][2t..2t+1]
// ldmatrix.x4: lanes 8i..8i+7 give the row addresses of 8x8 matrix i; register i of every
// lane receives matrix i as (row g, cols 2t..2t+1), or with .trans (rows 2t..2t+1, col g).
#pragma once

#include "flashkit/numeric.cuh"

namespace flashkit {

__device__ __forceinline__ void ldsm_x4(u32 (&r)[4], u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

__device__ __forceinline__ void ldsm_x4_trans(u32 (&r)[4], u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// Quad (4 lanes sharing g) reductions: the lanes holding the same rows of a C fragment.
// P in the C layout (p[ni]: 8-key column tile ni, fp32) -> the 16-bit A fragment of k-step kk
// (keys 16 kk .. 16 kk + 15 = column tiles 2 kk and 2 kk + 1): a0 = P[g][2t, 2t+1], a1 = row g + 8,
// a2 / a3 = the same 8 keys later. The C layout of S is the A layout of P: no shuffle.
// Overflow: numeric.cuh's pack_float2 policy.
template <typename T, typename Overflow = RoundNearest, int kNTiles>
__device__ __forceinline__ void pack_a_fragment(u32 (&a)[4], const float (&p)[kNTiles][4], int kk) {
    a[0] = pack_float2<T, Overflow>(p[2 * kk][0], p[2 * kk][1]);
    a[1] = pack_float2<T, Overflow>(p[2 * kk][2], p[2 * kk][3]);
    a[2] = pack_float2<T, Overflow>(p[2 * kk + 1][0], p[2 * kk + 1][1]);
    a[3] = pack_float2<T, Overflow>(p[2 * kk + 1][2], p[2 * kk + 1][3]);
}

// Every element of a set of mma accumulator fragments (c[i][j]: one 16x8 fp32 C fragment, 4 a thread) set to 0.
template <int kI, int kJ>
__device__ __forceinline__ void zero_fragments(float (&c)[kI][kJ][4]) {
#pragma unroll
    for (int i = 0; i < kI; ++i)
#pragma unroll
        for (int j = 0; j < kJ; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) c[i][j][e] = 0.f;
}

__device__ __forceinline__ float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

}  // namespace flashkit
