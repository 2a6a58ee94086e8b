// One consumer warpgroup of the FP8 (e4m3) forward on the warp-specialized Hopper core (fa3_fp8.cu): the
// interface of ws_mainloop.cuh's WsMainloop, so that the core's ping-pong order, stage rings and epilogue
// drive it unchanged, with both products on e4m3 wgmma (twice the 16-bit rate) and the scales of fp8.cuh.
// Per visited K/V tile (keys [n0, n0 + kBlockN)):
//   S = Q K^T                      wgmma m64n{kBlockN}k32 e4m3, Q and K from shared memory
//   x = S q_scale(row) k_scale(key block) softmax_scale log2(e), then -inf where masked
//   {m, l}, P = 448 exp2(x - m)    fp8::Softmax; O owes alpha v_ref(previous tile) / v_ref(this tile)
//   P *= v_scale(block) / v_ref    only where the tile spans two V scale blocks (v_ref: their maximum)
//   O += e4m3(P) Vt                wgmma m64n{kHeadDim}k32, P from registers (A), Vt K-major (B)
// O stays in units of the current tile's v_ref; finalize multiplies by it and divides by l. Vt is V
// transposed by the pre-pass (v_transpose.cuh), its keys in fp8.cuh's P V order (PvKeys), so that P's
// accumulator layout packs into e4m3 A fragments without shuffles.
#pragma once

#include "flashkit/fp8.cuh"
#include "flashkit/hopper/stage_scales.cuh"
#include "flashkit/hopper/ws_cta.cuh"
#include "flashkit/hopper/ws_mainloop.cuh"
#include "flashkit/mask.cuh"
#include "flashkit/score_mod.cuh"

namespace flashkit {
namespace fp8 {

template <class Kt, class Mask, class ScoreMod>
struct WsMainloop {
    typedef typename Kt::VTile VTile;   // Vt: kHeadDim rows of the tile's keys
    typedef typename Kt::Ring Ring;
    static constexpr int kBN = Kt::kBlockN;
    static constexpr int kScaleParts = hopper::StagedScales<Kt>::kParts;   // scale blocks a tile may span
    static constexpr int kPartTiles = Kt::kNTiles / kScaleParts;
    static_assert(Kt::kVTransposed, "e4m3 P V reads Vt");
    static constexpr bool kPingPong = false;   // FreeIssue (ws_mainloop.cuh): the turns cost more than they hide

    const Mask& mask;
    const Params& params;
    u32 smem;            // the CTA's layout base (the staged scales)
    u32 q_tile;          // this consumer's 64 rows start at row 64 * consumer of the Q tile
    u32 k_tiles, v_tiles;
    int q_row0;          // first Q tile row of this consumer
    float row_scale[2];  // q_scale(row) softmax_scale log2(e), rows g and g + 8
    float v_ref;         // the V scale O is expressed in
    float acc_o[1][Kt::kDTiles][4];
    float s[1][Kt::kNTiles][4];        // S, then its P (floats)
    u32 p_frag[Kt::kPVSteps][4];       // e4m3 P of the tile being multiplied (wgmma A operand)
    float alpha[1][2];                 // what O owes before its next product
    float next_ks[kScaleParts];        // the scales of the tile whose softmax comes next
    float next_v_ratio[kScaleParts];
    float next_v_ref;
    Softmax<1> softmax;

    __device__ __forceinline__ WsMainloop(const Mask& mask_, const Params& p, int head, int batch, u32 smem_,
                                          int consumer, int tile_row0)
        : mask(mask_), params(p), smem(smem_), q_tile(smem_ + Kt::kQOffset), k_tiles(smem_ + Kt::kKOffset),
          v_tiles(smem_ + Kt::kVOffset), q_row0(consumer * gmma::kWarpgroupRows) {
        const int tid_in_group = threadIdx.x % gmma::kWarpgroupThreads;
        const int row0 = tile_row0 + q_row0 + tid_in_group / kWarpSize * Kt::kWarpRows +
                         tid_in_group % kWarpSize / kQuadLanes;   // the thread's row g (then g + 8)
        const float* q_scale = p.q_scale + (static_cast<index_t>(batch) * p.heads + head) * p.q_scale_blocks;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = min(row0 + h * kFragRowHalf, p.seqlen_q - 1);
            row_scale[h] = q_scale[row / p.scale_block_rows] * p.softmax_scale_log2;
        }
        zero_fragments(acc_o);
        v_ref = 1.f;
        softmax.init();
    }

