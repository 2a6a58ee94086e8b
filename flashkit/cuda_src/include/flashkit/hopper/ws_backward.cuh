// The warp-specialized Hopper backward of one key block (FlashAttention-3's backward): the roles of a CTA.
//   warpgroup 0 (producer)     gives registers back (setmaxnreg.dec); thread 0 loads K, V once and Q, dO
//                              per visit through the stage rings (bwd_producer.cuh)
//   warpgroups 1.. (consumers) take registers (setmaxnreg.inc); each runs the products of its 64 keys for
//                              every visit (bwd_consumer.cuh), then stores its rows of dK and dV
// Each role runs on its own branch
// after its setmaxnreg (ptxas budgets a region by the setmaxnreg that dominates it: ws_forward.cuh).
#pragma once

#include "flashkit/hopper/bwd_consumer.cuh"
#include "flashkit/hopper/bwd_producer.cuh"
#include "flashkit/hopper/ws_forward.cuh"   // ws_smem_base

namespace flashkit {
namespace hopper {

template <class Kt, bool kCausal>
__device__ __forceinline__ void ws_backward(const Params& p, const BackwardMaps& maps, int n_block, int kv_head,
                                            int batch) {
    BwdCta<Kt> cta(ws_smem_base());
    const BwdVisits<Kt::kBlockM, Kt::kBlockN, kCausal> visits(p, n_block, kv_head);
    if (cta.producer()) {
        release_registers<Kt::kProducerRegs>();
        if (cta.issuer()) bwd_produce<Kt>(cta, maps, visits, n_block, kv_head, batch);
        return;
    }
    claim_registers<Kt::kConsumerRegs>();
    BwdConsumer<Kt, kCausal> consumer(p, cta.consumer(), n_block, kv_head, batch);
    if (visits.total > 0) mbarrier_wait(cta.kv_full, 0);   // K, V landed
    for (int i = 0; i < visits.total; ++i) consumer.visit(cta, i, visits.head(i), visits.m_block(i));
    consumer.store_dk_dv();
}

}  // namespace hopper
}  // namespace flashkit
