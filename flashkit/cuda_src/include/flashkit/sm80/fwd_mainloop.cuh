// The FlashAttention-2 forward of one query block, shared by fa2.cu and causal.cu.
//
// One CTA, kBlockM query rows of one (head, batch); warps split the rows (split-Q) and never
// exchange data. Per visited K/V tile j (visiting order and masking from the Mask type):
//   S = Q K_j^T                        mma.sync, K_j read with ldmatrix (swizzled smem)
//   S = score_mod(S)                   softcap / ALiBi (score_mod.cuh; NoScoreMod: nothing)
//   S = -inf where masked              only on the tiles the mask says cross a boundary
//   {m, l}, P = online softmax(S)      in registers (softmax.cuh), O *= alpha
//   O += P V_j                         P packed to 16 bits in registers as the A operand
// Pipeline (cp.async, single K and V buffers, overlapped like flash-attn):
//   V_j streams in under S = Q K_j^T; K_{j+1} streams in under softmax and O += P V_j.
// Epilogue: O /= l, LSE, store (epilogue.cuh).
// Head dims: compiled for the class Kt::kHeadDim; with Kt::kHeadDimPadded the loads zero-fill the
// columns >= p.head_dim and the epilogue stores only those below it (traits.cuh). V and O have their
// own class Kt::kHeadDimV (<= Kt::kHeadDim; MLA's 192 / 128), padded to p.head_dim_v the same way:
// S = Q K^T runs over kHeadDim columns, O += P V and the epilogue over kHeadDimV.
#pragma once

#include "flashkit/epilogue.cuh"
#include "flashkit/mask.cuh"
#include "flashkit/score_mod.cuh"
#include "flashkit/sm80/mma.cuh"
#include "flashkit/softmax.cuh"
#include "flashkit/tile.cuh"
#include "flashkit/varlen.cuh"

namespace flashkit {

template <class Kt, class Mask, class ScoreMod = NoScoreMod>
struct FwdMainloop {
    typedef typename Kt::Element Element;
    static constexpr int kD = Kt::kHeadDim;
    static constexpr int kDV = Kt::kHeadDimV;
    static constexpr int kRowBytes = kD * Kt::kElemBytes;     // one Q / K smem tile row
    static constexpr int kVRowBytes = kDV * Kt::kElemBytes;   // one V smem tile row
    static constexpr int kMTiles = Kt::kMTiles;
    typedef typename LdsmColumnsOf<Kt::kRowChunks>::type Columns;
    typedef typename LdsmColumnsOf<Kt::kVRowChunks>::type VColumns;

    // Scalars stay in the kernel's parameter block (constant bank), not in registers: the
    // main loop runs at the 255-register limit.
    const Params& p;
    const Mask& mask;
    ScoreMod score_mod;
    int batch, kv_head;           // batch: of the K / V tensors (origin.batch)
    int k_row0;                   // the sequence's key 0 in them (varlen.cuh's SeqOrigin)
    u32 sK, sV;                   // K / V tiles (shared addresses)
    u32 q_lane, k_lane, v_lane;   // this lane's ldmatrix row address in the Q / K / V tiles
    Columns cols_hi16;            // column table, 8-column half = lane / 16 (Q A, V B operands)
    Columns cols_hi8;             // column table, 8-column half = (lane / 8) % 2 (K B operand)
    VColumns cols_v;              // V's column table (V rows narrower than Q's), half = lane / 16

    u32 q_frag[kMTiles][Kt::kQKSteps][4];   // Q as A fragments (used when Kt::kQInRegs)
    float acc_o[kMTiles][Kt::kDTiles][4];   // O accumulator, mma C layout
    OnlineSoftmax<kMTiles> softmax;