    // The K and V scales of the tile in ring slot `slot`, staged by the producer (stage_scales.cuh): v_ref is their
    // maximum, the ratios what P is multiplied by where the tile spans two V scale blocks.
    __device__ __forceinline__ void stage_landed(int slot) {
        float vs[kScaleParts];
        hopper::StagedScales<Kt>::read(smem, Ring::stage(slot), next_ks, vs);
        next_v_ref = 0.f;
#pragma unroll
        for (int part = 0; part < kScaleParts; ++part) next_v_ref = fmaxf(next_v_ref, vs[part]);
#pragma unroll
        for (int part = 0; part < kScaleParts; ++part) next_v_ratio[part] = __fdividef(vs[part], next_v_ref);
    }

    // S = Q K^T from ring slot `slot` (asynchronous; the first k-step overwrites s).
    __device__ __forceinline__ void issue_scores(int slot) { hopper::issue_qk<Kt>(s[0], q_tile, q_row0, k_tiles, slot); }

    // O += e4m3(P) Vt from ring slot `slot` (asynchronous; p_frag stays untouched until it completes).
    // k-step kk: logical keys 32 kk .. 32 kk + 31, bytes of the Vt rows.
    __device__ __forceinline__ void issue_pv(int slot) {
        const u32 vt_tile = v_tiles + Ring::stage(slot) * Kt::kVStageBytes;
        gmma::fence();
#pragma unroll
        for (int kk = 0; kk < Kt::kPVSteps; ++kk)
            gmma::Mma<float8_e4m3_t, Kt::kHeadDimV>::rs(acc_o[0], p_frag[kk],
                                                        VTile::desc(vt_tile, 0, kk * gmma::kKBytes), 1);
        gmma::commit();
    }

    // S (landed) -> P in place, and alpha (with the change of V unit); keys of tile n_block.
    // x = S q_scale k_scale softmax_scale log2(e). Where one k scale covers the tile and every factor of the warp's
    // rows is positive (the quantizer's scales always are), the factor goes into the exponent's FFMA
    // (to_probabilities_scaled); else S is scaled first and masked after (a scale may be zero or negative).
    template <bool kMasked>
    __device__ __forceinline__ void softmax_step(int n_block, int row0, int col_lane) {
        gmma::fence_registers(s[0]);
        const float c[1][2] = {{row_scale[0] * next_ks[0], row_scale[1] * next_ks[0]}};
        const bool one_k_scale = kScaleParts == 1 || params.scale_block_rows >= kBN;
        if (__all_sync(kFullWarp, one_k_scale && c[0][0] > 0.f && c[0][1] > 0.f)) {
            if constexpr (kMasked) apply_mask(mask, s, row0, n_block * kBN + col_lane);
            softmax.to_probabilities_scaled(s, alpha, c);
        } else {
#pragma unroll
            for (int h = 0; h < 2; ++h)
#pragma unroll
                for (int ni = 0; ni < Kt::kNTiles; ++ni) {
                    const float f = row_scale[h] * next_ks[ni / kPartTiles];
                    s[0][ni][2 * h] *= f;
                    s[0][ni][2 * h + 1] *= f;
                }
            if constexpr (kMasked) apply_mask(mask, s, row0, n_block * kBN + col_lane);
            softmax.to_probabilities(s, alpha, kScoresInLog2);
        }
        const float unit_change = __fdividef(v_ref, next_v_ref);   // O moves to this tile's V unit
#pragma unroll
        for (int h = 0; h < 2; ++h) alpha[0][h] *= unit_change;
        v_ref = next_v_ref;
        if constexpr (kScaleParts > 1) {
            if (params.scale_block_rows < kBN) {   // the tile spans V scale blocks
#pragma unroll
                for (int ni = 0; ni < Kt::kNTiles; ++ni)
#pragma unroll
                    for (int e = 0; e < 4; ++e) s[0][ni][e] *= next_v_ratio[ni / kPartTiles];
            }
        }
    }

    // After the previous P V completed: O *= alpha, and P (s) -> e4m3 A fragments.
    __device__ __forceinline__ void rescale_and_pack() {
        gmma::fence_registers(acc_o[0]);
        Softmax<1>::rescale_if_owed(acc_o, alpha);
#pragma unroll
        for (int kk = 0; kk < Kt::kPVSteps; ++kk) pack_p_fragment(p_frag[kk], s[0], kk);
    }

    // After the last P V: O *= v_ref / l, and the LSE.
    __device__ __forceinline__ void finalize(float (&lse)[1][2]) {
        softmax.finalize(acc_o, kScoresInLog2, lse, v_ref);
    }
};

}  // namespace fp8
}  // namespace flashkit
