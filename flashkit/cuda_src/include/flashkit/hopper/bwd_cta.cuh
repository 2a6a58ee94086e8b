// What every role of a warp-specialized Hopper backward CTA shares: its barriers and stage rings, the
// tensor maps, and the sequence of visits (query head, query block) that the producer and every consumer
// walk in the same order.
//   kv_full   K and V of the key block landed (one phase: loaded once)
//   q_ring    Q of visit i in stage i % kStages (full: landed; empty: every consumer thread is done with it)
//   do_ring   dO of visit i, likewise (a ring of its own, so that S^T = K Q^T starts before dO lands)
#pragma once

#include "flashkit/bwd_passes.cuh"
#include "flashkit/hopper/bwd_traits.cuh"

namespace flashkit {
namespace hopper {

struct BackwardMaps {
    const TensorMap& q;
    const TensorMap& k;
    const TensorMap& v;
    const TensorMap& dout;
};

// The visits of key block n_block: every query head of the kv head's group (GQA / MQA: dK, dV summed in
// the CTA), each over the query blocks that see any key of the block (Mask: bwd_mask.cuh).
template <int kBlockM, int kBlockN, class Mask>
struct BwdVisits {
    int group;     // query heads per kv head
    int m_begin;   // first visited query block of each head
    int n_m;       // visited query blocks per head
    int total;     // visits of the CTA (0: no query sees the block; dK = dV = 0)
    int head0;     // first query head of the group

    __device__ __forceinline__ BwdVisits(const Params& p, int n_block, int kv_head) {
        group = p.heads / p.kv_heads;
        head0 = kv_head * group;
        const Mask mask(p);
        const int n0 = n_block * kBlockN;
        m_begin = mask.m_begin(n0, kBlockM);
        n_m = max(mask.m_end(min(n0 + kBlockN, p.seqlen_k), kBlockM) - m_begin, 0);
        total = group * n_m;
    }
    __device__ __forceinline__ int head(int i) const { return head0 + i / n_m; }
    __device__ __forceinline__ int m_block(int i) const { return m_begin + i % n_m; }
};

template <class Kt>
struct BwdCta : WsRoles {   // smem: the layout in bwd_traits.cuh
    typedef typename Kt::Ring Ring;
    Ring q_ring, do_ring;
    u32 kv_full;

    // Every thread: carve shared memory, set the barriers up (thread 0) and publish them.
    __device__ __forceinline__ explicit BwdCta(u32 smem_)
        : WsRoles(smem_), q_ring(smem_ + Kt::kQRingOffset),
          do_ring(smem_ + Kt::kDoRingOffset), kv_full(smem_ + Kt::kKvBarOffset) {
        if (tid == 0) {
            mbarrier_init(kv_full, 1);
            q_ring.init(Kt::kConsumerThreads);
            do_ring.init(Kt::kConsumerThreads);
            fence_barrier_init();
        }
        __syncthreads();
    }
    __device__ __forceinline__ u32 q_tile(int visit) const {
        return smem + Kt::kQOffset + Ring::stage(visit) * Kt::kQStageBytes;
    }
    __device__ __forceinline__ u32 do_tile(int visit) const {
        return smem + Kt::kDoOffset + Ring::stage(visit) * Kt::kQStageBytes;
    }
    __device__ __forceinline__ u32 ds_tile(int visit) const {   // dS^T, by visit parity
        return smem + Kt::kDsOffset + (visit % Kt::kDsBuffers) * Kt::kDsBufferBytes;
    }
    __device__ __forceinline__ u32 dq_panel(int consumer) const {   // a consumer's staged dQ (split by keys)
        static_assert(Kt::kDqBulk, "dQ is staged only when the consumers split the keys");
        return smem + Kt::kDqOffset + consumer * Kt::kDqBufferBytes;
    }
    __device__ __forceinline__ u32 pt_tile(int visit) const {   // P^T (split by columns), by visit parity
        static_assert(Kt::kPtBuffers == Kt::kDsBuffers, "P^T is shared only when the consumers split columns");
        return smem + Kt::kPtOffset + (visit % Kt::kPtBuffers) * Kt::kDsBufferBytes;
    }
};

}  // namespace hopper
}  // namespace flashkit