    __device__ __forceinline__ FwdMainloop(const Mask& mask_, const Params& p_, u32 sQ, int head,
                                           int batch_, const SeqOrigin& origin, int tid)
        : p(p_),
          mask(mask_),
          score_mod(p_, head, batch_),
          batch(origin.batch),
          k_row0(origin.k_row),
          kv_head(head / (p_.heads / p_.kv_heads)),   // GQA / MQA
          cols_hi16(tid % kWarpSize, (tid % kWarpSize) / 16),
          cols_hi8(tid % kWarpSize, (tid % kWarpSize) / 8 % 2),
          cols_v(tid % kWarpSize, (tid % kWarpSize) / 16) {
        sK = sQ + Kt::kQElems * Kt::kElemBytes;
        sV = sK + Kt::kKElems * Kt::kElemBytes;
        const int warp = tid / kWarpSize;
        const int lane = tid % kWarpSize;
        const int r8 = lane % 8;   // row within an 8x8 matrix of ldmatrix
        // Q (A operand): matrices (rows 0-7 | 8-15) x (cols 0-7 | 8-15); lanes 16+ take cols 8+.
        q_lane = sQ + (warp * Kt::kWarpRows + lane % 16) * kRowBytes;
        // K (B operand of Q K^T): lanes 16+ address the second 8-key tile, lanes 8-15 / 24-31
        // the second 8-column half (cols_hi8).
        k_lane = sK + ((lane / 16) * kMmaN + r8) * kRowBytes;
        // V (B operand of P V, .trans): lanes 8-15 / 24-31 address keys 8-15, lanes 16+ the
        // second 8-column half (cols_hi16).
        v_lane = sV + (((lane / 8) % 2) * kMmaN + r8) * kVRowBytes;
        zero_fragments(acc_o);
        softmax.init();
    }

    // Q A fragments of 16-row tile mi, k-step kk (from registers or shared memory).
    __device__ __forceinline__ void q_fragment(u32 (&a)[4], int mi, int kk) const {
        if constexpr (Kt::kQInRegs) {
#pragma unroll
            for (int e = 0; e < 4; ++e) a[e] = q_frag[mi][kk][e];
        } else {
            ldsm_x4(a, q_lane + mi * kMmaM * kRowBytes + cols_hi16.col(kk) * Kt::kElemBytes);
        }
    }

    __device__ __forceinline__ void load_q_registers() {
#pragma unroll
        for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
            for (int kk = 0; kk < Kt::kQKSteps; ++kk)
                ldsm_x4(q_frag[mi][kk],
                        q_lane + mi * kMmaM * kRowBytes + cols_hi16.col(kk) * Kt::kElemBytes);
    }

    // S = Q K^T for the resident K tile.
    __device__ __forceinline__ void gemm_qk(float (&s)[kMTiles][Kt::kNTiles][4]) const {
        zero_fragments(s);
#pragma unroll
        for (int kk = 0; kk < Kt::kQKSteps; ++kk) {
            u32 a[kMTiles][4];
#pragma unroll
            for (int mi = 0; mi < kMTiles; ++mi) q_fragment(a[mi], mi, kk);
#pragma unroll
            for (int np = 0; np < Kt::kNTiles / 2; ++np) {
                u32 b[4];   // b0, b1 of key tile 2 np, then of key tile 2 np + 1
                ldsm_x4(b, k_lane + np * 2 * kMmaN * kRowBytes +
                               cols_hi8.col(kk) * Kt::kElemBytes);
#pragma unroll
                for (int mi = 0; mi < kMTiles; ++mi) {
                    mma_16816<Element>(s[mi][2 * np], a[mi], b[0], b[1]);
                    mma_16816<Element>(s[mi][2 * np + 1], a[mi], b[2], b[3]);
                }
            }
        }
    }

