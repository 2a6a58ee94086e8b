// dQ-style accumulation of an mma C fragment into fp32 global memory by reductions (atomics that return
// nothing). On sm_90 one 16-byte vector reduction (red.global.add.v4.f32, PTX ISA 8.1) replaces four scalar
// ones: a backward whose dQ adds keep the L2 busy (fa3_bwd measured 95% L2 throughput with scalar adds) makes
// a quarter of the requests.
#pragma once

#include "flashkit/traits.cuh"

namespace flashkit {

#if __CUDA_ARCH__ >= 900
// dst[0..3] += (a, b, c, d), relaxed, gpu scope; dst 16-byte aligned, in global memory.
__device__ __forceinline__ void red_add_v4(float* dst, float a, float b, float c, float d) {
    asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n"
                 :: "l"(dst), "f"(a), "f"(b), "f"(c), "f"(d) : "memory");
}
#endif

// dst += scale * f for one 8-column tile of an mma C fragment in rows (dq_layout.cuh's DqRowMajor): f = (row
// g: columns c2, c2 + 1; row g + 8: the same columns), c2 = 2 (lane % 4), `at` = &dst[g][c2], rows `ld` floats
// apart. Every lane of the warp calls
// it (sm_90: quad lanes t and t ^ 1 swap a half each, so the even lane adds columns c2 .. c2 + 3 of row g and
// the odd lane columns c2 - 2 .. c2 + 1 of row g + 8, one vector reduction each; `at` and ld 16-byte aligned
// in floats where c2 is a multiple of 4).
__device__ __forceinline__ void red_add_fragment(float* at, int ld, int lane, float f0, float f1, float f2, float f3,
                                                 float scale) {
#if __CUDA_ARCH__ >= 900
    const bool odd = lane & 1;
    const float g0 = __shfl_xor_sync(0xffffffffu, odd ? f0 : f2, 1);
    const float g1 = __shfl_xor_sync(0xffffffffu, odd ? f1 : f3, 1);
    if (odd) {
        red_add_v4(at + kFragRowHalf * ld - kFragCols, g0 * scale, g1 * scale, f2 * scale, f3 * scale);
    } else {
        red_add_v4(at, f0 * scale, f1 * scale, g0 * scale, g1 * scale);
    }
#else
    atomicAdd(at, f0 * scale);
    atomicAdd(at + 1, f1 * scale);
    atomicAdd(at + kFragRowHalf * ld, f2 * scale);
    atomicAdd(at + kFragRowHalf * ld + 1, f3 * scale);
#endif
}

}  // namespace flashkit
