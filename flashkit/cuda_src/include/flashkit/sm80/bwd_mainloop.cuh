// The FlashAttention-2 backward of one key block (Dao, 2023, algorithm 2), mma.sync.m16n8k16.
//
// One CTA holds K_j, V_j (shared memory) and dK_j, dV_j (fp32 registers) and walks the query blocks
// i of every query head of its kv head's group (GQA / MQA: dK, dV summed over the group in registers; the walk:
// sm80/bwd_walk.cuh).
// Per visited query block, with the pre-pass's lse2 = LSE log2(e) and dsum = rowsum(dO O):
//   S^T  = K_j Q_i^T                      warp (kw, pw): kWarpKeys keys x kWarpQueries queries (bwd_traits.cuh)
//   S^T  = mod(S^T), masked               softcap / ALiBi (score_mod.cuh), the window's or chunk's element
//                                         mask (bwd_mask.cuh) on the slices that cross its edges
//   P^T  = exp2(S^T scale log2(e) - lse2) recomputed, never stored; 0 above the causal diagonal
//   dV  += P^T dO_i                       P^T rounded to 16 bits: the A operand in registers (hd64) or
//                                         through shared memory (hd128)
//   dP^T = V_j dO_i^T
//   dS^T = P^T (dP^T - dsum)              times d mod / ds (softcap's 1 - tanh^2, a functor's score_mod_grad),
//                                         taken at the recompute (kStashSlopes)
//   dK  += dS^T Q_i                       (times scale at the end)
//   dQ_i += scale dS K_j                  fp32 atomics into dq_accum, in key-block order when
//                                         p.bwd.deterministic
// Where a warp owns all of its keys' queries (kRegisterOperands, hd64) its own P^T and dS^T feed its dV and dK
// at once; otherwise dV and dK read them back from shared memory after the barrier that dQ = dS K (which needs
// every warp's dS^T) waits for anyway.
// The tail rows of the last blocks need no element mask: Q, dO rows past seqlen_q are zero-filled
// with lse2 = +inf (P = 0), and K, V rows past seqlen_k are zero (their dK, dV rows are not stored,
// their dQ terms are dS * 0, dS finite as P and dS pack saturated: numeric.cuh's SaturateFinite).
// With FLASHKIT_VARLEN a CTA runs a key block of one packed sequence (varlen.cuh's for_sequence over keys): the
// parameter block is the sequence's view (its lengths; causal bottom-right aligned per sequence), and every
// tensor row is offset by the sequence's origin (q_row0 / k_row0, ints) in the tensors' batch t_batch;
// `batch` (the sequence) indexes the workspace.
// The step and the element masks are here; the other members by concern: the tile loads (sm80/bwd_loads.cuh), the
// warp products (sm80/bwd_products.cuh), dQ (sm80/bwd_dq.cuh) and the dK, dV epilogue (sm80/bwd_epilogue.cuh).
#pragma once

#include "flashkit/sm80/bwd_traits.cuh"
#include "flashkit/bwd_mask.cuh"
#include "flashkit/functor.cuh"
#include "flashkit/score_mod.cuh"
#include "flashkit/fragment.cuh"
#include "flashkit/sm80/ldsm_lane.cuh"
#include "flashkit/sm80/mma.cuh"
#include "flashkit/tile.cuh"

namespace flashkit {

template <class Kt, class Mask, class Mod>
struct BwdMainloop {
    typedef typename Kt::Element Element;
    static constexpr int kD = Kt::kHeadDim;
    static constexpr int kDv = Kt::kHeadDimVTiles;   // V, dO, dV (v's class: MLA's 128 under 192)
    // The call's head dim is below the compiled class: loads zero-fill its columns past p.head_dim (so S, dP,
    // dK, dV and dQ see zeros there), and the stores leave them out.
    static constexpr bool kPadded = FLASHKIT_HEAD_DIM_PADDED != 0;
    // V and dO zero-filled past head_dim_v where it is below their tiles' class (bwd_passes.cuh's BwdVColumns; v's
    // class raised to q's: bwd_traits.cuh's kVRaised).
    static constexpr bool kVPadded = BwdVColumns::kPadded || Kt::kVRaised;
    static constexpr int kM = Kt::kBlockM;
    static constexpr int kN = Kt::kBlockN;

