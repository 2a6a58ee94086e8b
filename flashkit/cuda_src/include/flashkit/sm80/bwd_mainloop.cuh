// The FlashAttention-2 backward of one key block (Dao, 2023, algorithm 2), mma.sync.m16n8k16.
//
// One CTA holds K_j, V_j (shared memory) and dK_j, dV_j (fp32 registers) and walks the query blocks
// i of every query head of its kv head's group (GQA / MQA: dK, dV summed over the group in registers).
// Per visited query block, with the pre-pass's lse2 = LSE log2(e) and dsum = rowsum(dO O):
//   S^T  = K_j Q_i^T                      warp w: its 16 keys x kBlockM queries
//   S^T  = mod(S^T), masked               softcap / ALiBi (score_mod.cuh), the window's or chunk's element
//                                         mask (bwd_mask.cuh) on the slices that cross its edges
//   P^T  = exp2(S^T scale log2(e) - lse2) recomputed, never stored; 0 above the causal diagonal
//   dV  += P^T dO_i                       P^T packed to 16 bits as the A operand
//   dP^T = V_j dO_i^T
//   dS^T = P^T (dP^T - dsum)              times d mod / ds (softcap: 1 - tanh^2, raw_score_grad)
//   dK  += dS^T Q_i                       (times scale at the end)
//   dQ_i += scale dS K_j                  dS^T through shared memory; fp32 atomics into dq_accum,
//                                         in key-block order when p.bwd.deterministic
// The tail rows of the last blocks need no element mask: Q, dO rows past seqlen_q are zero-filled
// with lse2 = +inf (P = 0), and K, V rows past seqlen_k are zero (their dK, dV rows are not stored,
// their dQ terms are dS * 0).
// With FLASHKIT_VARLEN a CTA runs a key block of one packed sequence (varlen.cuh's for_sequence over keys): the
// parameter block is the sequence's view (its lengths; causal bottom-right aligned per sequence), and every
// tensor row is offset by the sequence's origin (q_row0 / k_row0, ints) in the tensors' batch t_batch;
// `batch` (the sequence) indexes the workspace.
#pragma once

#include "flashkit/sm80/bwd_traits.cuh"
#include "flashkit/bwd_mask.cuh"
#include "flashkit/score_mod.cuh"
#include "flashkit/fragment.cuh"
#include "flashkit/sm80/ldsm_lane.cuh"
#include "flashkit/sm80/mma.cuh"
#include "flashkit/reduce.cuh"
#include "flashkit/tile.cuh"

namespace flashkit {

template <class Kt, class Mask, class Mod>
struct BwdMainloop {
    typedef typename Kt::Element Element;
    static constexpr int kD = Kt::kHeadDim;
    // The call's head dim is below the compiled class: loads zero-fill its columns past p.head_dim (so S, dP,
    // dK, dV and dQ see zeros there), and the stores leave them out.
    static constexpr bool kPadded = FLASHKIT_HEAD_DIM_PADDED != 0;
    static constexpr int kM = Kt::kBlockM;
    static constexpr int kN = Kt::kBlockN;

    static constexpr bool kCausal = Mask::kCausal;

    const Params& p;               // the sequence's view (varlen) or the call's parameter block
    const BwdWorkspace<kM, kD> ws;     // over the call's parameter block
    const Mask mask;
    BwdKeyRows key_rows;           // BwdLocal: the queries that see this thread's keys (rows g, g + 8)
    int batch, kv_head, n0, warp, lane;
    int t_batch, q_row0, k_row0;   // the sequence's row 0 in the tensors (SeqOrigin; varlen: re-read from
                                   // cu_seqlens where used inside the loop, varlen.cuh's reload_range)
    u32 sQ, sdO, sK, sV, sdS;   // shared addresses (Q, dO: buffer 0; buffer 1 follows)
    float* s_lse2;              // [2][kM]
    float* s_dsum;              // [2][kM]

    float acc_dk[Kt::kDTiles][4];   // dK rows of this warp's 16 keys, mma C layout
    float acc_dv[Kt::kDTiles][4];

