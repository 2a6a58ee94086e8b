// The FP8 forward of one query block (fp8.cu): FlashAttention-2's loop with e4m3 operands.
//
// One CTA, kBlockM query rows of one (head, batch); warps split the rows. Per visited K/V tile j:
//   S = Q K_j^T                      mma.m16n8k32 e4m3, fp32 accumulation
//   x = S * q_scale(row) * k_scale(j) * softmax_scale * log2(e),  masked to -inf
//   {m, l}, P = 448 exp2(x - m)      OnlineSoftmax<E4m3P>; O *= alpha * v_scale(j-1) / v_scale(j)
//   Vt_j = transpose(V_j)            in shared memory, keys in the P V permutation (fp8.cuh)
//   O += e4m3(P) Vt_j                P packed to e4m3 in registers as the A operand
// O stays in units of the current tile's V scale; the epilogue multiplies by it and divides by
// l (which carries P's factor 448). Shared memory: [ Q | K | V | Vt ], the first
// kBlockM * kHeadDim * sizeof(OutT) bytes reused to stage O.
// Pipeline (cp.async, as fwd_mainloop.cuh): V_j streams in under S = Q K_j^T, K_{j+1} under the
// transpose, the softmax and O += P V_j.
#pragma once

#include "flashkit/epilogue.cuh"
#include "flashkit/mask.cuh"
#include "flashkit/sm80/fp8_mma.cuh"

namespace flashkit {
namespace fp8 {

template <int kHeadDim_, int kBlockM_, int kBlockN_, int kWarps_, typename OutT_>
struct Fp8Traits {
    typedef OutT_ OutT;
    static constexpr int kHeadDim = kHeadDim_;
    static constexpr int kBlockM = kBlockM_;
    static constexpr int kBlockN = kBlockN_;
    static constexpr int kWarps = kWarps_;
    static constexpr int kThreads = kWarps * kWarpSize;
    static constexpr int kWarpRows = kBlockM / kWarps;
    static constexpr int kMTiles = kWarpRows / kMmaM;
    static constexpr int kNTiles = kBlockN / kMmaN;
    static constexpr int kDTiles = kHeadDim / kMmaN;
    static constexpr int kQKSteps = kHeadDim / kMmaK8;
    static constexpr int kPVSteps = kBlockN / kMmaK8;

    static constexpr int kQBytes = kBlockM * kHeadDim;
    static constexpr int kKVBytes = kBlockN * kHeadDim;
    static constexpr int kOStageBytes = kBlockM * kHeadDim * static_cast<int>(sizeof(OutT));
    static constexpr int kTileBytes = kQBytes + 3 * kKVBytes;   // Q, K, V, Vt
    static constexpr int kSmemBytes = kTileBytes > kOStageBytes ? kTileBytes : kOStageBytes;

    static constexpr int kORegs = kWarpRows * kHeadDim / kWarpSize;
    static constexpr int kSRegs = kWarpRows * kBlockN / kWarpSize;
    static constexpr int kQRegs = kWarpRows * kHeadDim / (4 * kWarpSize);
#ifdef FLASHKIT_Q_IN_REGS
    static constexpr bool kQInRegs = FLASHKIT_Q_IN_REGS != 0;
#else
    static constexpr bool kQInRegs = kORegs + kSRegs + kQRegs <= kQInRegsBudget;
#endif

    static_assert(kBlockM % (kWarps * kMmaM) == 0, "each warp owns whole 16-row tiles");
    static_assert(kBlockN % kMmaK8 == 0 && kBlockN % 16 == 0, "P V k-steps of 32 keys");
    static_assert((kBlockN == 32 || kBlockN == 64) && kMinScaleBlock % kBlockN == 0,
                  "Vt rows of 32 or 64 B (fp8.cuh swizzle); a tile within one scale block");
    static_assert(kHeadDim % kMmaK8 == 0 && kHeadDim >= 64, "head dim: multiple of 32, >= 64");
    static_assert(sizeof(OutT) == 2, "output: float16 or bfloat16");
};

// Thread and block indices through volatile reads, so that the compiler re-reads them instead of
// holding them in registers across the main loop.
__device__ __forceinline__ int special_reg_tid_x() {
    int v;
    asm volatile("mov.u32 %0, %%tid.x;" : "=r"(v));
    return v;
}
__device__ __forceinline__ int special_reg_ctaid_x() {
    int v;
    asm volatile("mov.u32 %0, %%ctaid.x;" : "=r"(v));
    return v;
}
__device__ __forceinline__ int special_reg_ctaid_y() {
    int v;
    asm volatile("mov.u32 %0, %%ctaid.y;" : "=r"(v));
    return v;
}
__device__ __forceinline__ int special_reg_ctaid_z() {
    int v;
    asm volatile("mov.u32 %0, %%ctaid.z;" : "=r"(v));
    return v;
}

template <class Kt, class Mask>
struct Mainloop {
    static constexpr int kD = Kt::kHeadDim;
    static constexpr int kBN = Kt::kBlockN;
    static constexpr int kMTiles = Kt::kMTiles;