    static constexpr bool kCausal = Mask::kCausal;
    // Whether load_q_async may keep its addresses' loop invariants in registers (see sm80/bwd_loads.cuh).
    static constexpr bool kHeld = Kt::kRegisterOperands && !kPadded && !kVPadded;
    // A modification's slopes on dS (softcap's 1 - tanh^2, a functor's score_mod_grad) taken where S^T is recomputed
    // (score_mod.cuh's RecomputedSlopes), not read back from the 16-bit P (whose rounding makes them wrong beside a
    // small cap). Each thread stores its slope pairs (SlopeElement) where its dS^T pairs go in shared memory and reads
    // them back there: only the thread itself touches those words until the barrier after the step, and every warp
    // was done with the last visit's dS^T at the barrier before it. No shared memory and no registers over dP^T;
    // fewer instructions than the read-back (its log2 and lse2 re-read an element).
    static constexpr bool kStashSlopes = RecomputedSlopes<Mod>::value;
    static_assert(Mod::kUnitGrad || kStashSlopes, "a slope other than 1 comes from the recompute");

    const Params& p;               // the sequence's view (varlen) or the call's parameter block
    const BwdWorkspace<kM, kD> ws;     // over the call's parameter block
    const Mask mask;
    int batch, kv_head, n0, warp, lane;
    int t_batch, q_row0, k_row0;   // the sequence's row 0 in the tensors (SeqOrigin; varlen: re-read from
                                   // cu_seqlens where used inside the loop, varlen.cuh's reload_range)
    u32 sQ, sdO, sK, sV, sdS, sP;   // shared addresses (Q, dO: buffer 0; buffer 1 follows with two stages)
    float* s_lse2;              // [kQStages][kM]
    float* s_dsum;              // [kQStages][kM]

    // dK, dV of this warp's keys (rows key_row0() + 16 mi + g, + 8) x columns col0() + 8 nd + 2t, + 1: mma C layout
    float acc_dk[Kt::kKeyTiles][Kt::kColTiles][4];
    float acc_dv[Kt::kKeyTiles][Kt::kColTilesV][4];
    // V's A fragments of this warp's keys (Kt::kVInRegs: hold_v), k-step kk of key tile mi
    u32 v_frag[Kt::kVInRegs ? Kt::kKeyTiles : 1][Kt::kVInRegs ? Kt::kDvSteps : 1][4];

    // call: the call's parameter block (the workspace's layout); p_: the sequence's view, or call itself.
    __device__ __forceinline__ BwdMainloop(const Params& p_, const Params& call, unsigned char* smem, int n_block,
                                           int kv_head_, int batch_, const SeqOrigin& origin)
        : p(p_), ws(call), mask(p_), batch(batch_), kv_head(kv_head_), n0(n_block * kN), t_batch(origin.batch),
          q_row0(origin.q_row), k_row0(origin.k_row) {
        warp = threadIdx.x / kWarpSize;
        lane = threadIdx.x % kWarpSize;
        sQ = smem_u32(smem);
        sdO = sQ + Kt::kQStages * Kt::kQTileBytes;
        sK = sdO + Kt::kQStages * Kt::kDoTileBytes;
        // V in its own tile, or landing in Q's buffer where its fragments are held in registers (hold_v)
        sV = Kt::kVInRegs ? sQ : sK + Kt::kKVElems * Kt::kElemBytes;
        sdS = sQ + Kt::kDsOffset;
        sP = sdS + Kt::kDsElems * Kt::kElemBytes;   // (no such tile with register operands)
        s_lse2 = reinterpret_cast<float*>(smem + Kt::kTileBytes);
        s_dsum = s_lse2 + Kt::kQStages * kM;
        static_assert(Kt::kColTilesV <= Kt::kColTiles, "dV's columns at most dK's");
#pragma unroll
        for (int mi = 0; mi < Kt::kKeyTiles; ++mi)
#pragma unroll
            for (int nd = 0; nd < Kt::kColTiles; ++nd)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    if (nd < Kt::kColTilesV) acc_dv[mi][nd][e] = 0.f;
                    acc_dk[mi][nd][e] = 0.f;
                }
    }