    // call: the call's parameter block (the workspace's layout); p_: the sequence's view, or call itself.
    __device__ __forceinline__ BwdMainloop(const Params& p_, const Params& call, unsigned char* smem, int n_block,
                                           int kv_head_, int batch_, const SeqOrigin& origin)
        : p(p_), ws(call), mask(p_), batch(batch_), kv_head(kv_head_), n0(n_block * kN), t_batch(origin.batch),
          q_row0(origin.q_row), k_row0(origin.k_row) {
        warp = threadIdx.x / kWarpSize;
        lane = threadIdx.x % kWarpSize;
        if constexpr (Mask::kLocal) key_rows = mask.key_rows(n0 + warp * kMmaM + lane / kQuadLanes);
        sQ = smem_u32(smem);
        sdO = sQ + 2 * Kt::kQElems * Kt::kElemBytes;
        sK = sdO + 2 * Kt::kQElems * Kt::kElemBytes;
        sV = sK + Kt::kKVElems * Kt::kElemBytes;
        sdS = sV + Kt::kKVElems * Kt::kElemBytes;
        s_lse2 = reinterpret_cast<float*>(smem + (4 * Kt::kQElems + 2 * Kt::kKVElems + Kt::kDsElems) * Kt::kElemBytes);
        s_dsum = s_lse2 + 2 * kM;
#pragma unroll
        for (int nd = 0; nd < Kt::kDTiles; ++nd)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc_dk[nd][e] = acc_dv[nd][e] = 0.f;
    }

    __device__ __forceinline__ u32 q_buf(int buf) const { return sQ + buf * Kt::kQElems * Kt::kElemBytes; }
    __device__ __forceinline__ u32 do_buf(int buf) const { return sdO + buf * Kt::kQElems * Kt::kElemBytes; }

    // K_j, V_j: one commit group with the first query block's loads.
    __device__ __forceinline__ void load_kv_async() const {
        const Element* k = static_cast<const Element*>(p.k) + t_batch * p.k_batch_stride +
                           kv_head * p.k_head_stride + (k_row0 + n0) * p.k_row_stride;
        const Element* v = static_cast<const Element*>(p.v) + t_batch * p.v_batch_stride +
                           kv_head * p.v_head_stride + (k_row0 + n0) * p.v_row_stride;
        load_tile_async<kN, kD, Kt::kThreads, Element, kPadded>(sK, k, p.k_row_stride, p.seqlen_k - n0, threadIdx.x,
                                                                p.head_dim);
        load_tile_async<kN, kD, Kt::kThreads, Element, kPadded>(sV, v, p.v_row_stride, p.seqlen_k - n0, threadIdx.x,
                                                                p.head_dim);
    }

    // Q_i, dO_i, lse2_i, dsum_i of (head, m_block) into buffer buf, as one commit group.
    __device__ __forceinline__ void load_q_async(int head, int m_block, int buf) const {
        const int m0 = m_block * kM;
        int q_row = q_row0, seqlen_q = p.seqlen_q;
        if constexpr (FLASHKIT_VARLEN != 0) reload_range(p.varlen.cu_seqlens_q, batch, q_row, seqlen_q);
        const Element* q = static_cast<const Element*>(p.q) + t_batch * p.q_batch_stride + head * p.q_head_stride +
                           (q_row + m0) * p.q_row_stride;
        const Element* dout = static_cast<const Element*>(p.bwd.dout) + t_batch * p.bwd.do_batch_stride +
                              head * p.bwd.do_head_stride + (q_row + m0) * p.bwd.do_row_stride;
        // A padded call clips the loads at its head dim; that and the thread index go through volatile moves,
        // so the clip is formed here rather than held across the loop (at the register limit ptxas spilled
        // 4 B in the sm_80 float16 causal build of the 128 class without them).
        int cols = kD, tid = threadIdx.x;
        if constexpr (kPadded) {
            asm volatile("mov.b32 %0, %1;\n" : "=r"(cols) : "r"(p.head_dim));
            asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(tid));
        }
        load_tile_async<kM, kD, Kt::kThreads, Element, kPadded>(q_buf(buf), q, p.q_row_stride, seqlen_q - m0, tid,
                                                                cols);
        load_tile_async<kM, kD, Kt::kThreads, Element, kPadded>(do_buf(buf), dout, p.bwd.do_row_stride,
                                                                seqlen_q - m0, tid, cols);
        // lse2 and dsum are padded to whole blocks: 2 x kM floats, 16 B a lane of the first warp.
        constexpr int kChunks = kM * 4 / kChunkBytes;
        const int t = threadIdx.x;
        if (t < 2 * kChunks) {
            const float* src = (t < kChunks ? ws.lse2 : ws.dsum) + ws.row0(p, batch, head) + m0 + (t % kChunks) * 4;
            float* dst = (t < kChunks ? s_lse2 : s_dsum) + buf * kM + (t % kChunks) * 4;
            cp_async_16(smem_u32(dst), src, true);
        }
        cp_async_commit();
    }

