// One consumer warpgroup of the warp-specialized Hopper backward split by head-dim columns (hd192, hd256, key
// blocks of 64: bwd_traits.cuh): both consumers own the block's 64 keys; consumer c keeps dK, dV of its share of
// the columns (cols_c: BwdShare<Kt, kC>; halves at hd256, hd192's panels unevenly, where kC is the consumer) in fp32
// registers and computes half the query block's S^T and dP^T, queries q0 = kSQueries c .. q0 + kSQueries. Per
// visit (query block of 64 queries, Q and dO in ring stage i):
//   S^T[:, q0..]  = K Q[q0.., :]^T           wgmma m64n32k16 ss, K (every key) and Q's rows q0.. K-major
//   dP^T[:, q0..] = V dO[q0.., :]^T          the same, V and dO
//   P^T = exp2(S^T scale log2(e) - lse2)     0 above the causal diagonal (bottom-right aligned), rounded to
//                                            16 bits -> the shared P^T tile [key][query] (buffer i % 2)
//   dS^T = P^T (dP^T - dsum)                 -> the shared dS^T tile, likewise; named barrier over both
//                                            consumers: both tiles whole
//   dQ[:, cols_c] = dS K[:, cols_c]          ss, both read MN-major (MmaTT), one N = 64 product a panel
//   dV[:, cols_c] += P^T dO[:, cols_c]       ss, P^T tile K-major, dO read MN-major (MmaBT)
//   dK[:, cols_c] += dS^T Q[:, cols_c]       the same, dS^T and Q
//   dq_accum += scale dQ                     under dV and dK (bwd_consumer_base.cuh's publish_dq)
// Ordering of the P^T and dS^T buffers: as bwd_consumer.cuh's dS^T (a consumer's visit ends with wgmma wait 0,
// before its next barrier arrival).
#pragma once

#include "flashkit/hopper/bwd_consumer_base.cuh"

namespace flashkit {
namespace hopper {

template <class Kt, class Mask, class Mod, int kC = kAnyConsumer>
struct BwdColumnConsumer : BwdConsumerBase<Kt, Mask, BwdShare<Kt, kC> > {
    typedef BwdConsumerBase<Kt, Mask, BwdShare<Kt, kC> > Base;
    typedef typename Base::Share Share;
    typedef typename Kt::Element Element;
    typedef typename Kt::QTile QTile;
    typedef typename Kt::KTile KTile;
    typedef typename Kt::DsTile DsTile;
    static constexpr int kQueryChunks = Kt::kSQueries / kMmaN;   // 16 B chunks of a consumer's P^T row half
    using Base::acc_dk;
    using Base::acc_dv;
    using Base::batch;
    using Base::col2;
    using Base::consumer;
    using Base::p;
    using Base::warp_row;
    using Base::ws;

    __device__ __forceinline__ BwdColumnConsumer(const Params& p_, int consumer_, int n_block_, int kv_head_,
                                                 int batch_)
        : Base(p_, kC == kAnyConsumer ? consumer_ : kC, n_block_, kv_head_, batch_) {}

    // A 16-bit pair of (key row warp_row + 8 h, this thread's queries of column tile ni) to a shared [key][query]
    // tile, at the consumer's query columns.
    __device__ __forceinline__ void store_pair(u32 tile, int h, int ni, u32 pair) const {
        st_shared_b32(this->pair_address(tile, warp_row, consumer * kQueryChunks + ni, h), pair);
    }

    // Visit number `slot` of the CTA: query block m_block of `head`, Q and dO in ring stage slot % kStages,
    // P^T and dS^T in buffer slot % 2.
    __device__ __forceinline__ void visit(const BwdCta<Kt>& cta, int slot, const BwdVisit& at) {
        const int head = at.head, m_block = at.m_block;
        const int m0 = m_block * Kt::kBlockM;
        this->stage_keep(cta, slot, at.partial, head, m0);   // a mask_mod's element mask on a partial visit
        const index_t ws_row = ws.row0(p, batch, head) + m0;
        const u32 k_tile = cta.smem + Kt::kKOffset;
        const u32 q_tile = cta.q_tile(slot);
        const u32 do_tile = cta.do_tile(slot);
        const u32 ds_tile = cta.ds_tile(slot);
        const u32 pt_tile = cta.pt_tile(slot);

        float2 lse2[Kt::kQTiles];   // from the workspace (Kt::kStagedRows: no shared memory here), under the products
#pragma unroll
        for (int ni = 0; ni < Kt::kQTiles; ++ni) lse2[ni] = this->query_pair(ws.lse2 + ws_row, ni);
        float s[Kt::kQTiles][4];    // S^T: rows warp_row (+ 8), queries s_query0() + 8 ni + col2 (+ 1)
        float dp[Kt::kQTiles][4];   // dP^T
        this->issue_scores(cta, slot, s, dp);

        gmma::wait<1>();   // S^T landed; dP^T still running
        gmma::fence_registers(s);
        const Mod mod(p, head, batch);
        constexpr bool kHeld = Kt::template holds_slopes<Mod>();   // softcap's slopes, from the recompute to dS
        u32 slope[kHeld ? Kt::kQTiles : 1][2];
        if constexpr (kHeld)
            this->modify_scores(mod, s, slope, m0);
        else
            this->modify_scores(mod, s, m0);
        const u32 keep = this->staged_keep(cta, slot, at.partial);   // a mask_mod's element mask
        const int over = this->causal_over(m0);
        const int diff = this->key_minus_query(m0);
        u32 pt[Kt::kQTiles][2];   // P^T in 16 bits: pt[ni][h] = row warp_row + 8 h, column tile ni
#pragma unroll
        for (int ni = 0; ni < Kt::kQTiles; ++ni)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                float pr[2];
#pragma unroll
                for (int c = 0; c < 2; ++c)   // P^T, 0 above the causal diagonal and outside the window
                    pr[c] = this->keeps(keep, ni, 2 * h + c,
                                        this->visible_prob(s[ni][2 * h + c], c ? lse2[ni].y : lse2[ni].x, over,
                                                           diff, h * kFragRowHalf - (ni * kMmaN + c)));
                pt[ni][h] = pack_float2<Element, SaturateFinite>(pr[0], pr[1]);
                store_pair(pt_tile, h, ni, pt[ni][h]);
            }