    const Mask& mask;
    const Params& params;   // strides, seqlen_k and scale_block_rows read from the parameter space
    const u8* k_gmem;   // row 0 of this (batch, kv head)
    const u8* v_gmem;
    int kv_scale0;          // this (batch, kv head)'s first scale block in k_scale / v_scale
    u32 sK, sV;                      // [ Q | K | V | Vt ] from the Q tile's shared address
    u32 q_lane, k_lane, vt_lane;     // this lane's ldmatrix row address (chunk 0, unswizzled)
    // This lane's swizzle key XOR its chunk offset within a k-step (lane / 16 for the A operand,
    // (lane / 8) % 2 for B): chunk 2 kk + hi lands at (2 kk) ^ (key ^ hi).
    int q_x, k_x, vt_x;

    u32 q_frag[kMTiles][Kt::kQKSteps][4];
    float acc_o[kMTiles][Kt::kDTiles][4];
    float row_scale[kMTiles][2];     // q_scale(row) * softmax_scale * log2(e)
    float v_scale_cur;               // the V scale O is currently expressed in
    Softmax<kMTiles> softmax;

    __device__ __forceinline__ Mainloop(const Mask& mask_, const Params& p, u8* smem_, int m0,
                                        int head, int batch, int tid_)
        : mask(mask_),
          params(p) {
        const int kv_head = head / (p.heads / p.kv_heads);   // GQA / MQA
        k_gmem = static_cast<const u8*>(p.k) + batch * p.k_batch_stride + kv_head * p.k_head_stride;
        v_gmem = static_cast<const u8*>(p.v) + batch * p.v_batch_stride + kv_head * p.v_head_stride;
        kv_scale0 = (batch * p.kv_heads + kv_head) * p.k_scale_blocks;
        const u32 sQ = smem_u32(smem_);
        sK = sQ + Kt::kQBytes;
        sV = sK + Kt::kKVBytes;
        const u32 sVt = sV + Kt::kKVBytes;
        const int warp = tid_ / kWarpSize;
        const int lane = tid_ % kWarpSize;
        const int hi16 = lane / 16;
        const int hi8 = (lane / 8) % 2;
        // Q (A): rows lane % 16 of the warp's tile. K and Vt (B): rows (lane / 16) * 8 + lane % 8.
        const int q_row = warp * Kt::kWarpRows + lane % 16;
        const int b_row = hi16 * kMmaN + lane % 8;
        q_lane = sQ + q_row * kD;
        k_lane = sK + b_row * kD;
        vt_lane = sVt + b_row * kBN;
        q_x = swizzle_key<kD>(q_row) ^ hi16;
        k_x = swizzle_key<kD>(b_row) ^ hi8;
        vt_x = swizzle_key<kBN>(b_row) ^ hi8;

        const float* q_scale = p.q_scale + (static_cast<index_t>(batch) * p.heads + head) * p.q_scale_blocks;
        const int row0 = m0 + warp * Kt::kWarpRows + lane / kQuadLanes;
#pragma unroll
        for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int row = min(row0 + mi * kMmaM + h * kFragRowHalf, p.seqlen_q - 1);
                row_scale[mi][h] = q_scale[row / p.scale_block_rows] * p.softmax_scale_log2;
            }
        zero_fragments(acc_o);
        v_scale_cur = 1.f;
        softmax.init();
    }

    // Shared address of this lane's 16 B chunk of k-step kk in its row (x = key ^ hi < 8): the
    // swizzle only permutes chunks within groups of 8, so the group offset is an immediate and
    // only 4 distinct (chunk % 8) ^ x values stay in registers, however long the row.
    __device__ __forceinline__ static u32 chunk_addr(u32 lane_row, int kk, int x) {
        constexpr int kGroup = kSwizzleRows;
        const int chunk = 2 * kk;
        return lane_row + (chunk / kGroup) * kGroup * kChunkBytes + (((chunk % kGroup) ^ x) * kChunkBytes);
    }