    // C = A_w B^T over the head dim: A the warp's 16 rows of a [key][d] tile (K or V), B a [query][d]
    // tile (Q or dO), queries q0 .. q0 + kSubM - 1: S^T = K Q^T, dP^T = V dO^T. c[ni]: queries q0 + 8 ni + 0..7.
    __device__ __forceinline__ void gemm_rows_by_queries(float (&c)[Kt::kMCols][4], u32 sA, u32 sB, int q0) const {
        const LdsmLane<kD> la = ldsm_rows16<kD>(lane);
        const LdsmLane<kD> lb = ldsm_rows8x2<kD>(lane);
#pragma unroll
        for (int ni = 0; ni < Kt::kMCols; ++ni)
#pragma unroll
            for (int e = 0; e < 4; ++e) c[ni][e] = 0.f;
#pragma unroll
        for (int kk = 0; kk < Kt::kDSteps; ++kk) {
            u32 a[4];
            ldsm_x4(a, la.addr(sA, warp * kMmaM, kk));
#pragma unroll
            for (int np = 0; np < Kt::kMCols / 2; ++np) {
                u32 b[4];   // b0, b1 of query tile 2 np, then of 2 np + 1
                ldsm_x4(b, lb.addr(sB, q0 + np * 2 * kMmaN, kk));
                mma_16816<Element>(c[2 * np], a, b[0], b[1]);
                mma_16816<Element>(c[2 * np + 1], a, b[2], b[3]);
            }
        }
    }

    // acc += X B over the queries 16 kk .. 16 kk + 15: X the warp's 16 keys x 16 queries as a 16-bit A
    // fragment, B a [query][d] tile read transposed: dV += P^T dO, dK += dS^T Q.
    __device__ __forceinline__ void mma_keys_by_d(float (&acc)[Kt::kDTiles][4], const u32 (&a)[4], u32 sB,
                                                  int kk) const {
        const LdsmLane<kD> lb = ldsm_rows16<kD>(lane);
#pragma unroll
        for (int dp = 0; dp < Kt::kDTiles / 2; ++dp) {
            u32 b[4];   // b0, b1 of d tile 2 dp, then of 2 dp + 1
            ldsm_x4_trans(b, lb.addr(sB, kk * kMmaK, dp));
            mma_16816<Element>(acc[2 * dp], a, b[0], b[1]);
            mma_16816<Element>(acc[2 * dp + 1], a, b[2], b[3]);
        }
    }