        gmma::wait<0>();   // dP^T landed
        gmma::fence_registers(dp);
        const float* dsum = ws.dsum + ws_row;
#pragma unroll
        for (int ni = 0; ni < Kt::kQTiles; ++ni) {
            const float2 d = this->query_pair(dsum, ni);
#pragma unroll
            for (int h = 0; h < 2; ++h)   // dS^T = P^T (dP^T - dsum), P^T as rounded (bwd_consumer.cuh)
                store_pair(ds_tile, h, ni,
                           this->template ds_pair<Mod>(pt[ni][h], dp[ni][2 * h], dp[ni][2 * h + 1], d,
                                                       kHeld ? slope[kHeld ? ni : 0][h] : 0u));
        }
        gmma::fence_proxy_async();   // the P^T, dS^T stores (generic proxy), before wgmma (async proxy) reads them
        this->dq_panel_free();
        // both halves of P^T and dS^T in the tiles (each consumer at its own copy of it where the shares differ)
        named_sync<Base::kAlignedBarriers>(kBwdDsReadyBarrier, Kt::kConsumerThreads);

        // dQ first, so that its adds run under dV and dK.
        float dq[Share::kDqPanels][Share::kDqTiles / Share::kDqPanels][4];   // dQ: rows 16 warp + g (+ 8), columns
                                                                  // dq_col0 + 64 panel + 8 i + 2 t
        const int dq_panel0 = this->dq_col0() / Kt::kPanelElems;
        gmma::fence();
#pragma unroll
        for (int kk = 0; kk < Kt::kDqKeySteps; ++kk)   // dQ = dS K (keys are k; both read MN-major)
#pragma unroll
            for (int pn = 0; pn < Share::kDqPanels; ++pn)
                gmma::MmaTT<Element, Kt::kPanelElems>::ss(
                    dq[pn], DsTile::desc_mn_major(ds_tile, kk * Kt::kStepElems),
                    KTile::desc_mn_major(k_tile + (dq_panel0 + pn) * KTile::kPanelSize, kk * Kt::kStepElems), kk > 0);
        gmma::commit();
        const int own_panels = this->own_col0() / Kt::kPanelElems * QTile::kPanelSize;   // byte offset in Q
        const int own_panels_v = this->own_col0_v() / Kt::kPanelElems * Kt::DoTile::kPanelSize;   // in dO
#pragma unroll
        for (int kk = 0; kk < Kt::kQSteps; ++kk)   // dV += P^T dO (queries 16 kk.. are k, dO read MN-major)
            gmma::MmaBT<Element, Share::kDvCols>::ss(
                acc_dv, DsTile::desc(pt_tile, 0, kk * gmma::kKBytes),
                Kt::DoTile::desc_mn_major(do_tile + own_panels_v, kk * Kt::kStepElems), 1);
#pragma unroll
        for (int kk = 0; kk < Kt::kQSteps; ++kk)   // dK += dS^T Q (Q read MN-major)
            gmma::MmaBT<Element, Share::kDkCols>::ss(acc_dk, DsTile::desc(ds_tile, 0, kk * gmma::kKBytes),
                                                    QTile::desc_mn_major(q_tile + own_panels, kk * Kt::kStepElems), 1);
        gmma::commit();

        float(&dq_tiles)[Share::kDqTiles][4] = reinterpret_cast<float(&)[Share::kDqTiles][4]>(dq);
        gmma::wait<1>();   // dQ landed; dV, dK still running
        gmma::fence_registers(dq_tiles);
        this->stage_dq(cta, dq_tiles, slot);   // staged (Kt::kDqBulk: hd192), or added from the registers (hd256)
        this->publish_dq(cta, dq_tiles, head, m_block, ws_row);
        gmma::wait<0>();   // dV, dK done: Q_i and dO_i are free, both buffers read
        gmma::fence_registers(acc_dv);
        gmma::fence_registers(acc_dk);
        cta.q_ring.release(slot);
        cta.do_ring.release(slot);
    }
};

}  // namespace hopper
}  // namespace flashkit
