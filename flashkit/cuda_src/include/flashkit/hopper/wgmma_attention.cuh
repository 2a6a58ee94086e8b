// The Hopper wgmma forward without warp specialization (hopper.cu, bf16 / f16; the teaching kernel beside the
// warp-specialized core of ws_forward.cuh): the tile traits and the pipeline of one query block, which drives a
// main-loop type supplying the products and the softmax (wgmma_mainloop.cuh).
//
// One CTA: kBlockM = 64 x (warpgroups) query rows of one (head, batch); warpgroup w owns rows
// [64 w, 64 w + 64), warp 4 w + i of it rows [16 i, 16 i + 16) of those -- the same per-warp rows
// as the mma.sync kernels (kWarpRows = 16), so apply_mask, the softmax and store_output serve
// unchanged. Per visited K/V tile j:
//   S = Q K_j^T            wgmma, K_j from shared memory (K-major)
//   P = softmax step(S)    in registers; O owes a factor (alpha) before its next product
//   O += P V_j             wgmma, P from registers (A), V_j from shared memory (B): read MN-major
//                          from a tile in K's layout, held in the "Vt" region (kHeadDim x kBlockN
//                          elements; e4m3 would read V^T there, as fa3_fp8.cu does on the core).
// Shared memory: [ Q | K stages | V stages ] (kStages = 3), each 1024 B aligned. Pipeline, per
// visited tile i (FlashAttention-3's intra-warpgroup overlap):
//   barrier (tile i + 1 resident; every warpgroup done with tile i - 1)
//   cp.async tile i + 2 into the stage tile i - 1 used
//   issue S_{i+1} = Q K_{i+1}^T, then O += P_i V_i        (asynchronous, in that order)
//   the softmax of S_{i+1} runs while the tensor cores compute P_i V_i (Loop::kSplitSoftmax: the
//   row maxima first, P_i V_i issued after them, then the exponentials under it)
//   wait for P_i V_i; O *= alpha_{i+1}; P_{i+1} -> A fragments
// Masked and unmasked visits run in two copies of the step: a branch between the waits of S and
// of P V makes ptxas wait for both before the softmax.
// The last tile is peeled out of the loop: with the wgmma issue and wait sequence under a
// data-dependent branch ptxas serializes every wgmma (C7514). The Q region stages O at the end.
#pragma once

#include "flashkit/epilogue.cuh"
#include "flashkit/fragment.cuh"
#include "flashkit/hopper/wgmma.cuh"
#include "flashkit/mask.cuh"

namespace flashkit {
namespace gmma {

template <typename Element_, int kHeadDim_, int kBlockM_, int kBlockN_, int kWarps_, typename OutT_>
struct AttentionTraits {
    typedef Element_ Element;
    typedef OutT_ OutT;
    static constexpr int kElemBytes = static_cast<int>(sizeof(Element));
    static constexpr int kHeadDim = kHeadDim_;
    static constexpr int kBlockM = kBlockM_;
    static constexpr int kBlockN = kBlockN_;
    static constexpr int kWarps = kWarps_;
    static constexpr int kThreads = kWarps * kWarpSize;
    static constexpr int kWarpgroups = kThreads / kWarpgroupThreads;
    static constexpr int kWarpRows = kMmaM;                  // rows per warp
    static constexpr int kMTiles = 1;
    static constexpr int kNTiles = kBlockN / kMmaN;          // 8-key column tiles of S
    static constexpr int kDTiles = kHeadDim / kMmaN;         // 8-wide column tiles of O
    static constexpr int kRowBytes = kHeadDim * kElemBytes;  // a Q or K row
    static constexpr int kKeyBytes = kBlockN * kElemBytes;   // a Vt row (one head-dim column of V)
    static constexpr int kQKSteps = kRowBytes / kKBytes;
    static constexpr int kPVSteps = kKeyBytes / kKBytes;
    static constexpr int kStages = 3;
    // One warpgroup a CTA: two CTAs share an SM (<= 255 registers a thread) and drift apart, so
    // one's softmax overlaps the other's products.
    static constexpr int kCtasPerSm = kWarpgroups == 1 ? 2 : 1;

