// The producer of the warp-specialized Hopper backward: one thread of the producer warpgroup issues every
// TMA load of the CTA. K and V of the key block load once (kv_full); then visit i loads Q_i and dO_i of
// visits.at(i)'s (head, m_block) into stage i % kStages of their rings as soon as every consumer has
// handed that stage back. Rows past seqlen_q or seqlen_k read as zeros (TMA's out-of-bounds fill): with the
// pre-pass's lse2 = +inf there, P = 0 on those rows, and P and dS packed saturated (the keys past seqlen_k: their
// dQ terms dS * 0 stay zeros; numeric.cuh's SaturateFinite), no element mask is needed for ragged tails.
// Where Kt::kStagedRows (hd128), the visit's row of lse2 (the pre-pass's, kBlockM floats of the padded workspace)
// comes with Q by a bulk copy on the same barrier, so the consumers read it from shared memory (from global memory,
// its L2 latency under the dQ reductions stalled the first exponential: 9% of the samples, hd128).
#pragma once

#include "flashkit/hopper/bwd_cta.cuh"
#include "flashkit/hopper/ws_producer.cuh"   // load_tile

namespace flashkit {
namespace hopper {

template <class Kt, class Visits>
__device__ __forceinline__ void bwd_produce(const Params& p, const BwdCta<Kt>& cta, const BackwardMaps& maps,
                                            const Visits& visits, int n_block, int kv_head, int batch) {
    typedef typename Kt::KTile KTile;
    typedef typename Kt::QTile QTile;
    typedef typename Kt::VTile VTile;
    typedef typename Kt::DoTile DoTile;
    if (visits.total == 0) return;   // no consumer waits: nothing may land in shared memory
    prefetch_tensor_map(maps.q);
    prefetch_tensor_map(maps.k);
    prefetch_tensor_map(maps.v);
    prefetch_tensor_map(maps.dout);
    const TileCoords kv_at{n_block * Kt::kBlockN, kv_head, batch};
    mbarrier_arrive_expect_tx(cta.kv_full, KTile::kBytes + VTile::kBytes);
    load_tile<Kt, KTile>(cta.smem + Kt::kKOffset, maps.k, cta.kv_full, kv_at);
    load_tile<Kt, VTile>(cta.smem + Kt::kVOffset, maps.v, cta.kv_full, kv_at);
    const BwdWorkspace<Kt::kBlockM, Kt::kHeadDim> ws(p);
    constexpr u32 kQStageBytes = QTile::kBytes + (Kt::kStagedRows ? Kt::kRowVecBytes : 0);   // Q and its lse2 row
    BwdVisit visit = visits.at(0);
#pragma unroll 1
    for (int i = 0; i < visits.total; visits.advance(visit, ++i)) {
        const TileCoords q_at{visit.m_block * Kt::kBlockM, visit.head, batch};
        const u32 q_full = cta.q_ring.acquire(i, kQStageBytes);
        load_tile<Kt, QTile>(cta.q_tile(i), maps.q, q_full, q_at);
        if constexpr (Kt::kStagedRows)
            bulk_load(cta.lse2_row(i), ws.lse2 + ws.row0(p, batch, visit.head) + q_at.row, Kt::kRowVecBytes, q_full);
        load_tile<Kt, DoTile>(cta.do_tile(i), maps.dout, cta.do_ring.acquire(i, DoTile::kBytes), q_at);
    }
}

}  // namespace hopper
}  // namespace flashkit