    __device__ __forceinline__ void q_fragment(u32 (&a)[4], int mi, int kk) const {
        if constexpr (Kt::kQInRegs) {
#pragma unroll
            for (int e = 0; e < 4; ++e) a[e] = q_frag[mi][kk][e];
        } else {
            ldsm_x4(a, chunk_addr(q_lane + mi * kMmaM * kD, kk, q_x));
        }
    }

    __device__ __forceinline__ void load_q_registers() {
#pragma unroll
        for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
            for (int kk = 0; kk < Kt::kQKSteps; ++kk)
                ldsm_x4(q_frag[mi][kk], chunk_addr(q_lane + mi * kMmaM * kD, kk, q_x));
    }

    // S = Q K^T (raw e4m3 products) for the resident K tile.
    __device__ __forceinline__ void gemm_qk(float (&s)[kMTiles][Kt::kNTiles][4]) const {
        zero_fragments(s);
#pragma unroll
        for (int kk = 0; kk < Kt::kQKSteps; ++kk) {
            u32 a[kMTiles][4];
#pragma unroll
            for (int mi = 0; mi < kMTiles; ++mi) q_fragment(a[mi], mi, kk);
            const u32 k_addr = chunk_addr(k_lane, kk, k_x);
#pragma unroll
            for (int np = 0; np < Kt::kNTiles / 2; ++np) {
                u32 b[4];   // b0, b1 of key tile 2 np, then of 2 np + 1
                ldsm_x4(b, k_addr + np * 2 * kMmaN * kD);
#pragma unroll
                for (int mi = 0; mi < kMTiles; ++mi) {
                    mma_16832(s[mi][2 * np], a[mi], b[0], b[1]);
                    mma_16832(s[mi][2 * np + 1], a[mi], b[2], b[3]);
                }
            }
        }
    }

    // O += e4m3(P) Vt, P packed per k-step by pack_p_fragment (fp8.cuh).
    __device__ __forceinline__ void gemm_pv(const float (&p)[kMTiles][Kt::kNTiles][4]) {
#pragma unroll
        for (int kk = 0; kk < Kt::kPVSteps; ++kk) {
            u32 a[kMTiles][4];
#pragma unroll
            for (int mi = 0; mi < kMTiles; ++mi) pack_p_fragment(a[mi], p[mi], kk);
            const u32 v_addr = chunk_addr(vt_lane, kk, vt_x);
#pragma unroll
            for (int dp = 0; dp < Kt::kDTiles / 2; ++dp) {
                u32 b[4];   // b0, b1 of O column tile 2 dp, then of 2 dp + 1
                ldsm_x4(b, v_addr + dp * 2 * kMmaN * kBN);
#pragma unroll
                for (int mi = 0; mi < kMTiles; ++mi) {
                    mma_16832(acc_o[mi][2 * dp], a[mi], b[0], b[1]);
                    mma_16832(acc_o[mi][2 * dp + 1], a[mi], b[2], b[3]);
                }
            }
        }
    }

    __device__ __forceinline__ void load_kv_async(u32 dst, const u8* gmem, index_t stride,
                                                  int n_block) const {
        const int n0 = n_block * kBN;
        load_rows_async<kBN, kD, Kt::kThreads, ByteTile<kD>>(dst, gmem + n0 * stride, stride, params.seqlen_k - n0,
                                                    special_reg_tid_x());
        cp_async_commit();
    }

    // One K/V tile: visiting index it; row0 / col_lane: this thread's absolute row g and 2t.
    template <bool kMasked>
    __device__ __forceinline__ void step(int it, int row0, int col_lane) {
        const int n_block = mask.kv_block(it);
        const int scale_block = n_block * kBN / params.scale_block_rows;   // one per tile (kMinScaleBlock)
        const float ks = params.k_scale[kv_scale0 + scale_block];
        const float vs = params.v_scale[kv_scale0 + scale_block];
        cp_async_wait<0>();
        __syncthreads();   // K_j resident; every warp is done reading Vt_{j-1}
        load_kv_async(sV, v_gmem, params.v_row_stride, n_block);
        float s[kMTiles][Kt::kNTiles][4];
        gemm_qk(s);   // S = Q K_j^T
        // x = S * q_scale * k_scale * softmax_scale * log2(e), before masking (the scale may be < 0).
#pragma unroll
        for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const float c = row_scale[mi][h] * ks;
#pragma unroll
                for (int ni = 0; ni < Kt::kNTiles; ++ni) {
                    s[mi][ni][2 * h] *= c;
                    s[mi][ni][2 * h + 1] *= c;
                }
            }
        if constexpr (kMasked) apply_mask(mask, s, row0, n_block * kBN + col_lane);
        cp_async_wait<0>();
        __syncthreads();   // V_j resident; every warp is done reading K_j
        if (it > 0) load_kv_async(sK, k_gmem, params.k_row_stride, mask.kv_block(it - 1));
        transpose_v_tile<kBN, kD, Kt::kThreads>(sV, sV + Kt::kKVBytes, special_reg_tid_x());
        softmax.update(s, acc_o, kScoresInLog2, v_scale_cur / vs);   // S -> P, O *= alpha, O in units of vs
        v_scale_cur = vs;
        __syncthreads();   // Vt_j complete
        gemm_pv(s);        // O += P V_j
    }
};