    // dQ_i += scale dS K_j: this warp's (kDqMTiles x 16) x (kDqDTiles x 8) part of the tile, then fp32
    // atomics into dq_accum (in key-block order when deterministic).
    __device__ __forceinline__ void accumulate_dq(int head, int m_block) const {
        const int wm = warp % Kt::kDqWarpsM;
        const int wd = warp / Kt::kDqWarpsM;
        const int d0 = wd * Kt::kDqDTiles * kMmaN;
        const LdsmLane<kM> la = ldsm_rows8x2<kM>(lane);   // dS from dS^T [key][query]: .trans A
        const LdsmLane<kD> lb = ldsm_rows16<kD>(lane);    // K [key][d]: .trans B
        float acc[Kt::kDqMTiles][Kt::kDqDTiles][4];
#pragma unroll
        for (int mt = 0; mt < Kt::kDqMTiles; ++mt)
#pragma unroll
            for (int nd = 0; nd < Kt::kDqDTiles; ++nd)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[mt][nd][e] = 0.f;
#pragma unroll
        for (int kk = 0; kk < Kt::kNSteps; ++kk) {
            u32 a[Kt::kDqMTiles][4];
#pragma unroll
            for (int mt = 0; mt < Kt::kDqMTiles; ++mt)
                ldsm_x4_trans(a[mt], la.addr(sdS, kk * kMmaK, mt * Kt::kDqWarpsM + wm));
#pragma unroll
            for (int dp = 0; dp < Kt::kDqDTiles / 2; ++dp) {
                u32 b[4];
                ldsm_x4_trans(b, lb.addr(sK, kk * kMmaK, wd * Kt::kDqDTiles / 2 + dp));
#pragma unroll
                for (int mt = 0; mt < Kt::kDqMTiles; ++mt) {
                    mma_16816<Element>(acc[mt][2 * dp], a[mt], b[0], b[1]);
                    mma_16816<Element>(acc[mt][2 * dp + 1], a[mt], b[2], b[3]);
                }
            }
        }
        const bool ordered = p.bwd.deterministic != 0;
        int* sema = ws.semaphore(p, batch, head, m_block);
        if (ordered) {   // wait for the key blocks before this one that visit m_block (bwd_mask.cuh's dq_turn)
            if (threadIdx.x == 0) wait_semaphore(sema, dq_turn<kM, kN>(mask, m_block, n0 / kN, head, batch));
            __syncthreads();
        }
        float* dq = ws.dq_accum + (ws.row0(p, batch, head) + m_block * kM) * kD;
#if FLASHKIT_BWD_DQ_FRAGMENTS   // fragment order (Kt::DqLayout, bwd_traits.cuh): one 16-byte reduction a tile
#pragma unroll
        for (int mt = 0; mt < Kt::kDqMTiles; ++mt)   // unscaled: bwd_convert_dq scales
#pragma unroll
            for (int nd = 0; nd < Kt::kDqDTiles; ++nd)
                red_add_v4(dq + Kt::DqLayout::fragment(d0 / kMmaN + nd, mt * Kt::kDqWarpsM + wm, lane),
                           acc[mt][nd][0], acc[mt][nd][1], acc[mt][nd][2], acc[mt][nd][3]);
#else
        const int g = lane / kQuadLanes;
        const int c2 = kFragCols * (lane % kQuadLanes);
#pragma unroll
        for (int mt = 0; mt < Kt::kDqMTiles; ++mt) {
            float* row = dq + ((mt * Kt::kDqWarpsM + wm) * kMmaM + g) * kD + d0 + c2;
#pragma unroll
            for (int nd = 0; nd < Kt::kDqDTiles; ++nd)   // rows (Kt::DqLayout); reduce.cuh: 16 bytes a reduction on sm_90
                red_add_fragment(row + nd * kMmaN, kD, lane, acc[mt][nd][0], acc[mt][nd][1], acc[mt][nd][2],
                                 acc[mt][nd][3], p.softmax_scale);
        }
#endif
        if (ordered) {
            __threadfence();
            __syncthreads();
            if (threadIdx.x == 0) atomicAdd(sema, 1);
        }
    }

    // Bottom-right alignment: key j is visible to query i iff j <= i + offset, offset = seqlen_k - seqlen_q (of
    // the sequence: varlen re-reads it from cu_seqlens rather than hold it live across the loop).
    __device__ __forceinline__ int causal_offset() const {
        if constexpr (FLASHKIT_VARLEN != 0 && kCausal) {
            int row0, seqlen_q, seqlen_k;
            reload_range(p.varlen.cu_seqlens_q, batch, row0, seqlen_q);
            reload_range(p.varlen.cu_seqlens_k, batch, row0, seqlen_k);
            return seqlen_k - seqlen_q;
        }
        return p.seqlen_k - p.seqlen_q;
    }

    // One query block of `head`: everything but the dQ product, which needs dS^T of every warp.
    __device__ __forceinline__ void step(int head, int m_block, int buf) {
        const Mod mod(p, head, batch);
#pragma unroll 1
        for (int q0 = 0; q0 < kM; q0 += Kt::kSubM) step_slice(mod, m_block, buf, q0);
    }

