// One consumer warpgroup of the warp-specialized Hopper backward (FlashAttention-3's backward, with
// FlashAttention-2's algorithm 2): it owns kConsumerKeys = 64 keys of the CTA's key block (rows key0 ..)
// and keeps their dK, dV in fp32 registers over every visit. Per visit (query block of 64 queries, Q and
// dO in ring stage i), with lse2 = LSE log2(e) and dsum = rowsum(dO O) from the pre-pass (bwd_passes.cuh):
//   S^T  = K_c Q^T                          wgmma m64n64k16 ss, K rows key0.. and Q both K-major
//   dP^T = V_c dO^T                         the same, V and dO
//   P^T  = exp2(S^T scale log2(e) - lse2)   columns are queries; 0 where key > query + seqlen_k - seqlen_q
//                                           (causal, bottom-right aligned) on the tiles crossing it
//   dV  += P^T dO                           rs: P^T as 16-bit A fragments, dO read MN-major (as the
//                                           forward reads V: desc_mn_major)
//   dS^T = P^T (dP^T - dsum)                (P^T rounded to 16 bits once, reused here as fa2_bwd does)
//   dS^T -> the shared dS^T tile [key][query] (buffer i % 2); named barrier over every consumer
//   dQ[:, cols_c] = dS K[:, cols_c]         ss, both operands MN-major (MmaTT): A = dS^T tile read
//                                           transposed, B = the K tile, k = every key of the block;
//                                           consumer c takes head-dim columns [64 c, 64 c + 64) (hd128),
//                                           or at hd64 every column in its turn, visit i's consumer
//                                           i % kConsumers (Kt::kDqTurns; the others skip dQ)
//   dK  += dS^T Q                           ss: dS^T from its shared tile (the consumer's rows; rs from
//                                           registers at hd64: below), Q read
//                                           MN-major; issued after dQ, so that
//   dq_accum += dQ                          runs under it: the consumer's dQ to its shared fp32 panel in
//                                           dq_accum's order (Kt::DqLayout), then one bulk reduction
//                                           (cp.reduce.async.bulk) issued by the consumer's dQ writer warp
//                                           (hd128: Kt::kDqWriter, bwd_dq_writer.cuh; the consumer arrives
//                                           after dK's wait) or by its thread 0 (hd64); in key-block
//                                           order when p.bwd.deterministic (bwd_passes.cuh's semaphores)
// dK's dS^T: at hd128 from its shared tile (as fast as from registers within 1-3%, faster at hd128 causal 8k, and
// 16 registers fewer at the visit's peak, where hd128 causal spilled); at hd64 from the registers that stored it
// (Kt::ds_in_registers: its m64n64 products are bound by shared memory; 1.02-1.08x).
// At the end: dK *= scale; dK, dV (16-bit) staged in the K and V tiles, then stored in whole 16 B chunks for the
// consumer's keys < seqlen_k (bwd_consumer_base.cuh's store_dk_dv).
// Ordering of the dS^T buffers: a consumer writes buffer i % 2 in visit i after visit i - 1's barrier,
// which every consumer that reads its rows (itself at hd64, the other at hd128) passed only after its
// visit i - 2 products (the last reads of that buffer) completed (wgmma wait 0 precedes its next barrier
// arrival). Of the dQ panel: with a writer, the consumer waits on its dq_empty barrier before it writes the
// panel again (stage_dq); without, thread 0 waits until the previous visit's bulk reduction has read it
// (dq_panel_free) before the dS^T barrier, after which the consumer's threads write it again.
#pragma once

#include "flashkit/hopper/bwd_consumer_base.cuh"
#include "flashkit/hopper/timeline.cuh"

