// e4m3 mma.sync for the fp8 variant (sm_89+): byte tiles in shared memory, the m16n8k32 e4m3 mma,
// and the byte transpose of V. Fragment layouts and the P V key permutation: flashkit/fp8.cuh.
//
// In bytes the m16n8k32 fragments are the b16 fragments of m16n8k16 with a pair of bytes per b16
// element, so ldmatrix (b16, no .trans) loads A from a row-major Q tile and B from a K-major tile
// (K for Q K^T, the transposed V tile Vt for P V). There is no 8-bit ldmatrix.trans: V is
// transposed in shared memory (transpose_v_tile), keeping the (batch, seqlen, heads, D) layout of
// the kernel contract for pre-quantized inputs.
#pragma once

#include "flashkit/fp8.cuh"
#include "flashkit/sm80/mma.cuh"
#include "flashkit/tile.cuh"

namespace flashkit {
namespace fp8 {

constexpr int kMmaK8 = 32;                    // k of mma.m16n8k32 (bytes)

// ---- byte tiles in shared memory --------------------------------------------------------
// Row-major (rows x kRowBytes) with the 16 B chunk index XOR-swizzled by the row, so that an
// ldmatrix phase (8 rows, one chunk each) hits 8 distinct 16 B bank groups. With C chunks per
// row and R = max(1, 8 / C) rows per 128 B line:  chunk' = chunk ^ ((row / R) % min(C, 8)),
// i.e. chunk ^ (row % 8) for rows of >= 128 B (as tile.cuh), chunk ^ ((row / 2) % 4) for 64 B
// rows, chunk ^ ((row / 4) % 2) for 32 B rows. The key is the same for rows 8 apart, so a
// lane's key is fixed for all its fragment loads.
template <int kRowBytes>
__device__ __forceinline__ int swizzle_key(int row) {
    constexpr int kChunks = kRowBytes / kChunkBytes;
    static_assert(kChunks == 2 || kChunks == 4 || kChunks % 8 == 0,
                  "byte tile rows: 32 B, 64 B or a multiple of 128 B");
    if constexpr (kChunks == 2) {
        return (row >> 2) & 1;
    } else if constexpr (kChunks == 4) {
        return (row >> 1) & 3;
    } else {
        return row & kSwizzleMask;
    }
}

template <int kRowBytes>
__device__ __forceinline__ int byte_offset(int row, int byte) {
    const int chunk = (byte / kChunkBytes) ^ swizzle_key<kRowBytes>(row);
    return row * kRowBytes + chunk * kChunkBytes + byte % kChunkBytes;
}

// The swizzled byte tile above as a layout of load_rows_async (tile.cuh).
template <int kRowBytes>
struct ByteTile {
    __device__ __forceinline__ static int chunk_offset(int row, int chunk) {
        return byte_offset<kRowBytes>(row, chunk * kChunkBytes);
    }
};

// ---- tensor cores --------------------------------------------------------------------------
// Two e4m3 bytes (bits 0..15) -> two f16 (exact), as one f16x2 register.
__device__ __forceinline__ u32 e4m3x2_to_f16x2(u16 pair) {
    u32 h2;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(pair));
    return h2;
}

// C += A * B for one m16n8k32 tile, e4m3 operands, f32 accumulation.
// sm_89 (and sm_120) run it natively (QMMA). sm_90 has no 8-bit mma.sync in hardware and ptxas
// expands it into conversions plus two f16 mma.m16n8k16 per call, spilling at large head dims;
// doing the same by hand (FLASHKIT_FP8_F16_MMA) keeps the register use in check. The split is
// exact: e4m3 -> f16 is exact and the products accumulate in f32. Bytes {0, 1} of every
// register (k = 4t, 4t + 1 and 16 + 4t, 16 + 4t + 1) go to the first m16n8k16, bytes {2, 3}
// to the second; A and B split alike, so each k meets its partner.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ != 890 && __CUDA_ARCH__ < 1200
#define FLASHKIT_FP8_F16_MMA 1
#endif
__device__ __forceinline__ void mma_16832(float (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) {
#ifdef FLASHKIT_FP8_F16_MMA
    u32 a_lo[4], a_hi[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        a_lo[i] = e4m3x2_to_f16x2(static_cast<u16>(a[i] & 0xffffu));
        a_hi[i] = e4m3x2_to_f16x2(static_cast<u16>(a[i] >> 16));
    }
    mma_16816<half_t>(c, a_lo, e4m3x2_to_f16x2(static_cast<u16>(b0 & 0xffffu)),
                      e4m3x2_to_f16x2(static_cast<u16>(b1 & 0xffffu)));
    mma_16816<half_t>(c, a_hi, e4m3x2_to_f16x2(static_cast<u16>(b0 >> 16)),
                      e4m3x2_to_f16x2(static_cast<u16>(b1 >> 16)));
#else
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// ---- the byte transpose of V ---------------------------------------------------------------
__device__ __forceinline__ u32 byte_perm(u32 a, u32 b, u32 selector) {
    u32 d;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(selector));
    return d;
}

// r[i] holds bytes (row i, cols 0..3) of a 4x4 byte block; afterwards r[j] = (rows 0..3, col j).
__device__ __forceinline__ void transpose_4x4_bytes(u32 (&r)[4]) {
    // Interleave pairs of rows: t0 = [r0.b0 r1.b0 r0.b1 r1.b1], t1 = [r0.b2 r1.b2 r0.b3 r1.b3].
    const u32 t0 = byte_perm(r[0], r[1], 0x5140u), t1 = byte_perm(r[0], r[1], 0x7362u);
    const u32 t2 = byte_perm(r[2], r[3], 0x5140u), t3 = byte_perm(r[2], r[3], 0x7362u);
    // Then pairs of halves: [t0.b0 t0.b1 t2.b0 t2.b1] = column 0, and so on.
    r[0] = byte_perm(t0, t2, 0x5410u);
    r[1] = byte_perm(t0, t2, 0x7632u);
    r[2] = byte_perm(t1, t3, 0x5410u);
    r[3] = byte_perm(t1, t3, 0x7632u);
}

__device__ __forceinline__ u32 lds_u32(u32 addr) {
    u32 v;
    asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(addr));
    return v;
}
__device__ __forceinline__ void sts_u32(u32 addr, u32 v) {
    asm volatile("st.shared.u32 [%0], %1;" ::"r"(addr), "r"(v));
}

// Vt[d][logical key] = V[physical key][d] for one (kBlockN x kHeadDim) tile: sv is the swizzled
// row-major V tile (rows of kHeadDim bytes), svt the swizzled Vt tile (rows of kBlockN bytes),
// both shared addresses. A work item is (logical key word kw = 4 q + t, head-dim word w): it
// reads physical keys 16 q + {2t, 2t+1, 2t+8, 2t+9} at bytes 4w..4w+3 and writes rows
// 4w..4w+3 of Vt at logical bytes 4 kw..4 kw+3 (see the key permutation above).
template <int kBlockN, int kHeadDim, int kThreads>
__device__ __forceinline__ void transpose_v_tile(u32 sv, u32 svt, int tid) {
    constexpr int kKeyWords = kBlockN / 4;
    constexpr int kItems = kKeyWords * (kHeadDim / 4);
    static_assert(kItems % kThreads == 0 || kThreads % kItems == 0, "transpose work splits evenly");
    constexpr int kRounds = kItems >= kThreads ? kItems / kThreads : 1;
#pragma unroll 1
    for (int i = 0; i < kRounds; ++i) {
        const int item = tid + i * kThreads;
        if (kItems < kThreads && item >= kItems) break;
        const int kw = item % kKeyWords;
        const int w = item / kKeyWords;
        const int group = kPermKeys * (kw / 4);   // logical keys 4 kw .. 4 kw + 3
        u32 r[4];
#pragma unroll
        for (int j = 0; j < 4; ++j)
            r[j] = lds_u32(sv + byte_offset<kHeadDim>(group + pv_physical_key(4 * (kw % 4) + j), 4 * w));
        transpose_4x4_bytes(r);
#pragma unroll
        for (int j = 0; j < 4; ++j) sts_u32(svt + byte_offset<kBlockN>(4 * w + j, 4 * kw), r[j]);
    }
}

}  // namespace fp8
}  // namespace flashkit
