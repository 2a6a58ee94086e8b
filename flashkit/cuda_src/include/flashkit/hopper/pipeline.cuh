// The shared-memory stage ring between the producer warp and the consumer warpgroups (sm_90).
//
// Tile i of a stream lives in stage i % kStages; its round is i / kStages. Each stage has two
// mbarriers: "full" (1 arrival: the producer's arrive.expect_tx, plus the tile's bytes landing
// through TMA; plus one a side thread where other threads write part of the stage) and "empty" (one
// arrival per consumer thread: every consumer is done reading it).
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

    // One thread, before the CTA-wide barrier that publishes the ring. side_threads: threads besides the producer
    // that fill part of each stage (a plain arrive on full once their part is written: co_fill).
    __device__ __forceinline__ void init(int consumer_threads, int side_threads = 0) const {
#pragma unroll
        for (int s = 0; s < kStages; ++s) {
            mbarrier_init(full(s), 1 + side_threads);
            mbarrier_init(empty(s), consumer_threads);
        }
    }

    // Producer: wait until tile i's stage is free, then announce its bytes.
    __device__ __forceinline__ u32 acquire(int i, u32 bytes) const {
        wait_empty(i);
        return announce(i, bytes);
    }
    // Producer, the stage already free (wait_empty, then what it writes itself): announce tile i's bytes, whose
    // arrive (release) also publishes those writes.
    __device__ __forceinline__ u32 announce(int i, u32 bytes) const {
        mbarrier_arrive_expect_tx(full(i), bytes);
        return full(i);
    }
    // A side thread (init's side_threads): wait until tile i's stage is free, write its part, then co_fill.
    __device__ __forceinline__ void wait_empty(int i) const { mbarrier_wait(empty(i), parity(i) ^ 1u); }
    __device__ __forceinline__ void co_fill(int i) const { mbarrier_arrive(full(i)); }
    // Consumer: wait until tile i has landed; hand its stage back once read.
    __device__ __forceinline__ void wait_full(int i) const { mbarrier_wait(full(i), parity(i)); }
    __device__ __forceinline__ void release(int i) const { mbarrier_arrive(empty(i)); }
};

}  // namespace hopper
}  // namespace flashkit