    // O += P V for the resident V tile; P (fp32 C layout) is packed to 16-bit A fragments:
    // k-step kk covers keys 16 kk .. 16 kk + 15 = S column tiles 2 kk and 2 kk + 1.
    __device__ __forceinline__ void gemm_pv(const float (&p)[kMTiles][Kt::kNTiles][4]) {
#pragma unroll
        for (int kk = 0; kk < Kt::kPVSteps; ++kk) {
            u32 a[kMTiles][4];
#pragma unroll
            for (int mi = 0; mi < kMTiles; ++mi) pack_a_fragment<Element>(a[mi], p[mi], kk);
#pragma unroll
            for (int dp = 0; dp < Kt::kDTiles / 2; ++dp) {
                u32 b[4];   // b0, b1 of O column tile 2 dp, then of 2 dp + 1
                ldsm_x4_trans(b, v_lane + kk * kMmaK * kVRowBytes + v_col(dp) * Kt::kElemBytes);
#pragma unroll
                for (int mi = 0; mi < kMTiles; ++mi) {
                    mma_16816<Element>(acc_o[mi][2 * dp], a[mi], b[0], b[1]);
                    mma_16816<Element>(acc_o[mi][2 * dp + 1], a[mi], b[2], b[3]);
                }
            }
        }
    }

    // The call's columns of V and O: head_dim_v where v has a head dim of its own (traits.cuh).
    __device__ __forceinline__ int v_cols() const { return Kt::kOwnHeadDimV ? p.head_dim_v : p.head_dim; }

    // Column (elements) of V's 16-wide step dp: Q's table where the rows are as wide.
    __device__ __forceinline__ int v_col(int dp) const {
        if constexpr (Kt::kVRowChunks == Kt::kRowChunks) {
            return cols_hi16.col(dp);
        } else {
            return cols_v.col(dp);
        }
    }

    // Issue the cp.async of K (kIsV false) or V tile n_block into dst, as one commit group.
    template <bool kIsV>
    __device__ __forceinline__ void load_kv_async(u32 dst, int n_block) const {
        const int n0 = n_block * Kt::kBlockN;
        const Element* base = static_cast<const Element*>(kIsV ? p.v : p.k);
        const index_t batch_stride = kIsV ? p.v_batch_stride : p.k_batch_stride;
        const index_t head_stride = kIsV ? p.v_head_stride : p.k_head_stride;
        const index_t row_stride = kIsV ? p.v_row_stride : p.k_row_stride;
        const Element* gmem = base + batch * batch_stride + kv_head * head_stride + (k_row0 + n0) * row_stride;
        if constexpr (kIsV) {   // kBlockN x kHeadDimV
            load_tile_async<Kt::kBlockN, kDV, Kt::kThreads, Element, Kt::kHeadDimVPadded != 0>(
                dst, gmem, row_stride, p.seqlen_k - n0, threadIdx.x, v_cols());
        } else {                // kBlockN x kHeadDim
            load_tile_async<Kt::kBlockN, kD, Kt::kThreads, Element, Kt::kHeadDimPadded != 0>(
                dst, gmem, row_stride, p.seqlen_k - n0, threadIdx.x, p.head_dim);
        }
        cp_async_commit();
    }

