// The bf16 / f16 forward of one query block on Hopper warpgroup products (hopper.cu, sm_90a): the
// main-loop type wgmma_attention.cuh's pipeline drives. Per visited K/V tile j (keys [n0, n0 + kBlockN)):
//   S = Q K_j^T                       wgmma m64{kBlockN}k16, Q from registers (A), K_j (B)
//   S = -inf where masked             only on the tiles the mask says cross a boundary
//   {m, l}, P = exp2(S c - m c)       OnlineSoftmax::to_probabilities (c = softmax_scale log2 e);
//                                     O owes alpha, paid once the previous P V has completed
//   O += P V_j                        wgmma m64{kHeadDim}k16, P from registers (A), V_j (B, read
//                                     MN-major: 16-bit wgmma transposes B, so V needs no pre-pass)
// P's A fragment is S's accumulator packed to 16 bits: k-step kk (keys 16 kk .. 16 kk + 15) is
// S column tiles 2 kk and 2 kk + 1 (fragment.cuh's pack_a_fragment, as the mma.sync P V). The V
// tile has K's layout (keys as rows, swizzled 128 B panels of the head dim). Q is taken into registers once (ldmatrix of the
// swizzled tile, the same A fragment): each S product then reads only K from shared memory, which
// at 64-key tiles would otherwise bound it (Q 16 KB + K 16 KB a tile at hd128).
#pragma once

#include "flashkit/softmax.cuh"
#include "flashkit/hopper/wgmma_attention.cuh"

namespace flashkit {

template <class Kt, class Mask>
struct HopperMainloop {
    typedef typename Kt::Element Element;
    static constexpr int kBN = Kt::kBlockN;
    typedef typename Kt::QTile QTile;
    typedef typename Kt::KTile KTile;

    const Mask& mask;
    const Params& params;
    const u8* k_gmem;     // row 0 of this (batch, kv head)
    const u8* v_gmem;     // row 0 of this (batch, kv head)
    u32 smem;             // the 1024 B aligned base
    int warpgroup;
    float acc_o[1][Kt::kDTiles][4];
    float s[1][Kt::kNTiles][4];        // scores of the next tile, then its P (floats)
    u32 p_frag[Kt::kPVSteps][4];       // 16-bit P of the tile being multiplied (wgmma A operand)
    u32 q_frag[Kt::kQKSteps][4];       // Q, the A operand of every S product
    float alpha[1][2];                 // what O owes before the next P V
    OnlineSoftmax<1> softmax;

    __device__ __forceinline__ HopperMainloop(const Mask& mask_, const Params& p, u32 smem_, int, int head,
                                              int batch, int tid)
        : mask(mask_), params(p), smem(smem_) {
        const int kv_head = head / (p.heads / p.kv_heads);   // GQA / MQA
        k_gmem = gmma::slice_bytes<Element>(p.k, batch * p.k_batch_stride, kv_head * p.k_head_stride);
        v_gmem = gmma::slice_bytes<Element>(p.v, batch * p.v_batch_stride, kv_head * p.v_head_stride);
        warpgroup = tid / gmma::kWarpgroupThreads;
        zero_fragments(acc_o);
        softmax.init();
    }

    __device__ __forceinline__ u32 k_stage(int stage) const { return smem + Kt::kKOffset + stage * Kt::kKStageBytes; }
    // The V tile takes the traits' Vt region (the same bytes: kHeadDim x kBlockN elements).
    __device__ __forceinline__ u32 v_stage(int stage) const { return smem + Kt::kVtOffset + stage * Kt::kVtStageBytes; }

    // K_j and V_j into a stage (one cp.async group); keys past seqlen_k are zero-filled (their P is 0,
    // and 0 * 0 keeps O finite).
    __device__ __forceinline__ void load_kv_async(int stage, int n_block, int tid) const {
        const int n0 = n_block * kBN;
        const index_t k_row_bytes = params.k_row_stride * Kt::kElemBytes;
        const index_t v_row_bytes = params.v_row_stride * Kt::kElemBytes;
        KTile::template load_async<Kt::kThreads>(k_stage(stage), k_gmem + n0 * k_row_bytes, k_row_bytes,
                                                 params.seqlen_k - n0, tid);
        KTile::template load_async<Kt::kThreads>(v_stage(stage), v_gmem + n0 * v_row_bytes, v_row_bytes,
                                                 params.seqlen_k - n0, tid);
        cp_async_commit();
    }