    // This warp's place in the warp grid (bwd_traits.cuh): its first key of the block (S^T, dP^T, dK, dV), its
    // first query of the block (S^T, dP^T) and its first head-dim column (dK, dV).
    __device__ __forceinline__ int key_row0() const { return (warp % Kt::kKeyWarps) * Kt::kWarpKeys; }
    __device__ __forceinline__ int query_col0() const { return (warp / Kt::kKeyWarps) * Kt::kWarpQueries; }
    __device__ __forceinline__ int col0() const { return cols0<kD>(); }
    // The first column of the warp's part of a tile of kCols columns (dK's of K's, dV's of V's: kCols / kPartWarps a
    // warp).
    template <int kCols>
    __device__ __forceinline__ int cols0() const { return (warp / Kt::kKeyWarps) * (kCols / Kt::kPartWarps); }

    __device__ __forceinline__ u32 q_buf(int buf) const { return sQ + buf * Kt::kQTileBytes; }
    __device__ __forceinline__ u32 do_buf(int buf) const { return sdO + buf * Kt::kDoTileBytes; }

    // The tile loads (defined in sm80/bwd_loads.cuh): V's A fragments of this warp's keys into v_frag, held over the
    // walk (Kt::kVInRegs: V lands in Q's buffer; bwd_walk.cuh orders it between V's landing and the first visit's loads);
    __device__ __forceinline__ void hold_v();
    // K_j, V_j: one commit group with the first query block's loads (V alone first where it is held in registers);
    __device__ __forceinline__ void load_kv_async() const;
    // Q_i, dO_i, lse2_i, dsum_i of (head, m_block) into buffer buf, as one commit group.
    __device__ __forceinline__ void load_q_async(int head, int m_block, int buf) const;

    // The warp's products (defined in sm80/bwd_products.cuh):
    // C = A B^T over kCols columns, A's fragments by load_a (c: keys key_row0() + 16 mi + (g, g + 8) x queries
    // query_col0() + chunk_q + 8 ni + (2t, 2t + 1): chunk_q the chunk's first query, Kt::kQueryChunks), as
    template <int kCols, class LoadA>
    __device__ __forceinline__ void gemm_by_queries(float (&c)[Kt::kKeyTiles][Kt::kQueryTiles][4], const LoadA& load_a,
                                                    u32 sB, int chunk_q) const;
    // S^T = K Q^T over the head dim kCols = kD and dP^T = V dO^T over v's, kDv;
    template <int kCols>
    __device__ __forceinline__ void gemm_keys_by_queries(float (&c)[Kt::kKeyTiles][Kt::kQueryTiles][4], u32 sA,
                                                         u32 sB, int chunk_q) const;
    // dP^T = V dO^T with V's fragments held in registers (Kt::kVInRegs);
    __device__ __forceinline__ void gemm_held_v_by_queries(float (&c)[Kt::kKeyTiles][Kt::kQueryTiles][4],
                                                           u32 sB, int chunk_q) const;
    struct FragmentA {
        u32 r[4];
    };
    // acc += A B over queries 16 kk.. for the warp's columns, A a 16-key fragment in registers (P^T or dS^T), B of
    // kTiles column tiles a warp (dK's of Q, dV's of dO);
    template <int kTiles>
    __device__ __forceinline__ void mma_fragment_by_cols(float (&acc)[kTiles][4], const FragmentA& a, u32 sB,
                                                         int kk) const;
    // acc += X B over the block's queries for the warp's keys and columns, X a [key][query] tile (P^T or dS^T).
    template <int kTiles>
    __device__ __forceinline__ void mma_keys_by_cols(float (&acc)[Kt::kKeyTiles][kTiles][4], u32 sX, u32 sB) const;

    // dV += P^T dO_i, dK += dS^T Q_i (after the barrier that completes P^T and dS^T); with operands in registers
    // step() has added them.
    __device__ __forceinline__ void accumulate_dk_dv(int buf) {
        if constexpr (!Kt::kRegisterOperands) {
            mma_keys_by_cols(acc_dv, sP, do_buf(buf));
            mma_keys_by_cols(acc_dk, sdS, q_buf(buf));
        }
    }

