// Synchronization of the warp-specialized Hopper core (sm_90): transaction-counting mbarriers in
// shared memory, and the named barriers (bar.sync / bar.arrive) that order warpgroups.
//
// An mbarrier completes a phase when its expected arrivals have arrived and its expected
// transaction bytes (announced by arrive.expect_tx, counted down by TMA's complete_tx) have
// landed. Phases alternate parity 0, 1, 0, ...: a waiter on round r of a barrier waits for
// parity r & 1. Waiting for parity 1 on a fresh barrier (phase 0 still open) returns at once:
// the "preceding phase" counts as complete, which is how a producer's first pass over the empty
// barriers of its stage ring goes through without any consumer release.
#pragma once

#include "flashkit/numeric.cuh"

namespace flashkit {
namespace hopper {

// mbarrier.init: `arrivals` arrivals complete each phase (plus any expected transaction bytes).
__device__ __forceinline__ void mbarrier_init(u32 bar, int arrivals) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(arrivals) : "memory");
}

// After initializing barriers (one thread): make them visible to the async proxy (TMA) before
// the CTA-wide barrier that publishes them.
__device__ __forceinline__ void fence_barrier_init() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// Arrive once and expect `bytes` more transaction bytes in this phase (the TMA loads that follow).
__device__ __forceinline__ void mbarrier_arrive_expect_tx(u32 bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}

// Arrive once (a consumer handing a stage back).
__device__ __forceinline__ void mbarrier_arrive(u32 bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

// Spin until the phase of parity `parity` has completed.
__device__ __forceinline__ void mbarrier_wait(u32 bar, u32 parity) {
    asm volatile(
        "{\n"
        ".reg .pred done;\n"
        "WAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra WAIT;\n"
        "}\n" ::"r"(bar),
        "r"(parity)
        : "memory");
}

// Named barriers (ids 1..15; 0 is __syncthreads): `threads` arrivals complete one use. bar.sync
// waits for completion, bar.arrive only counts (the producer half of an ordering handshake).
// kAligned = false: warps that wait on it at different instructions (each consumer's own copy of the code where the
// consumers' shares differ, bwd_traits.cuh's kUnevenColumns), which .aligned (bar.sync's) does not allow.
constexpr int kNamedBarriers = 16;
template <bool kAligned = true>
__device__ __forceinline__ void named_sync(int id, int threads) {
    if constexpr (kAligned)
        asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
    else
        asm volatile("barrier.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
template <bool kAligned = true>
__device__ __forceinline__ void named_arrive(int id, int threads) {
    if constexpr (kAligned)
        asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
    else
        asm volatile("barrier.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// setmaxnreg: a warpgroup gives registers back (producer) or takes them (consumers). Takes effect
// only in a kernel launched with a register cap (__launch_bounds__(threads, 1)).
template <int kRegs>
__device__ __forceinline__ void release_registers() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void claim_registers() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

}  // namespace hopper
}  // namespace flashkit
