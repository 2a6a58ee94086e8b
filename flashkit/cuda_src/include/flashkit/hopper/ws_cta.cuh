// What one CTA of the warp-specialized Hopper forward keeps across the query tiles it handles (one tile,
// or every tile the persistent scheduler gives it: tile_scheduler.cuh): its barriers, its stage rings and
// two counters that the producer and every consumer advance identically, tile by tile.
//   ring_pos  K/V tiles streamed so far: visit i of the current tile uses ring slot ring_pos + i
//             (stage (ring_pos + i) % kStages), so the rings' phases carry on from tile to tile
//   tiles     query tiles handled so far: the phase of q_full (Q landed, or an empty tile announced) and
//             q_empty (the producer may reload Q: with an O tile of its own, every consumer thread's last S
//             product has read Q; else each consumer's O has left the Q rows it was staged in)
#pragma once

#include "flashkit/hopper/ws_traits.cuh"

namespace flashkit {
namespace hopper {

struct ForwardMaps {
    const TensorMap& q;
    const TensorMap& k;
    const TensorMap& v;
    const TensorMap& o;
};

template <class Kt>
struct WsCta : WsRoles {   // smem: the layout in ws_traits.cuh
    typedef typename Kt::Ring Ring;
    Ring k_ring, v_ring;
    u32 q_full, q_empty;
    int ring_pos = 0;
    int tiles = 0;

    // Every thread: carve shared memory, set the barriers up (thread 0) and publish them. (The roles then
    // move registers with setmaxnreg, each on its own branch: ws_forward.cuh.)
    __device__ __forceinline__ explicit WsCta(u32 smem_)
        : WsRoles(smem_), k_ring(smem_ + Kt::kKRingOffset),
          v_ring(smem_ + Kt::kVRingOffset), q_full(smem_ + Kt::kQBarOffset), q_empty(smem_ + Kt::kQEmptyBarOffset) {
        if (tid == 0) {
            mbarrier_init(q_full, 1);
            // Every consumer thread after its last S (kOwnOTile), or each consumer's thread 0 after its store.
            mbarrier_init(q_empty, Kt::kOwnOTile ? Kt::kConsumerThreads : Kt::kConsumers);
            k_ring.init(Kt::kConsumerThreads);
            v_ring.init(Kt::kConsumerThreads);
            fence_barrier_init();
        }
        __syncthreads();
    }
    // After a tile of n_blocks visits, on every role.
    __device__ __forceinline__ void advance(int n_blocks) {
        ring_pos += n_blocks;
        ++tiles;
    }
};

}  // namespace hopper
}  // namespace flashkit
