// Element types and conversions for flashkit device code, with no CUDA toolkit header
// (NVRTC on a bare machine has no cuda_fp16.h / cuda_bf16.h): every conversion is PTX.
//
// Stable API (other variants include this file; extend, do not rename):
//   flashkit::half_t, bfloat16_t, float8_e4m3_t      raw storage types (16 / 16 / 8 bits)
//   flashkit::DType<code>::type                       storage type of a FLASHKIT_* dtype code
//   flashkit::Element, flashkit::OutT                 types of FLASHKIT_DTYPE / FLASHKIT_OUT_DTYPE
//   to_float(x)                                       any element -> float
//   from_float<T>(f)                                  float -> element T (round to nearest even)
//   pack_float2<T>(lo, hi)                            two floats -> one 32-bit register of 2 x T
//                                                     (lo in bits 0..15, hi in bits 16..31)
//   pack_float2<T, SaturateFinite>(lo, hi)            the same, values past T's range to its largest finite
//   unpack_float2<T>(u, lo, hi)                       inverse of pack_float2 (16-bit T)
//   pack_e4m3x4(x0, x1, x2, x3)                       four floats -> four e4m3 bytes (sm_89+)
//   fast_exp2(x), fast_log2(x)                        ex2.approx.ftz / lg2.approx.ftz
//   kLog2e, kLn2, kE4m3Max, FLASHKIT_NEG_INF          named constants (-inf is a macro)
#pragma once

#include "flashkit/params.cuh"

namespace flashkit {

typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned char u8;

// log2(e) and ln(2): exp(x) = exp2(x * kLog2e), log(x) = log2(x) * kLn2.
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kE4m3Max = 448.f;   // largest finite e4m3 (e4m3fn)
// -inf as a float bit pattern (no <cmath>, no INFINITY macro under bare NVRTC).
#define FLASHKIT_NEG_INF (__int_as_float(0xff800000))

// Raw storage types: a 16-bit (or 8-bit) pattern with no arithmetic of its own.
struct alignas(2) half_t { u16 bits; };
struct alignas(2) bfloat16_t { u16 bits; };
struct alignas(1) float8_e4m3_t { u8 bits; };

template <int Code> struct DType;
template <> struct DType<FLASHKIT_FLOAT16> {
    typedef half_t type;
    static constexpr bool kIsBf16 = false;
    static constexpr int kBytes = 2;
};
template <> struct DType<FLASHKIT_BFLOAT16> {
    typedef bfloat16_t type;
    static constexpr bool kIsBf16 = true;
    static constexpr int kBytes = 2;
};
template <> struct DType<FLASHKIT_FLOAT32> {
    typedef float type;
    static constexpr bool kIsBf16 = false;
    static constexpr int kBytes = 4;
};
template <> struct DType<FLASHKIT_FLOAT8_E4M3> {
    typedef float8_e4m3_t type;
    static constexpr bool kIsBf16 = false;
    static constexpr int kBytes = 1;
};

#ifdef FLASHKIT_DTYPE
typedef DType<FLASHKIT_DTYPE>::type Element;       // input (q, k, v) element
#endif
#ifdef FLASHKIT_OUT_DTYPE
typedef DType<FLASHKIT_OUT_DTYPE>::type OutT;      // output (o) element
#endif

// ---- scalar conversions to float -------------------------------------------------------
__device__ __forceinline__ float to_float(float x) { return x; }

__device__ __forceinline__ float to_float(half_t x) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x.bits));
    return f;
}

// bf16 is the top half of an fp32: widening is exact.
__device__ __forceinline__ float to_float(bfloat16_t x) {
    return __uint_as_float(static_cast<u32>(x.bits) << 16);
}

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 890
// e4m3 -> f16 is exact (cvt.rn.f16x2.e4m3x2, sm_89+), then f16 -> f32.
__device__ __forceinline__ float to_float(float8_e4m3_t x) {
    u32 h2;
    u16 pair = x.bits;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(pair));
    half_t lo;
    lo.bits = static_cast<u16>(h2 & 0xffffu);
    return to_float(lo);
}