    // Queries q0 .. q0 + kSubM - 1 of the block.
    __device__ __forceinline__ void step_slice(const Mod& mod, int m_block, int buf, int q0) {
        const int m0 = m_block * kM;
        const int g = lane / kQuadLanes;
        const int c2 = kFragCols * (lane % kQuadLanes);
        const float* lse2 = s_lse2 + buf * kM + q0;
        const float* dsum = s_dsum + buf * kM + q0;
        const int key = n0 + warp * kMmaM + g;   // this thread's keys: key, key + 8
        const int query0 = m0 + q0 + c2;         // and queries query0 + 8 ni + (0, 1)

        float st[Kt::kMCols][4];   // S^T, then P^T: keys (rows g, g + 8) x queries
        gemm_rows_by_queries(st, sK, q_buf(buf), q0);
        apply_score_mod_transposed(mod, st, key, query0);
        if constexpr (Mask::kLocal) {   // the slice's queries not inside every key's interval: the element mask
            if (m0 + q0 < mask.query_begin(n0 + kN - 1) || m0 + q0 + Kt::kSubM > mask.query_end(n0))
                apply_key_mask(key_rows, st, query0);
        } else {
            const int offset = causal_offset();
            if (BwdCausal<kCausal>::crosses(offset, m0 + q0, n0, kN)) {
#pragma unroll
                for (int ni = 0; ni < Kt::kMCols; ++ni)
#pragma unroll
                    for (int e = 0; e < 4; ++e)
                        if (key + (e / 2) * kFragRowHalf > query0 + ni * kMmaN + e % 2 + offset)
                            st[ni][e] = FLASHKIT_NEG_INF;
            }
        }
#pragma unroll
        for (int ni = 0; ni < Kt::kMCols; ++ni) {   // P^T = exp2(S^T c - lse2)
            const float2 l = *reinterpret_cast<const float2*>(lse2 + ni * kMmaN + c2);
#pragma unroll
            for (int e = 0; e < 4; ++e)
                st[ni][e] = fast_exp2(fmaf(st[ni][e], p.softmax_scale_log2, -(e % 2 ? l.y : l.x)));
        }
        // P^T rounded to 16 bits once, as the A fragments of dV += P^T dO (and read back for dS):
        // pt[kk][2 (ni % 2) + h] holds rows g + 8 h, queries 8 ni + 2t, + 1 of column tile ni = 2 kk + ni % 2.
        u32 pt[Kt::kMSteps][4];
#pragma unroll
        for (int kk = 0; kk < Kt::kMSteps; ++kk) pack_a_fragment<Element>(pt[kk], st, kk);
#pragma unroll
        for (int kk = 0; kk < Kt::kMSteps; ++kk)   // dV += P^T dO
            mma_keys_by_d(acc_dv, pt[kk], do_buf(buf), q0 / kMmaK + kk);

        float dpt[Kt::kMCols][4];   // dP^T
        gemm_rows_by_queries(dpt, sV, do_buf(buf), q0);
        // Per 16 queries: dS^T = P^T (dP^T - dsum) as a 16-bit A fragment, to shared memory (for
        // dQ = dS K) and into dK += dS^T Q. ds[2 (ni % 2) + h]: rows g + 8 h, column tile ni.
#pragma unroll
        for (int kk = 0; kk < Kt::kMSteps; ++kk) {
            u32 ds[4];
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const int ni = 2 * kk + j;
                const float2 d = *reinterpret_cast<const float2*>(dsum + ni * kMmaN + c2);
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    float p0, p1;
                    unpack_float2<Element>(pt[kk][2 * j + h], p0, p1);
                    float ds0 = p0 * (dpt[ni][2 * h] - d.x), ds1 = p1 * (dpt[ni][2 * h + 1] - d.y);
                    if constexpr (!Mod::kUnitGrad) {   // dS of the raw score (softcap's 1 - tanh^2)
                        const float2 l = *reinterpret_cast<const float2*>(lse2 + ni * kMmaN + c2);
                        const int key_h = key + h * kFragRowHalf;
                        ds0 = raw_score_grad(mod, p, ds0, p0, l.x, query0 + ni * kMmaN, key_h);
                        ds1 = raw_score_grad(mod, p, ds1, p1, l.y, query0 + ni * kMmaN + 1, key_h);
                    }
                    ds[2 * j + h] = pack_float2<Element>(ds0, ds1);
                    const int row = warp * kMmaM + g + h * kFragRowHalf;
                    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(sdS + swizzle_offset<kM>(row, q0 + ni * kMmaN + c2) * 2),
                                 "r"(ds[2 * j + h]));
                }
            }
            mma_keys_by_d(acc_dk, ds, q_buf(buf), q0 / kMmaK + kk);   // dK += dS^T Q
        }
    }

    // dK = scale dK, dV: this warp's 16 rows, rows past seqlen_k and columns past head_dim not written.
    __device__ __forceinline__ void store_dk_dv() const {
        const int g = lane / kQuadLanes;
        const int c2 = kFragCols * (lane % kQuadLanes);
        int k_row = k_row0, seqlen_k = p.seqlen_k;
        if constexpr (FLASHKIT_VARLEN != 0) reload_range(p.varlen.cu_seqlens_k, batch, k_row, seqlen_k);   // not live
        Element* dk = static_cast<Element*>(p.bwd.dk) + t_batch * p.bwd.dk_batch_stride +
                      kv_head * p.bwd.dk_head_stride + static_cast<index_t>(k_row) * p.bwd.dk_row_stride;
        Element* dv = static_cast<Element*>(p.bwd.dv) + t_batch * p.bwd.dv_batch_stride +
                      kv_head * p.bwd.dv_head_stride + static_cast<index_t>(k_row) * p.bwd.dv_row_stride;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int key = n0 + warp * kMmaM + g + h * kFragRowHalf;
            if (key >= seqlen_k) continue;
#pragma unroll
            for (int nd = 0; nd < Kt::kDTiles; ++nd) {
                const int col = nd * kMmaN + c2;
                if (kPadded && nd * kMmaN >= p.head_dim) continue;   // zero columns past a padded call's head dim
                *reinterpret_cast<u32*>(dk + key * p.bwd.dk_row_stride + col) = pack_float2<Element>(
                    acc_dk[nd][2 * h] * p.softmax_scale, acc_dk[nd][2 * h + 1] * p.softmax_scale);
                *reinterpret_cast<u32*>(dv + key * p.bwd.dv_row_stride + col) =
                    pack_float2<Element>(acc_dv[nd][2 * h], acc_dv[nd][2 * h + 1]);
            }
        }
    }
};