    // dQ_i += scale dS K_j and its fp32 atomics into dq_accum (defined in sm80/bwd_dq.cuh).
    __device__ __forceinline__ void accumulate_dq(int head, int m_block) const;

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

#if FLASHKIT_MASK_MOD
    // A mask_mod's element mask of a partial visit (bwd_lists.cuh: its classifier found the tile partial), as one bit
    // an element of the thread's S^T: bit ((mi 2 + h) kQueryTiles + ni) 2 + c keeps key key + 16 mi + 8 h, query
    // query0 + 8 ni + c. Rows one at a time (not unrolled: one word of bits rather than a copy of mask_mod an
    // element), kMaskModUnroll columns at a time; indices clamped into the sequences (functor.cuh's contract).
    static constexpr int kRowBits = 2 * Kt::kQueryTiles;
    static_assert(Kt::kKeyTiles * 2 * kRowBits <= 32, "a thread's S^T elements fit one word of bits");
    __device__ __forceinline__ u32 keep_bits(int head, int key, int query0) const {
        u32 bits = 0;
#pragma unroll 1
        for (int r = 0; r < 2 * Kt::kKeyTiles; ++r) {   // r = 2 mi + h
            const int k = min(key + (r / 2) * kMmaM + (r % 2) * kFragRowHalf, p.seqlen_k - 1);
#pragma unroll kMaskModUnroll
            for (int c = 0; c < kRowBits; ++c) {
                const int q = min(query0 + (c / 2) * kMmaN + c % 2, p.seqlen_q - 1);
                bits |= static_cast<u32>(::mask_mod(batch, head, q, k, p.mods.args)) << (r * kRowBits + c);
            }
        }
        return bits;
    }
#endif

    // One query block of `head`, this warp's tile: dS^T (and P^T) into shared memory, for dQ (and dV, dK) after
    // the barrier that follows; with register operands dV and dK are added here. partial: a mask_mod's element mask
    // applies (a listed visit its classifier found partial). A warp's queries go by kQueryChunks chunks of
    // kWarpQueries (hd64's 128-query blocks: two of 64, one after the other, so that S^T, dP^T and P^T take the
    // registers of one; not unrolled, so the code is one chunk's).
    __device__ __forceinline__ void step(int head, int m_block, int buf, bool partial = false) {
#pragma unroll 1
        for (int qc = 0; qc < Kt::kQueryChunks; ++qc) step_queries(head, m_block, buf, partial, qc * Kt::kWarpQueries);
    }
    // The warp's kWarpQueries queries from column query_col0() + chunk_q of the block (the products add query_col0()
    // themselves: held as one value across the step, ptxas spent 89 moves a visit at hd256).
    __device__ __forceinline__ void step_queries(int head, int m_block, int buf, bool partial, int chunk_q) {
        const Mod mod(p, head, batch);
        const int g = lane / kQuadLanes;
        const int c2 = kFragCols * (lane % kQuadLanes);
        const int r0 = key_row0(), q0 = query_col0() + chunk_q;
        const int m0 = m_block * kM;
        const float* lse2 = s_lse2 + buf * kM + q0;
        const float* dsum = s_dsum + buf * kM + q0;
        const int key = n0 + r0 + g;      // this thread's keys: key + 16 mi + (0, 8)
        const int query0 = m0 + q0 + c2;  // and queries query0 + 8 ni + (0, 1)

        float st[Kt::kKeyTiles][Kt::kQueryTiles][4];   // S^T, then P^T
        gemm_keys_by_queries<kD>(st, sK, q_buf(buf), chunk_q);
#pragma unroll
        for (int mi = 0; mi < Kt::kKeyTiles; ++mi) {
            if constexpr (kStashSlopes) {   // each slope into dS^T's place, which dS takes from it (see below)
                u32 slope[Kt::kQueryTiles][2];
                apply_score_mod_transposed(mod, st[mi], slope, key + mi * kMmaM, query0);
                // lane_at below with the tile folded in (sdS starts a swizzle row, bwd_traits.cuh's kDsOffset, so
                // transposed_pair's XOR commutes with adding it): formed apart from lane_at, the softcap + ALiBi +
                // window build at hd64 spilled 24 B on sm_90, 8 B so.
                const u32 slope_at = sdS + transposed(0, r0 + g, q0 + c2);
#pragma unroll
                for (int ni = 0; ni < Kt::kQueryTiles; ++ni)
#pragma unroll
                    for (int h = 0; h < 2; ++h) store_pair(transposed_pair(slope_at, mi, h, ni), slope[ni][h]);
            } else {
                apply_score_mod_transposed(mod, st[mi], key + mi * kMmaM, query0);
            }
        }
        if constexpr (Mask::kLocal) {   // the tile's queries not inside every key's interval: the element mask
            if (m0 + q0 < mask.query_begin(n0 + r0 + Kt::kWarpKeys - 1) ||
                m0 + q0 + Kt::kWarpQueries > mask.query_end(n0 + r0)) {
#pragma unroll
                for (int mi = 0; mi < Kt::kKeyTiles; ++mi)
                    apply_key_mask(mask.key_rows(key + mi * kMmaM), st[mi], query0);
            }
        } else {
            const int offset = causal_offset();
            if (BwdCausal<kCausal>::crosses(offset, m0 + q0, n0 + r0, Kt::kWarpKeys))
                mask_where(st, [&](int mi, int ni, int e) {   // key above the query's diagonal
                    return key + mi * kMmaM + (e / 2) * kFragRowHalf > query0 + ni * kMmaN + e % 2 + offset;
                });
        }
#if FLASHKIT_MASK_MOD
        if (partial) {
            const u32 bits = keep_bits(head, key, query0);
            mask_where(st, [&](int mi, int ni, int e) {   // mask_mod's bit of the element clear
                return !((bits >> ((2 * mi + e / 2) * kRowBits + 2 * ni + e % 2)) & 1u);
            });
        }
#else
        (void)partial;
#endif
        // P^T = exp2(S^T c - lse2), rounded to 16 bits once: pt[mi][ni][h] holds keys key + 16 mi + 8 h, queries
        // query0 + 8 ni + (0, 1). With operands in registers it is dV += P^T dO's A fragment at once; otherwise it
        // goes to shared memory, and this thread reads it back for dS (held over dP^T it took 16 registers, and
        // ptxas spilled at hd128).
        u32 pt[Kt::kKeyTiles][Kt::kQueryTiles][2];
        const u32 lane_at = transposed(0, r0 + g, q0 + c2);   // (transposed_pair, at sP and sdS)
#pragma unroll
        for (int ni = 0; ni < Kt::kQueryTiles; ++ni) {
            const float2 l = *reinterpret_cast<const float2*>(lse2 + ni * kMmaN + c2);
#pragma unroll
            for (int mi = 0; mi < Kt::kKeyTiles; ++mi)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    pt[mi][ni][h] = pack_float2<Element, SaturateFinite>(
                        fast_exp2(fmaf(st[mi][ni][2 * h], p.softmax_scale_log2, -l.x)),
                        fast_exp2(fmaf(st[mi][ni][2 * h + 1], p.softmax_scale_log2, -l.y)));
                    if constexpr (!Kt::kRegisterOperands)
                        store_pair(sP + transposed_pair(lane_at, mi, h, ni), pt[mi][ni][h]);
                }
        }
        if constexpr (Kt::kRegisterOperands) {   // dV += P^T dO
#pragma unroll
            for (int kk = 0; kk < Kt::kChunkSteps; ++kk)
#pragma unroll
                for (int mi = 0; mi < Kt::kKeyTiles; ++mi)
                    mma_fragment_by_cols(acc_dv[mi], a_fragment(pt[mi], kk), do_buf(buf), q0 / kMmaK + kk);
        }

