// FP8 (e4m3) block quantization of a (batch, seqlen, heads, D) tensor, with optional Hadamard
// incoherent processing (flashkit/fp8.py compiles and launches it; sm_89+ for the e4m3 cvt).
//
// One CTA per (row block, head, batch), kWarps warps; a warp takes one row at a time, each lane
// kPerLane contiguous elements (element e = lane * kPerLane + i). For each row x:
//   hadamard:  x <- H (signs * x) / sqrt(D)   (random-sign Walsh-Hadamard, orthogonal)
//   amax       = max |x| over the block's rows
//   scale      = amax / 448 (1 when amax = 0);  q = e4m3_rn_satfinite(x * (448 / amax))
// Modes: 0 fused (amax, scale, quantize: the block is read once from DRAM, the second read hits
// L2); 1 amax only (scales <- amax); 2 quantize with scales[] holding a given amax (written
// back as the scale), for per-tensor scales. Defines: FLASHKIT_DTYPE (input element),
// FLASHKIT_HEAD_DIM, FLASHKIT_HADAMARD (0 or 1).
#pragma once

#include "flashkit/numeric.cuh"

namespace flashkit {
namespace fp8q {

constexpr float kE4m3Max = 448.f;
constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kD = FLASHKIT_HEAD_DIM;
constexpr int kPerLane = kD >= 32 ? (kD + 31) / 32 : 1;
constexpr bool kHadamard = FLASHKIT_HADAMARD != 0;
static_assert(!kHadamard || (kD & (kD - 1)) == 0, "Hadamard: power-of-two head dim");
static_assert(kD <= 1024, "head dim <= 1024");

enum Mode { kFused = 0, kAmaxOnly = 1, kGivenAmax = 2 };

// One row of this lane's elements (0 past D), Hadamard-rotated when asked.
__device__ __forceinline__ void load_row(float (&v)[kPerLane], const Element* row, const float* signs,
                                         int lane) {
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
        const int e = lane * kPerLane + i;
        v[i] = e < kD ? to_float(row[e]) : 0.f;
    }
    if constexpr (kHadamard) {
#pragma unroll
        for (int i = 0; i < kPerLane; ++i) {
            const int e = lane * kPerLane + i;
            v[i] *= e < kD ? signs[e] : 0.f;
        }
        // Butterflies: (a, b) -> (a + b, a - b) for index pairs h apart; h < kPerLane in a lane,
        // larger h across lanes (lane bit h / kPerLane).
#pragma unroll
        for (int h = 1; h < kPerLane; h <<= 1)
#pragma unroll
            for (int i = 0; i < kPerLane; ++i)
                if ((i & h) == 0) {
                    const float a = v[i], b = v[i + h];
                    v[i] = a + b;
                    v[i + h] = a - b;
                }
#pragma unroll
        for (int ls = 1; ls * kPerLane < kD; ls <<= 1)
#pragma unroll
            for (int i = 0; i < kPerLane; ++i) {
                const float other = __shfl_xor_sync(0xffffffffu, v[i], ls);
                v[i] = (lane & ls) ? other - v[i] : v[i] + other;
            }
        const float norm = rsqrtf(static_cast<float>(kD));
#pragma unroll
        for (int i = 0; i < kPerLane; ++i) v[i] *= norm;
    }
}

__device__ __forceinline__ u8 to_e4m3(float x) {
    u16 pair;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(0.f), "f"(x));
    return static_cast<u8>(pair & 0xffu);
}

}  // namespace fp8q
}  // namespace flashkit

extern "C" __global__ void __launch_bounds__(flashkit::fp8q::kThreads)
    flashkit_fp8_quantize(const flashkit::Element* x, long long batch_stride, long long row_stride,
                          long long head_stride, unsigned char* out, float* scales, const float* signs,
                          int seqlen, int heads, int block_rows, int mode) {
    using namespace flashkit;
    using namespace flashkit::fp8q;
    const int blk = blockIdx.x, head = blockIdx.y, batch = blockIdx.z;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int r0 = blk * block_rows;
    const int r1 = min(r0 + block_rows, seqlen);
    const Element* base = x + batch * batch_stride + head * head_stride;
    float* scale = scales + (static_cast<long long>(batch) * heads + head) * gridDim.x + blk;
    __shared__ float warp_amax[kWarps];
    float v[kPerLane];

    float amax;
    if (mode == kGivenAmax) {
        amax = *scale;
    } else {
        float m = 0.f;
        for (int r = r0 + warp; r < r1; r += kWarps) {
            load_row(v, base + r * row_stride, signs, lane);
#pragma unroll
            for (int i = 0; i < kPerLane; ++i) m = fmaxf(m, fabsf(v[i]));
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
        if (lane == 0) warp_amax[warp] = m;
        __syncthreads();
        amax = 0.f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) amax = fmaxf(amax, warp_amax[w]);
        if (mode == kAmaxOnly) {
            if (threadIdx.x == 0) *scale = amax;
            return;
        }
    }
    __syncthreads();   // every thread has read *scale before thread 0 overwrites it
    const bool nonzero = amax > 0.f;
    if (threadIdx.x == 0) *scale = nonzero ? amax / kE4m3Max : 1.f;
    const float inv = nonzero ? kE4m3Max / amax : 1.f;   // x / scale, as 448 / amax
    for (int r = r0 + warp; r < r1; r += kWarps) {
        load_row(v, base + r * row_stride, signs, lane);
        unsigned char* dst = out + ((static_cast<long long>(batch) * seqlen + r) * heads + head) * kD;
#pragma unroll
        for (int i = 0; i < kPerLane; ++i) {
            const int e = lane * kPerLane + i;
            if (e < kD) dst[e] = to_e4m3(v[i] * inv);
        }
    }
}