// The whole backward of key block n_block of (kv_head, sequence `batch`); p: the sequence's view (varlen) or
// the call's parameter block, origin: where the sequence's rows lie. A sequence without queries visits no
// query block and stores dK = dV = 0.
template <class Kt, class Mask, class Mod>
__device__ __forceinline__ void bwd_block_seq(const Params& p, const Params& call, int n_block, int kv_head, int batch,
                                              const SeqOrigin& origin) {
    extern __shared__ __align__(128) unsigned char smem_raw[];
    BwdMainloop<Kt, Mask, Mod> loop(p, call, smem_raw, n_block, kv_head, batch, origin);
    const int group = p.heads / p.kv_heads;
    // The query blocks that see a key of the block (the sequence's, varlen), each head of the group.
    const int n0 = n_block * Kt::kBlockN;
    const int m_begin = loop.mask.m_begin(n0, Kt::kBlockM);
    // (Dense: the workspace's count, the same number, which ptxas keeps anyway: a second one spilled 8 B at hd128.)
    const int m_end = Mask::kLocal || FLASHKIT_VARLEN != 0
                          ? loop.mask.m_end(min(n0 + Kt::kBlockN, p.seqlen_k), Kt::kBlockM) : loop.ws.m_blocks;
    const int n_m = max(m_end - m_begin, 0);
    const int total = group * n_m;
    loop.load_kv_async();
    if (total > 0) loop.load_q_async(kv_head * group, m_begin, 0);
    else cp_async_commit();
    for (int it = 0; it < total; ++it) {
        const int head = kv_head * group + it / n_m;
        const int m_block = m_begin + it % n_m;
        const int buf = it & 1;
        cp_async_wait<0>();
        __syncthreads();   // Q_i, dO_i (and K, V) resident; every warp is done with buffer buf ^ 1 and dS^T
        if (it + 1 < total)
            loop.load_q_async(kv_head * group + (it + 1) / n_m, m_begin + (it + 1) % n_m, buf ^ 1);
        loop.step(head, m_block, buf);
        __syncthreads();   // dS^T complete
        loop.accumulate_dq(head, m_block);
    }
    loop.store_dk_dv();
}

// The main kernel's CTA of (key block, kv head, batch): with FLASHKIT_VARLEN of packed sequence `batch`,
// and nothing past the sequence's last key block.
template <class Kt, class Mask, class Mod>
__device__ __forceinline__ void bwd_block(const Params& params, int n_block, int kv_head, int batch) {
    for_sequence<FLASHKIT_VARLEN != 0, Kt::kBlockN, SeqRows::kKeys>(
        params, batch, n_block, [&](const Params& p, const SeqOrigin& origin) {
            bwd_block_seq<Kt, Mask, Mod>(p, params, n_block, kv_head, batch, origin);
        });
}

}  // namespace flashkit
