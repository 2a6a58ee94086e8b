// The FlashAttention-2 backward's CTA (fa2_bwd.cu's main entry): its key block's walk over the query blocks of
// every query head of its kv head's group, one visit at a time (sm80/bwd_mainloop.cuh's BwdMainloop). With two
// stages a visit's Q_i, dO_i, lse2_i and dsum_i stream into one buffer while the other is worked on; two barriers a
// visit: the buffer resident (and the last visit's P^T and dS^T read), then P^T and dS^T complete (dV, dK and dQ
// read them). With one stage the next visit's loads wait until every warp is done with Q_i and dO_i (after dV and
// dK: a third barrier, unless they are added from registers in the step) and stream in under dQ_i only.
// The query blocks that see a key of the block come from the mask (causal, a window or chunk; varlen: the
// sequence's); a key block that no query sees stores dK = dV = 0. Where V is held in registers (Kt::kVInRegs), V lands
// in Q's buffer first and each warp takes its fragments before the first visit's loads.
#pragma once

#include "flashkit/bwd_visits.cuh"
#include "flashkit/sm80/bwd_dq.cuh"
#include "flashkit/sm80/bwd_epilogue.cuh"
#include "flashkit/sm80/bwd_loads.cuh"
#include "flashkit/sm80/bwd_mainloop.cuh"
#include "flashkit/sm80/bwd_products.cuh"

namespace flashkit {

// The whole backward of key block n_block of (kv_head, sequence `batch`); p: the sequence's view (varlen) or
// the call's parameter block, origin: where the sequence's rows lie. A sequence without queries visits no
// query block and stores dK = dV = 0.
template <class Kt, class Mask, class Mod>
__device__ __forceinline__ void bwd_block_seq(const Params& p, const Params& call, int n_block, int kv_head, int batch,
                                              const SeqOrigin& origin) {
    extern __shared__ __align__(128) unsigned char smem_raw[];
    BwdMainloop<Kt, Mask, Mod> loop(p, call, smem_raw, n_block, kv_head, batch, origin);
    // The query blocks that see a key of the block (the sequence's, varlen), each head of the group: from the mask's
    // intervals, or the visit lists of a block mask or a mask_mod (bwd_visits.cuh).
    const BwdVisits<Kt::kBlockM, Kt::kBlockN, Mask> visits(p, n_block, kv_head, batch);
    const int total = visits.total;
    loop.load_kv_async();
    if constexpr (Kt::kVInRegs) {   // V through Q's buffer into registers, before the first visit's loads take it over
        cp_async_commit();
        cp_async_wait<0>();
        __syncthreads();
        loop.hold_v();
        __syncthreads();
    }
    // The visit under way and the next one, stepped on by advance() (no division a visit).
    BwdVisit at{}, next{};
    if (total > 0) {
        at = next = visits.at(0);
        loop.load_q_async(at.head, at.m_block, 0);
    } else {
        cp_async_commit();
    }
    constexpr bool kDoubleBuffered = Kt::kQStages == 2;
    for (int it = 0; total > 0; ++it) {   // (left by the break after the last visit)
        const int buf = kDoubleBuffered ? it & 1 : 0;
        // Whether a visit follows, decided here through a volatile move, so that the loop's end tests this flag
        // rather than the visit count again: ptxas spills the count at hd128, and its reload there queued behind the
        // visit's dQ reductions (8% of the kernel's stall samples).
        const int more = fresh_value(it + 1 < total);
        cp_async_wait<0>();
        __syncthreads();   // Q_i, dO_i (and K, V) resident; every warp is done with buffer buf ^ 1, P^T and dS^T
        if (more) visits.advance(next, it + 1);
        if (kDoubleBuffered && more) loop.load_q_async(next.head, next.m_block, buf ^ 1);
        loop.step(at.head, at.m_block, buf, at.partial);
        __syncthreads();   // P^T and dS^T complete
        loop.accumulate_dk_dv(buf);
        if (!kDoubleBuffered && more) {   // Q_i, dO_i read by every warp: block i + 1 streams in under dQ_i
            if constexpr (!Kt::kRegisterOperands) __syncthreads();
            loop.load_q_async(next.head, next.m_block, 0);
        }
        loop.accumulate_dq(at.head, at.m_block);
        if (!more) break;
        at = next;
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
