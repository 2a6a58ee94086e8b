// What an 8-bit forward's K/V stage carries beside its tiles (WsTraits::kStagedScales, fa3_fp8.cu): the K and V scales
// of the stage's keys. The producer thread loads them and writes them between the stage's empty wait and its
// arrive.expect_tx, whose release publishes them with the tile; a consumer reads them after the stage's full wait
// and before handing it back. A consumer that loaded them from global memory itself stalled on the load (at its
// first use, or where ptxas moved the value into a uniform register) ~200-400 of a 2550-cycle visit at hd128 (the
// timeline probe in BENCHMARKS.md); the producer thread waits on the consumers anyway.
// A slot per stage: {k_scale, v_scale} of each 64-key part of the tile (a 128-key tile may span two scale blocks).
#pragma once

#include "flashkit/fp8.cuh"
#include "flashkit/hopper/tma.cuh"
#include "flashkit/hopper/ws_traits.cuh"
#include "flashkit/params.cuh"

namespace flashkit {
namespace hopper {

template <class Kt>
struct StagedScales {
    static constexpr int kParts = Kt::kBlockN > fp8::kMinScaleBlock ? Kt::kBlockN / fp8::kMinScaleBlock : 1;
    static_assert(kParts <= 2, "a slot holds the scales of two parts");

    __device__ __forceinline__ static u32 slot(u32 smem, int stage) {
        return smem + Kt::kScaleOffset + stage * kStageScaleBytes;
    }

    // Producer: tile n_block's scales of (batch, kv head) -> {k(part 0), k(part 1), v(part 0), v(part 1)} (a part
    // past kParts is never read).
    __device__ __forceinline__ static void load(const Params& p, int kv_head, int batch, int n_block, float (&out)[4]) {
        const int first = (batch * p.kv_heads + kv_head) * p.k_scale_blocks;   // this (batch, kv head)'s blocks
        out[1] = out[3] = 0.f;
#pragma unroll
        for (int part = 0; part < kParts; ++part) {
            const int block = min((n_block * Kt::kBlockN + part * fp8::kMinScaleBlock) / p.scale_block_rows,
                                  p.k_scale_blocks - 1);
            out[part] = p.k_scale[first + block];
            out[2 + part] = p.v_scale[first + block];
        }
    }

    // Consumer: the scales of the tile in stage `stage` (after its full wait).
    __device__ __forceinline__ static void read(u32 smem, int stage, float (&ks)[kParts], float (&vs)[kParts]) {
        const float2 k = ld_shared_f2(slot(smem, stage));
        const float2 v = ld_shared_f2(slot(smem, stage) + 2 * sizeof(float));
        ks[0] = k.x;
        vs[0] = v.x;
        if constexpr (kParts > 1) {
            ks[1] = k.y;
            vs[1] = v.y;
        }
    }
};

}  // namespace hopper
}  // namespace flashkit