namespace flashkit {
namespace hopper {

template <class Kt, class Mask, class Mod>
struct BwdConsumer : BwdConsumerBase<Kt, Mask> {
    typedef BwdConsumerBase<Kt, Mask> Base;
    typedef typename Kt::Element Element;
    typedef typename Kt::QTile QTile;
    typedef typename Kt::KTile KTile;
    typedef typename Kt::DsTile DsTile;
    static constexpr int kD = Kt::kHeadDim;
    using Base::acc_dk;
    using Base::acc_dv;
    using Base::batch;
    using Base::col2;
    using Base::consumer;
    using Base::key0;
    using Base::p;
    using Base::warp_row;
    using Base::ws;

    __device__ __forceinline__ BwdConsumer(const Params& p_, int consumer_, int n_block_, int kv_head_, int batch_)
        : Base(p_, consumer_, n_block_, kv_head_, batch_) {}

    // Visit number `slot` of the CTA: query block m_block of `head`, Q and dO in ring stage slot % kStages,
    // dS^T in buffer slot % 2. One copy of the step serves masked and unmasked visits: the causal test is a
    // select against a limit that no key passes on visits below the diagonal (a branch between masked and
    // unmasked copies is divergent to ptxas, which then serializes the wgmma: C7519).
    __device__ __forceinline__ void visit(const BwdCta<Kt>& cta, int slot, const BwdVisit& at) {
        const int head = at.head, m_block = at.m_block;
        const int m0 = m_block * Kt::kBlockM;
        this->stage_keep(cta, slot, at.partial, head, m0);   // a mask_mod's element mask on a partial visit
        const index_t ws_row = ws.row0(p, batch, head) + m0;
        const u32 k_tile = cta.smem + Kt::kKOffset;
        const u32 q_tile = cta.q_tile(slot);
        const u32 do_tile = cta.do_tile(slot);
        const u32 ds_tile = cta.ds_tile(slot);
        const int k_row0 = this->s_key_row0();   // the consumer's rows of the K and V tiles

        // lse2: the stage's row where Kt::kStagedRows (hd128), read at the exponentials (read under the products, or
        // dsum staged too, NVRTC 13.0 spilled 20 B in hd96 causal builds); the unstaged builds read the workspace's
        // row under the products. dsum: from the workspace (its loads issue under the products; staged it measured 2-5%
        // slower).
        constexpr bool kHeld = Kt::template holds_slopes<Mod>();   // softcap's slopes, from the recompute to dS
        constexpr bool kStashed = Kt::template stashes_slopes<Mod>();   // the same through shared memory
        static_assert(!kStashed || Kt::kSlopeBytes > 0, "the stash is sized for the build's modification");
        float2 lse2_early[Kt::kQTiles];
        if constexpr (!Kt::kStagedRows) {
#pragma unroll
            for (int ni = 0; ni < Kt::kQTiles; ++ni) lse2_early[ni] = this->query_pair(ws.lse2 + ws_row, ni);
        }
        float s[Kt::kQTiles][4];    // S^T, then P^T: rows warp_row (+ 8), queries 8 ni + col2 (+ 1)
        float dp[Kt::kQTiles][4];   // dP^T
        timeline_stamp(slot, kBwdVisitStart);
        this->issue_scores(cta, slot, s, dp);
        timeline_stamp(slot, kBwdIssued);

        gmma::wait<1>();   // S^T landed; dP^T still running
        timeline_stamp(slot, kBwdScoresIn);
        gmma::fence_registers(s);
        const Mod mod(p, head, batch);
        u32 slope[kHeld || kStashed ? Kt::kQTiles : 1][2];   // d mod / ds of S^T's elements, f16 pairs (ds_pair's)
        if constexpr (kHeld || kStashed)
            this->modify_scores(mod, s, slope, m0);
        else
            this->modify_scores(mod, s, m0);
        if constexpr (kStashed) this->stash_slopes(cta, slope);
        const u32 keep = this->staged_keep(cta, slot, at.partial);   // a mask_mod's element mask
        const int over = this->causal_over(m0);
        const int diff = this->key_minus_query(m0);
        const u32 lse2_row = cta.lse2_row(slot);
#pragma unroll
        for (int ni = 0; ni < Kt::kQTiles; ++ni) {
            const float2 lse2 = Kt::kStagedRows ? this->query_pair(lse2_row, ni) : lse2_early[ni];
#pragma unroll
            for (int e = 0; e < 4; ++e)   // P^T, 0 above the causal diagonal, outside the window and the mask_mod
                s[ni][e] = this->keeps(keep, ni, e,
                                       this->visible_prob(s[ni][e], e % 2 ? lse2.y : lse2.x, over, diff,
                                                          (e / 2) * kFragRowHalf - (ni * kMmaN + e % 2)));
        }
        u32 pt[Kt::kQSteps][4];   // P^T as 16-bit A fragments: pt[kk][2 j + h] = rows + 8 h, column tile 2 kk + j
#pragma unroll
        for (int kk = 0; kk < Kt::kQSteps; ++kk) pack_a_fragment<Element, SaturateFinite>(pt[kk], s, kk);
        if constexpr (kStashed) gmma::fence_registers(pt);   // (without it: 24 B spilled beside a window)
        gmma::fence();
#pragma unroll
        for (int kk = 0; kk < Kt::kQSteps; ++kk)   // dV += P^T dO (queries 16 kk.. are k, dO read MN-major)
            gmma::MmaBT<Element, Kt::kHeadDimV>::rs(acc_dv, pt[kk],
                                                    Kt::DoTile::desc_mn_major(do_tile, kk * Kt::kStepElems), 1);
        gmma::commit();
        timeline_stamp(slot, kBwdDvIssued);

        gmma::wait<1>();   // dP^T landed; dV still running
        timeline_stamp(slot, kBwdDpIn);
        gmma::fence_registers(dp);
        const float* dsum = ws.dsum + ws_row;
        constexpr bool kDsInRegisters = Kt::template ds_in_registers<Mod>();
        u32 ds[kDsInRegisters ? Kt::kQSteps : 1][4];   // dS^T as dK's A fragments (pt's layout), kDsInRegisters
#pragma unroll
        for (int kk = 0; kk < Kt::kQSteps; ++kk) {
            u32 stashed[4];   // kStashed: this k-step's slopes, back from the stash
            if constexpr (kStashed) ld_shared_v4(this->slope_stash(cta, kk), stashed);
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const int ni = 2 * kk + j;
                const float2 d = this->query_pair(dsum, ni);
#pragma unroll
                for (int h = 0; h < 2; ++h) {   // dS^T = P^T (dP^T - dsum), to the shared dS^T tile
                    const u32 slope_pair = kHeld ? slope[kHeld ? ni : 0][h] : kStashed ? stashed[2 * j + h] : 0u;
                    const u32 pair =
                        this->template ds_pair<Mod>(pt[kk][2 * j + h], dp[ni][2 * h], dp[ni][2 * h + 1], d, slope_pair);
                    st_shared_b32(this->pair_address(ds_tile, k_row0 + warp_row, ni, h), pair);
                    if constexpr (kDsInRegisters) ds[kk][2 * j + h] = pair;
                }
            }
        }

