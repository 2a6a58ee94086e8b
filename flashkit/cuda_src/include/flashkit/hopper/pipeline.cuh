// The shared-memory stage ring between the producer warp and the consumer warpgroups (sm_90).
//
// Tile i of a stream lives in stage i % kStages; its round is i / kStages. Each stage has two
// mbarriers: "full" (1 arrival: the producer's arrive.expect_tx, plus the tile's bytes landing
// through TMA) and "empty" (one arrival per consumer thread: every consumer is done reading it).
//   producer, tile i:  wait empty(stage) for parity (round & 1) ^ 1   (round 0 passes at once)
//                      arrive.expect_tx(full(stage), bytes); TMA loads complete on full(stage)
//   consumer, tile i:  wait full(stage) for parity round & 1; read; arrive empty(stage)
#pragma once

#include "flashkit/hopper/barrier.cuh"

namespace flashkit {
namespace hopper {

constexpr int kBarrierBytes = 8;   // one mbarrier (.b64)

template <int kStages_>
struct StageRing {
    static constexpr int kStages = kStages_;
    static constexpr int kBytes = 2 * kStages * kBarrierBytes;   // full[kStages] | empty[kStages]
    u32 base;                                                       // shared address of full[0]

    __device__ __forceinline__ explicit StageRing(u32 base_) : base(base_) {}
    __device__ __forceinline__ static int stage(int i) { return i % kStages; }
    __device__ __forceinline__ static u32 parity(int i) { return static_cast<u32>(i / kStages) & 1u; }
    __device__ __forceinline__ u32 full(int i) const { return base + stage(i) * kBarrierBytes; }
    __device__ __forceinline__ u32 empty(int i) const { return base + (kStages + stage(i)) * kBarrierBytes; }

    // One thread, before the CTA-wide barrier that publishes the ring.
    __device__ __forceinline__ void init(int consumer_threads) const {
#pragma unroll
        for (int s = 0; s < kStages; ++s) {
            mbarrier_init(full(s), 1);
            mbarrier_init(empty(s), consumer_threads);
        }
    }

    // Producer: wait until tile i's stage is free, then announce its bytes.
    __device__ __forceinline__ u32 acquire(int i, u32 bytes) const {
        mbarrier_wait(empty(i), parity(i) ^ 1u);
        mbarrier_arrive_expect_tx(full(i), bytes);
        return full(i);
    }
    // Consumer: wait until tile i has landed; hand its stage back once read.
    __device__ __forceinline__ void wait_full(int i) const { mbarrier_wait(full(i), parity(i)); }
    __device__ __forceinline__ void release(int i) const { mbarrier_arrive(empty(i)); }
};

}  // namespace hopper
}  // namespace flashkit