    typedef KMajorTile<kBlockM, kRowBytes> QTile;
    typedef KMajorTile<kBlockN, kRowBytes> KTile;
    typedef KMajorTile<kHeadDim, kKeyBytes> VtTile;   // rows: head dim; K: keys

    __host__ __device__ static constexpr int align(int bytes) {
        return (bytes + kTileAlign - 1) / kTileAlign * kTileAlign;
    }
    static constexpr int kQOffset = 0;
    static constexpr int kKOffset = align(QTile::kBytes);
    static constexpr int kKStageBytes = align(KTile::kBytes);
    static constexpr int kVtOffset = kKOffset + kStages * kKStageBytes;
    static constexpr int kVtStageBytes = align(VtTile::kBytes);
    static constexpr int kTileBytes = kVtOffset + kStages * kVtStageBytes;
    static constexpr int kOStageBytes = kBlockM * kHeadDim * static_cast<int>(sizeof(OutT));
    // Slack to round the dynamic shared memory base up to kTileAlign.
    static constexpr int kSmemBytes = (kTileBytes > kOStageBytes ? kTileBytes : kOStageBytes) + kTileAlign;

    static_assert(kThreads % kWarpgroupThreads == 0, "whole warpgroups");
    static_assert(kBlockM == kWarpgroups * kWarpgroupRows, "64 query rows per warpgroup");
    static_assert(kBlockN == 64 || kBlockN == 128, "K/V tiles of 64 or 128 keys");
    static_assert(kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256, "head dim 64, 128 or 256");
    static_assert(sizeof(OutT) == 2, "output: float16 or bfloat16");
};

// Row 0 of this (batch, head) slice of a contract tensor, as bytes.
template <typename Element>
__device__ __forceinline__ const u8* slice_bytes(const void* base, index_t batch_offset, index_t head_offset) {
    return reinterpret_cast<const u8*>(static_cast<const Element*>(base) + batch_offset + head_offset);
}

// Visit i + 1 of the pipeline: tile i + 1 resident, products S_{i+1} and P_i Vt_i in flight, the
// softmax of S_{i+1} under P_i Vt_i.
template <class Kt, bool kMasked, class Loop, class Mask>
__device__ __forceinline__ void pipeline_step(Loop& loop, const Mask& mask, int i, int n_blocks, int row0,
                                              int col_lane, int tid) {
    cp_async_wait<0>();   // tile i + 1 landed (the only group in flight)
    fence_proxy_async();
    __syncthreads();      // ... for every thread; every warpgroup is done with tile i - 1
    if (i + 2 < n_blocks) loop.load_kv_async((i + 2) % Kt::kStages, mask.kv_block(n_blocks - 3 - i), tid);
    loop.prefetch_scales(mask.kv_block(n_blocks - 2 - i));
    loop.issue_scores((i + 1) % Kt::kStages);
    if constexpr (Loop::kSplitSoftmax) {
        wait<0>();   // S_{i+1} landed
        loop.template softmax_max<kMasked>(mask.kv_block(n_blocks - 2 - i), row0, col_lane);
        loop.issue_pv(i % Kt::kStages);
        loop.softmax_exp();   // under P_i Vt_i
    } else {
        loop.issue_pv(i % Kt::kStages);
        wait<1>();   // S_{i+1} landed; P_i Vt_i still running
        loop.template softmax_step<kMasked>(mask.kv_block(n_blocks - 2 - i), row0, col_lane);
    }
    wait<0>();
    loop.rescale_and_pack();
}

// The whole forward of query block m_block of (head, batch), through the main loop `Loop`:
//   Loop(mask, params, smem, m0, head, batch, tid)
//   load_kv_async(stage, n_block, tid)    K_j and Vt_j into a stage, one cp.async group
//   q_resident(tid)                       Q has landed in shared memory (e.g. to take it into registers)
//   prefetch_scales(n_block)              per-tile scales, ahead of the wait that needs them
//   issue_scores(stage), issue_pv(stage)  the two asynchronous products (one commit each)
//   softmax_step<kMasked>(n_block, row0, col_lane), rescale_and_pack()
//   finalize(lse)                         O /= l (and any scale), LSE; acc_o is then O
template <class Kt, class Mask, class Loop>
__device__ __forceinline__ void fwd_block(const Params& p, const Mask& mask, int m_block, int head, int batch) {
    typedef typename Kt::OutT OutT;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const u32 smem = (smem_u32(smem_raw) + kTileAlign - 1) & ~static_cast<u32>(kTileAlign - 1);
    unsigned char* smem_ptr = smem_raw + (smem - smem_u32(smem_raw));
    const int tid = threadIdx.x;
    const int warp = tid / kWarpSize;
    const int lane = tid % kWarpSize;
    const int m0 = m_block * Kt::kBlockM;
    Loop loop(mask, p, smem, m0, head, batch, tid);

    const int n_blocks = mask.num_kv_blocks();
    const int n_masked = mask.num_masked_blocks();   // the first n_masked visited tiles
    if (n_blocks > 0) {
        const u8* q_gmem = slice_bytes<typename Kt::Element>(p.q, batch * p.q_batch_stride,
                                                              head * p.q_head_stride + m0 * p.q_row_stride);
        const int row0 = m0 + warp * Kt::kWarpRows + lane / kQuadLanes;
        const int col_lane = kFragCols * (lane % kQuadLanes);
        // Visit i is tile mask.kv_block(n_blocks - 1 - i), in stage i % kStages.
        Kt::QTile::template load_async<Kt::kThreads>(smem + Kt::kQOffset, q_gmem, p.q_row_stride * Kt::kElemBytes,
                                                     p.seqlen_q - m0, tid);
        loop.load_kv_async(0, mask.kv_block(n_blocks - 1), tid);   // Q and tile 0: one group
        if (n_blocks > 1) {
            loop.load_kv_async(1, mask.kv_block(n_blocks - 2), tid);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        fence_proxy_async();
        __syncthreads();
        loop.q_resident(tid);
        loop.prefetch_scales(mask.kv_block(n_blocks - 1));
        loop.issue_scores(0);
        wait<0>();
        if (n_masked > 0) loop.template softmax_step<true>(mask.kv_block(n_blocks - 1), row0, col_lane);
        else loop.template softmax_step<false>(mask.kv_block(n_blocks - 1), row0, col_lane);
        loop.rescale_and_pack();
        // Visits 1 .. n_masked - 1 need the element mask, the rest not: two copies of the step, so
        // that no branch sits between the wgmma wait of S and the one of P V (across a branch
        // ptxas waits for both before the softmax, and the overlap is lost).
        int i = 0;
        for (; i + 1 < n_blocks && i + 1 < n_masked; ++i)
            pipeline_step<Kt, true>(loop, mask, i, n_blocks, row0, col_lane, tid);
        for (; i + 1 < n_blocks; ++i) pipeline_step<Kt, false>(loop, mask, i, n_blocks, row0, col_lane, tid);
        loop.issue_pv((n_blocks - 1) % Kt::kStages);
        wait<0>();
        fence_registers(loop.acc_o[0]);
    }

    float lse[1][2];
    loop.finalize(lse);
    const int warp_row0 = m0 + warp * Kt::kWarpRows;
    OutT* o_gmem = static_cast<OutT*>(p.o) + batch * p.o_batch_stride + head * p.o_head_stride +
                   warp_row0 * p.o_row_stride;
    float* lse_gmem = p.lse == nullptr
                          ? nullptr
                          : p.lse + (static_cast<index_t>(batch) * p.heads + head) * p.seqlen_q + warp_row0;
    __syncthreads();   // O staging overwrites tiles other warps' products read
    OutT* smem_warp = reinterpret_cast<OutT*>(smem_ptr) + warp * Kt::kWarpRows * Kt::kHeadDim;
    store_output<EpilogueTraits<Kt>>(loop.acc_o, lse, smem_warp, o_gmem, p.o_row_stride, lse_gmem,
                                     p.seqlen_q - warp_row0, lane);
}

}  // namespace gmma
}  // namespace flashkit