    // One K/V tile: visiting index it; row0 / col_lane: this thread's absolute row g and 2t;
    // masked: apply the element mask (CTA-uniform).
    __device__ __forceinline__ void step(int it, int row0, int col_lane, bool masked) {
        const int n_block = mask.kv_block(it);
        cp_async_wait<0>();
        __syncthreads();   // K_j resident; every warp is done reading V_{j-1}
        load_kv_async<true>(sV, n_block);
        float s[kMTiles][Kt::kNTiles][4];
        gemm_qk(s);   // S = Q K_j^T
        apply_score_mod(score_mod, s, row0, n_block * Kt::kBlockN + col_lane);   // S = mod(S)
        if (masked) apply_mask(mask, s, row0, n_block * Kt::kBlockN + col_lane);
        cp_async_wait<0>();
        __syncthreads();   // V_j resident; every warp is done reading K_j
        if (it > 0) load_kv_async<false>(sK, mask.kv_block(it - 1));
        softmax.update(s, acc_o, p.softmax_scale_log2);   // S -> P, O *= alpha
        gemm_pv(s);                              // O += P V_j
    }
};

// The whole forward of query block m_block of (head, batch); origin: where the sequence's rows lie
// (varlen.cuh; dense: row 0 of `batch`).
template <class Kt, class Mask, class ScoreMod = NoScoreMod>
__device__ __forceinline__ void fwd_block(const Params& p, const Mask& mask, int m_block,
                                          int head, int batch, const SeqOrigin& origin) {
    typedef typename Kt::Element Element;
    typedef typename Kt::OutT OutT;
    extern __shared__ __align__(128) unsigned char smem_raw[];
    Element* smem_q = reinterpret_cast<Element*>(smem_raw);
    const u32 sQ = smem_u32(smem_q);

    const int tid = threadIdx.x;
    const int warp = tid / kWarpSize;
    const int lane = tid % kWarpSize;
    const int m0 = m_block * Kt::kBlockM;
    FwdMainloop<Kt, Mask, ScoreMod> loop(mask, p, sQ, head, batch, origin, tid);

    const int n_blocks = mask.num_kv_blocks();
    const int n_masked = mask.num_masked_blocks();
    if (n_blocks > 0) {
        const Element* q_gmem = static_cast<const Element*>(p.q) + origin.batch * p.q_batch_stride +
                                head * p.q_head_stride + (origin.q_row + m0) * p.q_row_stride;
        load_tile_async<Kt::kBlockM, Kt::kHeadDim, Kt::kThreads, Element, Kt::kHeadDimPadded != 0>(
            sQ, q_gmem, p.q_row_stride, p.seqlen_q - m0, tid, p.head_dim);
        cp_async_commit();
        loop.template load_kv_async<false>(loop.sK, mask.kv_block(n_blocks - 1));
        if constexpr (Kt::kQInRegs) {
            cp_async_wait<1>();   // Q landed (K may still be in flight)
            __syncthreads();
            loop.load_q_registers();
        }
        const int row0 = m0 + warp * Kt::kWarpRows + lane / kQuadLanes;
        const int col_lane = kFragCols * (lane % kQuadLanes);
        int it = n_blocks - 1;
        // The masked tiles are visited first, then the fully visible ones. One loop body with a
        // CTA-uniform branch: two specialised loop copies push ptxas past 255 registers.
        const int first_unmasked = n_blocks - n_masked - 1;
        for (; it >= 0; --it) loop.step(it, row0, col_lane, it > first_unmasked);
    }

    float lse[Kt::kMTiles][2];
    loop.softmax.finalize(loop.acc_o, p.softmax_scale_log2, lse);   // O /= l
    const int warp_row0 = m0 + warp * Kt::kWarpRows;
    OutT* o_gmem = static_cast<OutT*>(p.o) + origin.batch * p.o_batch_stride + head * p.o_head_stride +
                   (origin.q_row + warp_row0) * p.o_row_stride;
    float* lse_gmem = p.lse == nullptr
                          ? nullptr
                          : p.lse + origin.batch * p.lse_batch_stride + head * p.lse_head_stride +
                                origin.q_row + warp_row0;
    // The warp stages its kWarpRows x kHeadDimV slice of O inside its own rows of the Q tile.
    OutT* smem_warp = reinterpret_cast<OutT*>(smem_raw) + warp * Kt::kWarpRows * Kt::kHeadDim;
    store_output<EpilogueTraits<Kt, Kt::kHeadDimV>, Kt::kHeadDimVPadded != 0>(
        loop.acc_o, lse, smem_warp, o_gmem, p.o_row_stride, lse_gmem, p.seqlen_q - warp_row0, lane, loop.v_cols());
}

// A kernel's query block m_block of (head, batch): of batch `batch`, or with FLASHKIT_VARLEN of packed
// sequence `batch` (varlen.cuh), under the variant's Mask.
template <class Kt, class Mask, class ScoreMod = NoScoreMod>
__device__ __forceinline__ void fwd_query_block(const Params& params, int m_block, int head, int batch) {
    for_sequence<FLASHKIT_VARLEN != 0, Kt::kBlockM>(params, batch, m_block,
                                                    [&](const Params& p, const SeqOrigin& origin) {
                                                        const Mask mask = make_mask<Mask>(p, m_block, head, batch);
                                                        fwd_block<Kt, Mask, ScoreMod>(p, mask, m_block, head, batch,
                                                                                      origin);
                                                    });
}

}  // namespace flashkit
