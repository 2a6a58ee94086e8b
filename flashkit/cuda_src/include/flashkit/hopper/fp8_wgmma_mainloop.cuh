// The FP8 forward of one query block on Hopper warpgroup products (fp8_hopper.cu, sm_90a).
//
// Per visited K/V tile j (keys [n0, n0 + kBlockN)):
//   S = Q K_j^T                          wgmma m64{kBlockN}k32 e4m3, Q and K from shared memory
//   x = S * q_scale(row) * k_scale(key block) * softmax_scale * log2(e),  masked to -inf
//   {m, l}, P = 448 exp2(x - m)          OnlineSoftmax<E4m3P>; O *= alpha * v_ref(j-1) / v_ref(j)
//   P *= v_scale(key block) / v_ref(j)   only where a tile spans two V scale blocks (v_ref = max)
//   O += e4m3(P) Vt_j                    wgmma m64{kHeadDim}k32, P from registers (A), Vt (B)
// O stays in units of v_ref of the current tile; the epilogue multiplies by it and divides by l.
// Vt_j is the V tile transposed (K-major for the second product, as e4m3 wgmma requires) by
// the pre-pass of v_transpose.cuh, its keys in the P V permutation of fp8.cuh (PvKeys).
// Tiles and pipeline: wgmma_attention.cuh (this is its main-loop type, with the scales).
#pragma once

#include "flashkit/fp8.cuh"
#include "flashkit/hopper/wgmma_attention.cuh"

namespace flashkit {
namespace fp8 {


template <int kHeadDim_, int kBlockM_, int kBlockN_, int kWarps_, typename OutT_>
struct WgmmaTraits : gmma::AttentionTraits<float8_e4m3_t, kHeadDim_, kBlockM_, kBlockN_, kWarps_, OutT_> {
    typedef gmma::AttentionTraits<float8_e4m3_t, kHeadDim_, kBlockM_, kBlockN_, kWarps_, OutT_> Base;
    // Scale blocks a tile may span (rows per scale block: a power of two >= kMinScaleBlock).
    static constexpr int kScaleParts = Base::kBlockN > kMinScaleBlock ? Base::kBlockN / kMinScaleBlock : 1;
    static constexpr int kPartTiles = Base::kNTiles / kScaleParts;
};

template <class Kt, class Mask>
struct WgmmaMainloop {
    static constexpr int kBN = Kt::kBlockN;
    typedef typename Kt::QTile QTile;
    typedef typename Kt::KTile KTile;
    typedef typename Kt::VtTile VtTile;

    const Mask& mask;
    const Params& params;
    const u8* k_gmem;     // row 0 of this (batch, kv head)
    const u8* vt_gmem;    // row 0 (head-dim index 0) of this (batch, kv head)'s transposed V
    index_t vt_row_stride;
    int kv_scale0;        // this (batch, kv head)'s first scale block
    u32 smem;             // the 1024 B aligned base
    int warpgroup;
    float row_scale[2];   // q_scale(row) * softmax_scale * log2(e), rows g and g + 8
    float v_ref;          // the V scale O is currently expressed in
    float acc_o[1][Kt::kDTiles][4];
    float s[1][Kt::kNTiles][4];        // scores of the next tile, then its P (floats)
    u32 p_frag[Kt::kPVSteps][4];       // e4m3 P of the tile being multiplied (wgmma A operand)
    float o_factor[1][2];              // what O owes before the next P V
    float next_ks[Kt::kScaleParts];    // scales of the tile whose scores come next
    float next_v_ratio[Kt::kScaleParts];
    float next_v_ref;
    Softmax<1> softmax;

    __device__ __forceinline__ WgmmaMainloop(const Mask& mask_, const Params& p, u32 smem_, int m0, int head,
                                             int batch, int tid)
        : mask(mask_), params(p), smem(smem_) {
        const int kv_head = head / (p.heads / p.kv_heads);   // GQA / MQA
        const int bh = batch * p.kv_heads + kv_head;
        k_gmem = static_cast<const u8*>(p.k) + batch * p.k_batch_stride + kv_head * p.k_head_stride;
        vt_row_stride = static_cast<index_t>(ceil_div(p.seqlen_k, kBN)) * kBN;
        vt_gmem = static_cast<const u8*>(p.workspace) + static_cast<index_t>(bh) * Kt::kHeadDim * vt_row_stride;
        kv_scale0 = bh * p.k_scale_blocks;
        const int warp = tid / kWarpSize;
        const int lane = tid % kWarpSize;
        warpgroup = warp / (gmma::kWarpgroupThreads / kWarpSize);
        const float* q_scale = p.q_scale + (static_cast<index_t>(batch) * p.heads + head) * p.q_scale_blocks;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = min(m0 + warp * Kt::kWarpRows + lane / kQuadLanes + h * kFragRowHalf, p.seqlen_q - 1);
            row_scale[h] = q_scale[row / p.scale_block_rows] * p.softmax_scale_log2;
        }
#pragma unroll
        for (int nd = 0; nd < Kt::kDTiles; ++nd)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc_o[0][nd][e] = 0.f;
        v_ref = 1.f;
        softmax.init();
    }

    __device__ __forceinline__ u32 k_stage(int stage) const { return smem + Kt::kKOffset + stage * Kt::kKStageBytes; }
    __device__ __forceinline__ u32 vt_stage(int stage) const { return smem + Kt::kVtOffset + stage * Kt::kVtStageBytes; }