    // Q's A fragments from its swizzled tile: ldmatrix.x4 of k-step kk reads (rows 0-7 | 8-15 of the
    // warp) x (16 B chunks 2 kk | 2 kk + 1), lanes 8 j .. 8 j + 7 addressing matrix j's rows.
    __device__ __forceinline__ void q_resident(int tid) {
        const int lane = tid % kWarpSize;
        const int row = warpgroup * gmma::kWarpgroupRows + (tid / kWarpSize) % (gmma::kWarpgroupThreads / kWarpSize) *
                        Kt::kWarpRows + lane % kMmaM;
        constexpr int kStepChunks = gmma::kKBytes / kChunkBytes;
#pragma unroll
        for (int kk = 0; kk < Kt::kQKSteps; ++kk)
            ldsm_x4(q_frag[kk], smem + Kt::kQOffset + QTile::chunk_offset(row, kStepChunks * kk + lane / kMmaM));
    }

    __device__ __forceinline__ void prefetch_scales(int) {}   // no per-tile scales

    // Issue S = Q K^T for the tile in `stage` (asynchronous; the first k-step overwrites s).
    __device__ __forceinline__ void issue_scores(int stage) {
        gmma::fence();
#pragma unroll
        for (int kk = 0; kk < Kt::kQKSteps; ++kk)
            gmma::Mma<Element, kBN>::rs(s[0], q_frag[kk], KTile::desc(k_stage(stage), 0, kk * gmma::kKBytes), kk > 0);
        gmma::commit();
    }

    // Issue O += P V for the tile in `stage` (asynchronous; p_frag stays untouched until it completes).
    // k-step kk: keys 16 kk .. 16 kk + 15, rows of the V tile.
    __device__ __forceinline__ void issue_pv(int stage) {
        constexpr int kStepKeys = gmma::kKBytes / Kt::kElemBytes;
        gmma::fence();
#pragma unroll
        for (int kk = 0; kk < Kt::kPVSteps; ++kk)
            gmma::MmaBT<Element, Kt::kHeadDim>::rs(acc_o[0], p_frag[kk],
                                                   KTile::desc_mn_major(v_stage(stage), kk * kStepKeys), 1);
        gmma::commit();
    }

    // The softmax in two halves around the issue of the previous tile's P V (kSplitSoftmax): the
    // row maxima of the landed scores (with the quad shuffles: a basic-block split, at which ptxas
    // would wait for a wgmma in flight), then, under P V, the exponentials and sums.
    static constexpr bool kSplitSoftmax = true;
    template <bool kMasked>
    __device__ __forceinline__ void softmax_max(int n_block, int row0, int col_lane) {
        gmma::fence_registers(s[0]);
        if constexpr (kMasked) apply_mask(mask, s, row0, n_block * kBN + col_lane);
        softmax.update_max(s, alpha, params.softmax_scale_log2);
    }
    __device__ __forceinline__ void softmax_exp() { softmax.exponentiate(s, params.softmax_scale_log2); }

    template <bool kMasked>
    __device__ __forceinline__ void softmax_step(int n_block, int row0, int col_lane) {
        softmax_max<kMasked>(n_block, row0, col_lane);
        softmax_exp();
    }

    // After the previous P V completed: O *= alpha, and P (s) -> 16-bit A fragments.
    __device__ __forceinline__ void rescale_and_pack() {
        gmma::fence_registers(acc_o[0]);
        OnlineSoftmax<1>::rescale_if_owed(acc_o, alpha);
#pragma unroll
        for (int kk = 0; kk < Kt::kPVSteps; ++kk) pack_a_fragment<Element>(p_frag[kk], s[0], kk);
    }

    // O /= l, LSE.
    __device__ __forceinline__ void finalize(float (&lse)[1][2]) {
        softmax.finalize(acc_o, params.softmax_scale_log2, lse);
    }
};

}  // namespace flashkit
