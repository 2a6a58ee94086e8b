// The dQ writers of the warp-specialized Hopper backward (FlashAttention-3's dQ writer): warp 1 + c of the producer
// warpgroup adds consumer c's staged dQ panels to dq_accum, so that the consumer only arrives on a barrier where it
// synchronized its warpgroup and issued the reduction itself. One writer a consumer keeps the consumers independent
// where nothing else couples them (hd64's three, which split the keys: one writer for all three measured 3% slower).
// Per visit i, consumer c and its writer share two named barriers (kDqHandshake threads: the consumer warpgroup and
// the writer warp):
//   dq_full  + c   the consumer's threads stored the panel and fenced it, its thread 0 the panel's ticket (where it
//                  goes in dq_accum) (bar.arrive); the writer waits (bar.sync), reads the ticket, and its lane 0 issues
//                  the panel's bulk reduction (cp.reduce.async.bulk .add.f32)
//   dq_empty + c   the reduction has read the panel (the writer's bar.arrive after wait_group.read); the consumer waits
//                  on it before it stores visit i + 1's panel (so no arrival is left unmatched: the writer arrives after
//                  visits 0 .. total - 2, the consumer waits in visits 1 .. total - 1)
// Deterministic (p.bwd.deterministic): the visit's semaphore counts panels; panel c of the key block whose turn is t
// (Mask::dq_turn: t key blocks before it visit the query block) waits for t kConsumers + c, completes its reduction and
// increments it. The panels of one query block are added in one order on every run, and the consumers never wait.
#pragma once

#include "flashkit/hopper/bwd_cta.cuh"

namespace flashkit {
namespace hopper {

// A ticket's fields (BwdCta::dq_ticket): byte offsets.
constexpr int kTicketBlock = 0;   // float* into dq_accum
constexpr int kTicketSema = 8;    // int*, deterministic only
constexpr int kTicketTurn = 16;   // the count the semaphore must read first

// Writer c's run over `visits` visits. It knows nothing of the schedule (the tickets carry it), so that it fits the
// producer warpgroup's 24 registers beside the loading thread.
template <class Kt>
__device__ __forceinline__ void bwd_write_dq(const Params& p, const BwdCta<Kt>& cta, int visits) {
    const bool ordered = p.bwd.deterministic != 0;
    const int c = cta.tid / kWarpSize - Kt::kDqWriterWarp0;
    const bool lane0 = cta.tid % kWarpSize == 0;
    const u32 ticket = cta.dq_ticket(c);
#pragma unroll 1
    for (int i = 0; i < visits; ++i) {
        named_sync(kBwdDqFullBarrier + c, Kt::kDqHandshake);
        if (lane0) {
            int* sema = nullptr;
            if (ordered) {   // the panels before this one in the query block's order are added
                sema = reinterpret_cast<int*>(ld_shared_b64(ticket + kTicketSema));
                wait_semaphore(sema, static_cast<int>(ld_shared_b32(ticket + kTicketTurn)));
                fence_proxy_async_global();   // their bulk adds, before this one
            }
            bulk_reduce_add(reinterpret_cast<float*>(ld_shared_b64(ticket + kTicketBlock)), cta.dq_panel(c),
                            Kt::DqLayout::kPanelBytes);
            bulk_commit();
            if (ordered) {   // complete and visible before the next panel's turn
                bulk_wait();
                fence_proxy_async_global();
                __threadfence();
                atomicAdd(sema, 1);
            } else {
                bulk_wait_read();
            }
        }
        __syncwarp();
        if (i + 1 < visits) named_arrive(kBwdDqEmptyBarrier + c, Kt::kDqHandshake);
    }
    if (lane0) bulk_wait();   // the last reduction complete before the CTA ends
}

}  // namespace hopper
}  // namespace flashkit