        float dpt[Kt::kKeyTiles][Kt::kQueryTiles][4];   // dP^T
        if constexpr (Kt::kVInRegs)
            gemm_held_v_by_queries(dpt, do_buf(buf), chunk_q);
        else
            gemm_keys_by_queries<kDv>(dpt, sV, do_buf(buf), chunk_q);
        // dS^T = P^T (dP^T - dsum) (times d mod / ds), 16 bits, to shared memory for dQ = dS K (and for
        // dK += dS^T Q, unless it takes its A fragments from registers), 16 queries at a time.
#pragma unroll
        for (int kq = 0; kq < Kt::kChunkSteps; ++kq) {
            u32 ds[Kt::kKeyTiles][2][2];   // as pt, column tiles 2 kq + j
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const int ni = 2 * kq + j;
                const float2 d = *reinterpret_cast<const float2*>(dsum + ni * kMmaN + c2);
#pragma unroll
                for (int mi = 0; mi < Kt::kKeyTiles; ++mi)
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const u32 at = transposed_pair(lane_at, mi, h, ni);
                        float p0, p1;
                        unpack_float2<Element>(Kt::kRegisterOperands ? pt[mi][ni][h] : load_pair(sP + at), p0, p1);
                        float ds0 = p0 * (dpt[mi][ni][2 * h] - d.x), ds1 = p1 * (dpt[mi][ni][2 * h + 1] - d.y);
                        if constexpr (kStashSlopes) {   // dS of the raw score: the slope from the recompute
                            float g0, g1;
                            unpack_float2<typename SlopeElement<Mod>::type>(load_pair(sdS + at), g0, g1);
                            ds0 *= g0;
                            ds1 *= g1;
                        }
                        ds[mi][j][h] = pack_float2<Element, SaturateFinite>(ds0, ds1);
                        store_pair(sdS + at, ds[mi][j][h]);
                    }
            }
            if constexpr (Kt::kRegisterOperands) {   // dK += dS^T Q
#pragma unroll
                for (int mi = 0; mi < Kt::kKeyTiles; ++mi)
                    mma_fragment_by_cols(acc_dk[mi], a_fragment(ds[mi], 0), q_buf(buf), q0 / kMmaK + kq);
            }
        }
    }

    // S^T = -inf at the thread's elements (key tile mi, query tile ni, C-fragment element e) where masked(mi, ni, e).
    template <class Masked>
    __device__ __forceinline__ static void mask_where(float (&st)[Kt::kKeyTiles][Kt::kQueryTiles][4],
                                                      const Masked& masked) {
#pragma unroll
        for (int mi = 0; mi < Kt::kKeyTiles; ++mi)
#pragma unroll
            for (int ni = 0; ni < Kt::kQueryTiles; ++ni)
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    if (masked(mi, ni, e)) st[mi][ni][e] = FLASHKIT_NEG_INF;
    }

    // The A fragment of k-step kk (query tiles 2 kk, 2 kk + 1) from 16-bit pairs x[ni][h] of one 16-key tile:
    // mma.m16n8k16's a0..a3 = (row g, tile 2 kk), (row g + 8, tile 2 kk), (row g, tile 2 kk + 1), (g + 8, 2 kk + 1).
    template <int kTiles>
    __device__ __forceinline__ static FragmentA a_fragment(const u32 (&x)[kTiles][2], int kk) {
        return FragmentA{{x[2 * kk][0], x[2 * kk][1], x[2 * kk + 1][0], x[2 * kk + 1][1]}};
    }

    // The shared address of (key row, query column col) in a swizzled [key][query] tile at `tile` (P^T, dS^T).
    __device__ __forceinline__ static u32 transposed(u32 tile, int row, int col) {
        return tile + swizzle_offset<kM>(row, col) * Kt::kElemBytes;
    }
    // This thread's elements of a [key][query] tile (P^T, dS^T) from one offset: lane_at = transposed(0, r0 + g,
    // q0 + c2) of its first, and the pair of key tile mi, row half h, query tile ni at
    //   (lane_at ^ ni kChunkBytes) + (16 mi + 8 h) kM kElemBytes      (bytes from the tile's start)
    // Every row of the thread has row % 8 = g (r0 is a multiple of 16), and query tile ni's chunk q0 / 8 + ni equals
    // (q0 / 8) ^ ni (q0 / 8 a multiple of kQueryTiles, a power of two above ni), so the swizzle's XOR with g commutes
    // with ni's: one XOR a query tile rather than the swizzle's arithmetic a pair.
    __device__ __forceinline__ static u32 transposed_pair(u32 lane_at, int mi, int h, int ni) {
        static_assert((Kt::kQueryTiles & (Kt::kQueryTiles - 1)) == 0 && Kt::kQueryTiles <= kSwizzleRows,
                      "query tiles: a power of two within one swizzle row");
        return (lane_at ^ static_cast<u32>(ni * kChunkBytes)) + (mi * kMmaM + h * kFragRowHalf) * kM * Kt::kElemBytes;
    }
    // A pair of 16-bit elements into P^T or dS^T, and back (the same thread's store: program order suffices). No
    // memory clobber: one would make the compiler reload lse2 and dsum after every store (3-4% at hd64).
    __device__ __forceinline__ static void store_pair(u32 addr, u32 pair) {
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(pair));
    }
    __device__ __forceinline__ static u32 load_pair(u32 addr) {
        u32 pair;
        asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(pair) : "r"(addr));
        return pair;
    }

    // dK = scale dK, dV: this warp's keys and columns (defined in sm80/bwd_epilogue.cuh).
    __device__ __forceinline__ void store_dk_dv() const;
};

}  // namespace flashkit
