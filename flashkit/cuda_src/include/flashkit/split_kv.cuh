// Split-KV (flash-decoding): the keys of one (row block, kv head, sequence) are cut into `splits` chunks
// of whole tiles, one CTA each. With one split the CTA writes O and LSE itself; with more, each writes
// its normalized partial O_s and LSE_s in fp32 to the workspace (split_partials) and a combine pass
// merges them exactly:
//   LSE = log sum_s exp(LSE_s)          O = sum_s exp(LSE_s - LSE) O_s
// A chunk that saw no key has LSE_s = -inf and weight 0; a row no chunk saw ends with O = 0, LSE = -inf.
//
// Workspace (float32): O_s [splits][batch * heads * seqlen_q][head_dim], then LSE_s [splits][same rows].
// Row id of (batch b, head h, query row qi): (b * heads + h) * seqlen_q + qi, the LSE output's order.
#pragma once

#include "flashkit/fragment.cuh"
#include "flashkit/traits.cuh"

namespace flashkit {

// Tiles [first, end) of chunk `split` of the n_tiles tiles from tile0 on, cut into `splits` chunks.
struct SplitRange {
    int first, end;
    __device__ __forceinline__ SplitRange(int n_tiles, int split, int splits, int tile0 = 0) {
        const int chunk = (n_tiles + splits - 1) / splits;
        first = split * chunk < n_tiles ? split * chunk : n_tiles;
        end = first + chunk < n_tiles ? first + chunk : n_tiles;
        first += tile0;
        end += tile0;
    }
};

struct SplitPartials {
    float* o;
    float* lse;
    index_t rows;   // batch * heads * seqlen_q
    int head_dim;

    __device__ __forceinline__ explicit SplitPartials(const Params& p)
        : o(static_cast<float*>(p.workspace)),
          rows(static_cast<index_t>(p.batch) * p.heads * p.seqlen_q),
          head_dim(p.head_dim) {
        lse = o + p.cache.splits * rows * head_dim;
    }
    __device__ __forceinline__ float* o_row(int split, index_t row) const {
        return o + (split * rows + row) * head_dim;
    }
    __device__ __forceinline__ float& lse_of(int split, index_t row) const { return lse[split * rows + row]; }
};

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
    for (int d = kWarpSize / 2; d > 0; d /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, d));
    return x;
}
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
    for (int d = kWarpSize / 2; d > 0; d /= 2) x += __shfl_xor_sync(0xffffffffu, x, d);
    return x;
}

// exp(x - m) for natural-log values, with exp(-inf - m) = 0.
__device__ __forceinline__ float exp_diff(float x, float m) { return fast_exp2((x - m) * kLog2e); }

// Four output elements (8 bytes) of a 16-bit type from floats.
template <typename OutT>
__device__ __forceinline__ void store4(OutT* dst, float a, float b, float c, float d) {
    uint2 w;
    w.x = pack_float2<OutT>(a, b);
    w.y = pack_float2<OutT>(c, d);
    *reinterpret_cast<uint2*>(dst) = w;
}

// Where output row `row` (b, h, qi) of O lives.
template <typename OutT>
__device__ __forceinline__ OutT* output_row(const Params& p, index_t row) {
    const int qi = static_cast<int>(row % p.seqlen_q);
    const index_t bh = row / p.seqlen_q;
    const int h = static_cast<int>(bh % p.heads);
    const int b = static_cast<int>(bh / p.heads);
    return static_cast<OutT*>(p.o) + b * p.o_batch_stride + qi * p.o_row_stride + h * p.o_head_stride;
}

// The combine pass for one output row, by one warp: LSE = logsumexp_s LSE_s, O = sum_s exp(LSE_s - LSE) O_s.
// Columns [0, cols) of the compiled class kHeadDim (cols: the call's head dim, a multiple of 8).
template <int kHeadDim, typename OutT>
__device__ __forceinline__ void combine_row(const Params& p, index_t row, int lane, int cols) {
    const SplitPartials part(p);
    const int splits = p.cache.splits;
    float m = FLASHKIT_NEG_INF;
    for (int s = lane; s < splits; s += kWarpSize) m = fmaxf(m, part.lse_of(s, row));
    m = warp_max(m);
    float lse = FLASHKIT_NEG_INF;
    if (m != FLASHKIT_NEG_INF) {
        float sum = 0.f;
        for (int s = lane; s < splits; s += kWarpSize) sum += exp_diff(part.lse_of(s, row), m);
        lse = m + fast_log2(warp_sum(sum)) * kLn2;
    }
    OutT* out = output_row<OutT>(p, row);
    constexpr int kVec = 4;
#pragma unroll
    for (int c = lane * kVec; c < kHeadDim; c += kWarpSize * kVec) {
        if (c >= cols) continue;   // (a predicate, not a break: the unrolled loop keeps acc in registers)
        float acc[kVec] = {0.f, 0.f, 0.f, 0.f};
        if (lse != FLASHKIT_NEG_INF) {
            for (int s = 0; s < splits; ++s) {
                const float w = exp_diff(part.lse_of(s, row), lse);   // O_s's weight
                if (w == 0.f) continue;
                const float4 o = *reinterpret_cast<const float4*>(part.o_row(s, row) + c);
                acc[0] += w * o.x;
                acc[1] += w * o.y;
                acc[2] += w * o.z;
                acc[3] += w * o.w;
            }
        }
        store4(out + c, acc[0], acc[1], acc[2], acc[3]);
    }
    if (lane == 0 && p.lse != nullptr) p.lse[row] = lse;
}

}  // namespace flashkit
