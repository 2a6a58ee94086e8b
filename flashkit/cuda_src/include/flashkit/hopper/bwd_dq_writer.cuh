// The dQ writers of the warp-specialized Hopper backward (FlashAttention-3's dQ writer): warp 1 + c of the producer
// warpgroup adds consumer c's staged dQ panels to dq_accum, so that the consumer only arrives on a barrier where it
// synchronized its warpgroup and issued the reduction itself. One writer a consumer, so that neither consumer's panel
// waits behind the other's (hd128 8k: 1.104x the tree before, against 1.088x with one writer for both; BENCHMARKS.md).
// Writer c serves every visit of consumer c, or by turns (hd64, Kt::kDqTurns: one panel a visit, consumer i mod
// kConsumers's) visits c, c + kConsumers, ... (1.02-1.04x, 1.45x deterministic, against the consumers' own issue).
// Per panel, consumer c and its writer share two named barriers (kDqHandshake threads: the consumer warpgroup and
// the writer warp):
//   dq_full  + c   the consumer's threads stored the panel and fenced it (bar.arrive); the writer waits (bar.sync),
//                  and its lane 0 issues the panel's bulk reduction (cp.reduce.async.bulk .add.f32) into the visit's
//                  block of dq_accum (the writer walks the visits in the consumers' order)
//   dq_empty + c   the reduction has read the panel (the writer's bar.arrive after wait_group.read); the consumer
//                  waits on it before it stores its next panel (so no arrival is left unmatched: the writer arrives
//                  after each of its panels but the last, the consumer waits before each but the first)
// Deterministic (p.bwd.deterministic): the visit's semaphore counts panels; panel c of the key block whose turn is t
// (Mask::dq_turn: t key blocks before it visit the query block) waits for t kDqVisitPanels + c (by turns: t), completes
// its reduction and increments it. The panels of one query block are added in one order on every run, and the
// consumers never wait.
#pragma once

#include "flashkit/bwd_mask.cuh"
#include "flashkit/hopper/bwd_cta.cuh"

namespace flashkit {
namespace hopper {

// Writer c's run over the CTA's visits (dense: the writers serve no visit lists), in the loading thread's order.
template <class Kt, class Mask, class Visits>
__device__ __forceinline__ void bwd_write_dq(const Params& p, const BwdCta<Kt>& cta, const Visits& visits, int n_block,
                                             int batch) {
    const BwdWorkspace<Kt::kBlockM, Kt::kHeadDim> ws(p);
    static_assert(!Kt::kListedVisits, "the writers walk dense visits (BwdVisits::advance without an index)");
    const bool ordered = p.bwd.deterministic != 0;
    const int c = cta.tid / kWarpSize - Kt::kDqWriterWarp0;
    const bool lane0 = cta.tid % kWarpSize == 0;
    // consumer c's visits: every one, or by turns c, c + kConsumers, ...
    const int first = Kt::kDqTurns ? c : 0;
    BwdVisit visit = visits.at(first);
    if constexpr (Kt::kSplitColumns)   // its first panel is free: consumer c waits before each (see stage_dq)
        if (visits.total > 0) named_arrive(kBwdDqEmptyBarrier + c, Kt::kDqHandshake);
    // Counted down (one register for the loop, at the producer warpgroup's 24: with a count up to visits.total, the
    // causal window builds spilled the walk's bound)
#pragma unroll 1
    for (int left = (visits.total - first + Kt::kDqTurnStride - 1) / Kt::kDqTurnStride; left > 0; --left) {
        named_sync(kBwdDqFullBarrier + c, Kt::kDqHandshake);
        if (lane0) {
            const index_t ws_row = ws.row0(p, batch, visit.head) + visit.m_block * Kt::kBlockM;
            if (ordered)   // the panels before this one in the query block's order are added
                await_dq_turn(ws.semaphore(ws_row), dq_turn<Kt::kBlockM, Kt::kBlockN>(Mask(p), visit.m_block, n_block,
                                                                                    visit.head, batch) *
                                                            Kt::kDqVisitPanels + (Kt::kDqTurns ? 0 : c));
            // consumer c's columns: its panels (hd192: two or one), from c formed again where the shares differ (held
            // over the loop, its sums took the writer a register over its 24 beside a window: 4 B spilled)
            const int me = Kt::kUnevenColumns ? fresh_thread_index() / kWarpSize - Kt::kDqWriterWarp0 : c;
            const int col0 = BwdDqShares<Kt>::col0(me);
            reduce_panel<Kt>(dq_block<Kt>(ws, ws_row, col0), cta.dq_staging(me, col0), ordered,
                             BwdDqShares<Kt>::panels(me));
            if (ordered) atomicAdd(ws.semaphore(ws_row), 1);   // the next panel's turn
            else bulk_wait_read();                              // the panel may be written again
        }
        __syncwarp();
        if (left > 1) named_arrive(kBwdDqEmptyBarrier + c, Kt::kDqHandshake);
#pragma unroll
        for (int step = 0; step < Kt::kDqTurnStride; ++step) visits.advance(visit, 0);   // dense visits: no index
    }
    if (lane0) bulk_wait();   // the last reduction complete before the CTA ends
}

}  // namespace hopper
}  // namespace flashkit
