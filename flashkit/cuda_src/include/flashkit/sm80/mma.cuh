// mma.sync.m16n8k16 (f32 accumulate) for the sm_80 family; fragment layouts, ldmatrix and the
// quad reductions are shared with the Hopper family (flashkit/fragment.cuh).
#pragma once

#include "flashkit/fragment.cuh"

namespace flashkit {

// C += A * B for one m16n8k16 tile; the element type picks the f16 or bf16 instruction.
template <typename T>
__device__ __forceinline__ void mma_16816(float (&c)[4], const u32 (&a)[4], u32 b0, u32 b1);

template <>
__device__ __forceinline__ void mma_16816<half_t>(float (&c)[4], const u32 (&a)[4], u32 b0,
                                                  u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <>
__device__ __forceinline__ void mma_16816<bfloat16_t>(float (&c)[4], const u32 (&a)[4], u32 b0,
                                                      u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

}  // namespace flashkit