        gmma::fence_proxy_async();   // the dS^T stores (generic proxy), before wgmma (async proxy) reads them
        timeline_stamp(slot, kBwdDsStored);
        this->dq_panel_free();
        named_sync(kBwdDsReadyBarrier, Kt::kConsumerThreads);   // dQ reads every consumer's rows
        timeline_stamp(slot, kBwdDsShared);
        float dq[Kt::kDqTiles][4];   // dQ: rows 16 warp + g (+ 8), columns dq_col0 + 8 i + 2 t
        // This consumer's dQ this visit: every visit (hd128: its columns), or in its turn (hd64: Kt::kDqTurns). The
        // turn's two paths each issue and wait for their own products (one path with the dQ issue and its wait under
        // two tests of the turn made ptxas serialize every wgmma: C7514). With the dQ writer each path ends its visit
        // itself (ended after the paths meet, hd64 ran 3-8% slower at 2k causal); without it the paths meet first
        // (ending each, a score_mod functor's hd64 build had its wgmma serialized).
        if (!Kt::kDqTurns || slot % Kt::kConsumers == this->consumer) {
            issue_dq(dq, ds_tile, k_tile);
            // dK after dQ, so that dQ's adds run under it (measured 1-7% faster than dK before the barrier)
            issue_dk<kDsInRegisters, false>(ds, ds_tile, q_tile, k_row0);
            gmma::wait<1>();   // dV, dQ done; dK still running
            gmma::fence_registers(dq);
            this->stage_dq(cta, dq, slot);
            if constexpr (Kt::kDqWriter) {
                end_visit(cta, slot);
                // To the dQ writer after dK's wait, so that the panel's stores drain under dK before the fence (1-2%
                // faster at hd128 than before the wait)
                this->publish_dq(cta, dq, head, m_block, ws_row);
                return;
            }
            this->publish_dq(cta, dq, head, m_block, ws_row);
        } else {
            issue_dk<kDsInRegisters, true>(ds, ds_tile, q_tile, k_row0);
            if constexpr (Kt::kDqWriter) {
                end_visit(cta, slot);
                return;
            }
        }
        end_visit(cta, slot);
    }