// Four floats -> four e4m3 bytes (x0 in bits 0..7), round to nearest even, saturating at
// +-kE4m3Max. PTX cvt.rn.satfinite.e4m3x2.f32 d, a, b puts a in the upper byte and b in the lower.
__device__ __forceinline__ u32 pack_e4m3x4(float x0, float x1, float x2, float x3) {
    u16 lo, hi;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(lo) : "f"(x1), "f"(x0));
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(hi) : "f"(x3), "f"(x2));
    return static_cast<u32>(lo) | (static_cast<u32>(hi) << 16);
}
#endif

// ---- scalar conversions from float (round to nearest even) ----------------------------
template <typename T> __device__ __forceinline__ T from_float(float f);

template <> __device__ __forceinline__ float from_float<float>(float f) { return f; }

template <> __device__ __forceinline__ half_t from_float<half_t>(float f) {
    half_t h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.bits) : "f"(f));
    return h;
}

template <> __device__ __forceinline__ bfloat16_t from_float<bfloat16_t>(float f) {
    bfloat16_t h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h.bits) : "f"(f));
    return h;
}

// ---- packed pairs: two floats -> one 32-bit register -----------------------------------
// PTX cvt.rn.{f16,bf16}x2.f32 d, a, b puts a in the UPPER half and b in the LOWER half.
// The overflow policy is a type: RoundNearest (cvt.rn: past T's range to +-inf) or SaturateFinite
// (cvt.rn.satfinite: to +-T's largest finite; the same instruction, at the same rate). The backward packs P and dS
// saturated: a key past seqlen_k (no element mask, zero K row) has P = exp2(0 - lse2), which overflows f16 where a
// row's LSE lies below about -11; saturated, its dS stays finite and its dQ term dS * 0 an exact zero.
struct RoundNearest {};
struct SaturateFinite {};

template <typename T, typename Overflow = RoundNearest> __device__ __forceinline__ u32 pack_float2(float lo, float hi);

template <> __device__ __forceinline__ u32 pack_float2<half_t, RoundNearest>(float lo, float hi) {
    u32 d;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
    return d;
}

template <> __device__ __forceinline__ u32 pack_float2<bfloat16_t, RoundNearest>(float lo, float hi) {
    u32 d;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
    return d;
}

template <> __device__ __forceinline__ u32 pack_float2<half_t, SaturateFinite>(float lo, float hi) {
    u32 d;
    asm("cvt.rn.satfinite.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
    return d;
}

template <> __device__ __forceinline__ u32 pack_float2<bfloat16_t, SaturateFinite>(float lo, float hi) {
    u32 d;
    asm("cvt.rn.satfinite.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
    return d;
}

template <typename T>
__device__ __forceinline__ void unpack_float2(u32 u, float& lo, float& hi) {
    T a, b;
    a.bits = static_cast<u16>(u & 0xffffu);
    b.bits = static_cast<u16>(u >> 16);
    lo = to_float(a);
    hi = to_float(b);
}

// ---- fast transcendental functions -----------------------------------------------------
// 2^x, flush-to-zero; ex2.approx(-inf) = +0, which the online softmax relies on.
__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// float(x) for |x| < 2^22, exactly, in an integer add and a float add (both full rate; a conversion
// instruction runs at a quarter of it): 1.5 * 2^23 + x has x in its low mantissa bits. (Drop-in functors
// use it too: docs/functors.md.)
constexpr int kMagicIntBits = 0x4B400000;        // the bits of 1.5 * 2^23 = 12582912.f
constexpr float kMagicIntFloat = 12582912.f;
__device__ __forceinline__ float index_float(int x) { return __int_as_float(kMagicIntBits + x) - kMagicIntFloat; }

// log2(x), flush-to-zero; lg2.approx(0) = -inf.
__device__ __forceinline__ float fast_log2(float x) {
    float y;
    asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// 1/x, approximate (full range).
__device__ __forceinline__ float fast_rcp(float x) {
    float y;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

}  // namespace flashkit