// The whole FP8 forward of query block m_block of (head, batch) (= blockIdx.x, .y, .z).
template <class Kt, class Mask>
__device__ __forceinline__ void fwd_block(const Params& p, const Mask& mask, int m_block, int head,
                                          int batch) {
    typedef typename Kt::OutT OutT;
    extern __shared__ __align__(128) unsigned char smem_raw[];
    const int tid = threadIdx.x;
    const int warp = tid / kWarpSize;
    const int lane = tid % kWarpSize;
    const int m0 = m_block * Kt::kBlockM;
    Mainloop<Kt, Mask> loop(mask, p, smem_raw, m0, head, batch, tid);

    const int n_blocks = mask.num_kv_blocks();
    const int n_masked = mask.num_masked_blocks();
    if (n_blocks > 0) {
        const u8* q_gmem = static_cast<const u8*>(p.q) + batch * p.q_batch_stride +
                           head * p.q_head_stride + m0 * p.q_row_stride;
        load_rows_async<Kt::kBlockM, Kt::kHeadDim, Kt::kThreads, ByteTile<Kt::kHeadDim>>(smem_u32(smem_raw), q_gmem,
                                                                     p.q_row_stride, p.seqlen_q - m0, tid);
        cp_async_commit();
        loop.load_kv_async(loop.sK, loop.k_gmem, p.k_row_stride, mask.kv_block(n_blocks - 1));
        if constexpr (Kt::kQInRegs) {
            cp_async_wait<1>();   // Q landed (K may still be in flight)
            __syncthreads();
            loop.load_q_registers();
        }
        const int row0 = m0 + warp * Kt::kWarpRows + lane / kQuadLanes;
        const int col_lane = kFragCols * (lane % kQuadLanes);
        int it = n_blocks - 1;
        loop.v_scale_cur = p.v_scale[loop.kv_scale0 + mask.kv_block(it) * Kt::kBlockN / p.scale_block_rows];
        for (; it >= n_blocks - n_masked; --it) loop.template step<true>(it, row0, col_lane);
        for (; it >= 0; --it) loop.template step<false>(it, row0, col_lane);
    }

    float lse[Kt::kMTiles][2];
    loop.softmax.finalize(loop.acc_o, kScoresInLog2, lse, loop.v_scale_cur);   // O *= v_scale / l
    // Indices re-read from special registers rather than kept live through the loop (at hd256
    // the O accumulators leave no register to spare).
    const int e_warp = special_reg_tid_x() / kWarpSize;
    const int e_head = special_reg_ctaid_y(), e_batch = special_reg_ctaid_z();
    const int warp_row0 = special_reg_ctaid_x() * Kt::kBlockM + e_warp * Kt::kWarpRows;
    OutT* o_gmem = static_cast<OutT*>(p.o) + e_batch * p.o_batch_stride + e_head * p.o_head_stride +
                   warp_row0 * p.o_row_stride;
    float* lse_gmem = p.lse == nullptr
                          ? nullptr
                          : p.lse + (static_cast<index_t>(e_batch) * p.heads + e_head) * p.seqlen_q + warp_row0;
    __syncthreads();   // O staging overwrites tiles other warps read
    OutT* smem_warp = reinterpret_cast<OutT*>(smem_raw) + e_warp * Kt::kWarpRows * Kt::kHeadDim;
    store_output<EpilogueTraits<Kt>>(loop.acc_o, lse, smem_warp, o_gmem, p.o_row_stride, lse_gmem,
                                     p.seqlen_q - warp_row0, special_reg_tid_x() % kWarpSize);
}

}  // namespace fp8
}  // namespace flashkit