    // K_j and Vt_j into a stage (one cp.async group).
    __device__ __forceinline__ void load_kv_async(int stage, int n_block, int tid) const {
        const int n0 = n_block * kBN;
        KTile::template load_async<Kt::kThreads>(k_stage(stage), k_gmem + n0 * params.k_row_stride,
                                                 params.k_row_stride, params.seqlen_k - n0, tid);
        // Vt rows are padded to whole tiles with zero keys: every row is valid.
        VtTile::template load_async<Kt::kThreads>(vt_stage(stage), vt_gmem + n0, vt_row_stride, Kt::kHeadDim, tid);
        cp_async_commit();
    }

    // The K and V scales of the tile's key blocks; returns v_ref (their maximum) and sets the
    // ratios P is multiplied by where the tile spans two V scale blocks.
    __device__ __forceinline__ float tile_scales(int n_block, float (&ks)[Kt::kScaleParts],
                                                 float (&v_ratio)[Kt::kScaleParts]) const {
        float vs[Kt::kScaleParts];
        float vmax = 0.f;
#pragma unroll
        for (int part = 0; part < Kt::kScaleParts; ++part) {
            const int block = min((n_block * kBN + part * kMinScaleBlock) / params.scale_block_rows,
                                  params.k_scale_blocks - 1);
            ks[part] = params.k_scale[kv_scale0 + block];
            vs[part] = params.v_scale[kv_scale0 + block];
            vmax = fmaxf(vmax, vs[part]);
        }
#pragma unroll
        for (int part = 0; part < Kt::kScaleParts; ++part) v_ratio[part] = __fdividef(vs[part], vmax);
        return vmax;
    }

    // Issue S = Q K^T for the tile in `stage` (asynchronous; the first k-step overwrites s).
    __device__ __forceinline__ void issue_scores(int stage) {
        const int q_row0 = warpgroup * gmma::kWarpgroupRows;
        gmma::fence();
#pragma unroll
        for (int kk = 0; kk < Kt::kQKSteps; ++kk)
            gmma::Mma<float8_e4m3_t, kBN>::ss(s[0], QTile::desc(smem + Kt::kQOffset, q_row0, kk * gmma::kKBytes),
                                   KTile::desc(k_stage(stage), 0, kk * gmma::kKBytes), kk > 0);
        gmma::commit();
    }

    // Issue O += e4m3(P) Vt for the tile in `stage` (asynchronous; p_frag stays untouched until
    // it completes).
    __device__ __forceinline__ void issue_pv(int stage) {
        gmma::fence();
#pragma unroll
        for (int kk = 0; kk < Kt::kPVSteps; ++kk)
            gmma::Mma<float8_e4m3_t, Kt::kHeadDim>::rs(acc_o[0], p_frag[kk], VtTile::desc(vt_stage(stage), 0, kk * gmma::kKBytes),
                                            1);
        gmma::commit();
    }

    __device__ __forceinline__ void q_resident(int) {}   // Q is read from shared memory (8-bit A: no ldmatrix)

    // Fetch the K and V scales of tile n_block into registers (issued before the products whose
    // wait would otherwise expose the load latency).
    __device__ __forceinline__ void prefetch_scales(int n_block) {
        next_v_ref = tile_scales(n_block, next_ks, next_v_ratio);
    }

    // The landed scores of the prefetched tile n_block -> P (floats, in s); o_factor: what O owes
    // before the next product (alpha times the change of V scale unit).
    static constexpr bool kSplitSoftmax = false;   // the whole softmax runs under P V
    template <bool kMasked>
    __device__ __forceinline__ void softmax_step(int n_block, int row0, int col_lane) {
        gmma::fence_accumulators(s[0]);
        // x = S * q_scale * k_scale * softmax_scale * log2(e), before masking (the scale may be < 0).
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int ni = 0; ni < Kt::kNTiles; ++ni) {
                const float c = row_scale[h] * next_ks[ni / Kt::kPartTiles];
                s[0][ni][2 * h] *= c;
                s[0][ni][2 * h + 1] *= c;
            }
        if constexpr (kMasked) apply_mask(mask, s, row0, n_block * kBN + col_lane);
        softmax.to_probabilities(s, o_factor, kScoresInLog2);
        const float unit_change = __fdividef(v_ref, next_v_ref);   // O moves to units of this tile's V scale
#pragma unroll
        for (int h = 0; h < 2; ++h) o_factor[0][h] *= unit_change;
        v_ref = next_v_ref;
        if constexpr (Kt::kScaleParts > 1) {
            if (params.scale_block_rows < kBN) {   // the tile spans V scale blocks
#pragma unroll
                for (int ni = 0; ni < Kt::kNTiles; ++ni)
#pragma unroll
                    for (int e = 0; e < 4; ++e) s[0][ni][e] *= next_v_ratio[ni / Kt::kPartTiles];
            }
        }
    }

    // After the previous P V completed: O *= o_factor, and P (s) -> e4m3 A fragments.
    __device__ __forceinline__ void rescale_and_pack() {
        gmma::fence_accumulators(acc_o[0]);
        Softmax<1>::rescale_if_owed(acc_o, o_factor);
#pragma unroll
        for (int kk = 0; kk < Kt::kPVSteps; ++kk) pack_p_fragment(p_frag[kk], s[0], kk);
    }

    __device__ __forceinline__ void finalize(float (&lse)[1][2]) { softmax.finalize(acc_o, kScoresInLog2, lse, v_ref); }   // O *= v_ref / l
};

}  // namespace fp8
}  // namespace flashkit
