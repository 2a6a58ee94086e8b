// The warp-specialized Hopper backward of one key block (FlashAttention-3's backward): the roles of a CTA.
//   warpgroup 0 (producer)     gives registers back (setmaxnreg.dec); thread 0 loads K, V once and Q, dO
//                              per visit through the stage rings (bwd_producer.cuh); at hd128, warp 1 + c issues
//                              consumer c's dQ reductions (bwd_dq_writer.cuh); with a mask_mod, its other warps
//                              write the partial visits' keep bits into Q's stages (bwd_keep.cuh)
//   warpgroups 1.. (consumers) take registers (setmaxnreg.inc); each runs its share of the products for
//                              every visit (split by keys: bwd_consumer.cuh; by head-dim columns:
//                              bwd_column_consumer.cuh), then stores its part of dK and dV
// Each role runs on its own branch
// after its setmaxnreg (ptxas budgets a region by the setmaxnreg that dominates it: ws_forward.cuh).
#pragma once

#include "flashkit/hopper/bwd_column_consumer.cuh"
#include "flashkit/hopper/bwd_consumer.cuh"
#include "flashkit/hopper/bwd_dq_writer.cuh"
#include "flashkit/hopper/bwd_epilogue.cuh"
#include "flashkit/hopper/bwd_keep.cuh"
#include "flashkit/hopper/bwd_producer.cuh"
#include "flashkit/hopper/ws_forward.cuh"   // ws_smem_base

namespace flashkit {
namespace hopper {

// A consumer warpgroup's whole run: every visit of the CTA, then its part of dK and dV.
template <class Consumer, class Kt, class Visits>
__device__ __forceinline__ void bwd_consume(const Params& p, const BwdCta<Kt>& cta, const Visits& visits, int n_block,
                                            int kv_head, int batch) {
    Consumer consumer(p, cta.consumer(), n_block, kv_head, batch);
    if (visits.total > 0) mbarrier_wait(cta.kv_full, 0);   // K, V landed
    for (int i = 0; visits.template has<Kt::kFreshVisitCount>(i); ++i) consumer.visit(cta, i, visits.at(i));
    consumer.dq_drain();
    consumer.store_dk_dv(cta);
}

template <class Kt, class Mask, class Mod>
__device__ __forceinline__ void ws_backward(const Params& p, const BackwardMaps& maps, int n_block, int kv_head,
                                            int batch) {
    typedef BwdVisits<Kt::kBlockM, Kt::kBlockN, Mask> Visits;
    BwdCta<Kt> cta(ws_smem_base());
    // Each role forms the visits after its setmaxnreg (formed before, a window build's first query block was spilled
    // across the branch)
    if (cta.producer()) {
        release_registers<Kt::kProducerRegs>();
        const Visits visits(p, n_block, kv_head, batch);
        if (cta.dq_writer()) {
            if constexpr (Kt::kDqWriter) bwd_write_dq<Kt, Mask>(p, cta, visits, n_block, batch);
        } else if (cta.issuer()) {
            bwd_produce<Kt>(p, cta, maps, visits, n_block, kv_head, batch);
        } else if (cta.mask_thread()) {
            bwd_stage_keeps<Kt>(p, cta, visits, n_block, batch);
        }
        return;
    }
    claim_registers<Kt::kConsumerRegs>();
    const Visits visits(p, n_block, kv_head, batch);
    if constexpr (Kt::kUnevenColumns) {   // each consumer's share its own (hd192): a copy of the visit each
        if (cta.consumer() == 0)
            bwd_consume<BwdColumnConsumer<Kt, Mask, Mod, 0> >(p, cta, visits, n_block, kv_head, batch);
        else
            bwd_consume<BwdColumnConsumer<Kt, Mask, Mod, 1> >(p, cta, visits, n_block, kv_head, batch);
    } else if constexpr (Kt::kSplitColumns) {
        bwd_consume<BwdColumnConsumer<Kt, Mask, Mod> >(p, cta, visits, n_block, kv_head, batch);
    } else {
        bwd_consume<BwdConsumer<Kt, Mask, Mod> >(p, cta, visits, n_block, kv_head, batch);
    }
}

}  // namespace hopper
}  // namespace flashkit