    // After the visit's last products are issued: wait for them; then Q_i and dO_i are free, the dS^T buffer read.
    __device__ __forceinline__ void end_visit(const BwdCta<Kt>& cta, int slot) {
        gmma::wait<0>();
        gmma::fence_registers(acc_dv);
        gmma::fence_registers(acc_dk);
        cta.q_ring.release(slot);
        cta.do_ring.release(slot);
        timeline_stamp(slot, kBwdVisitDone);
    }

    // dQ = dS K over every key of the block (k), this consumer's columns; both read MN-major. Asynchronous (one
    // commit group).
    __device__ __forceinline__ void issue_dq(float (&dq)[Kt::kDqTiles][4], u32 ds_tile, u32 k_tile) const {
        const u32 k_cols = k_tile + dq_column_offset();
        gmma::fence();
#pragma unroll
        for (int kk = 0; kk < Kt::kDqKeySteps; ++kk) {
            const int key = kk * Kt::kStepElems;
            gmma::MmaTT<Element, Kt::kDqCols>::ss(dq, DsTile::desc_mn_major(ds_tile, key),
                                                   KTile::desc_mn_major(k_cols, key), kk > 0);
        }
        gmma::commit();
    }
    // dK += dS^T Q: dS^T from registers (ds, kInRegisters) or its tile (the consumer's rows), Q MN-major. One commit
    // group; kFence: the first products since the registers' last writes (right after issue_dq: none needed).
    template <bool kInRegisters, bool kFence, int kDsSteps>
    __device__ __forceinline__ void issue_dk(const u32 (&ds)[kDsSteps][4], u32 ds_tile, u32 q_tile, int k_row0) {
        if constexpr (kFence) gmma::fence();
#pragma unroll
        for (int kk = 0; kk < Kt::kQSteps; ++kk) {
            if constexpr (kInRegisters)
                gmma::MmaBT<Element, kD>::rs(acc_dk, ds[kk], QTile::desc_mn_major(q_tile, kk * Kt::kStepElems), 1);
            else
                gmma::MmaBT<Element, kD>::ss(acc_dk, DsTile::desc(ds_tile, k_row0, kk * gmma::kKBytes),
                                             QTile::desc_mn_major(q_tile, kk * Kt::kStepElems), 1);
        }
        gmma::commit();
    }

    // Byte offset of this consumer's first dQ column in the K tile: panel `consumer` when the consumers split
    // the columns (whole 128 B panels), column 0 when they take dQ by turns.
    __device__ __forceinline__ int dq_column_offset() const {
        return this->dq_col0() * Kt::kElemBytes / KTile::kPanelBytes * KTile::kPanelSize;
    }
};

}  // namespace hopper
}  // namespace flashkit
