// A clock64 timeline of the warp-specialized Hopper kernels, for kernel development (launch flag timeline,
// FLASHKIT_TIMELINE = 1: never in a manifest; scripts/timeline.py builds a variant with it and prints where a visit's
// cycles go). Stamps of CTA (0, 0, 0) alone (clocks are per SM: only one CTA's stamps compare), its last tile: each
// consumer warpgroup's first thread (row = consumer) at the points of each main-loop visit, and in the forward the
// producer's issuing thread (row kTimelineProducer) as it issues each visit's K and V loads. Without the flag,
// timeline_stamp is nothing.
#pragma once

#include "flashkit/hopper/ws_traits.cuh"

#ifndef FLASHKIT_TIMELINE
#define FLASHKIT_TIMELINE 0
#endif

namespace flashkit {
namespace hopper {

constexpr int kTimelineVisits = 64;                 // visits stamped (the first of the tile)
constexpr int kTimelinePoints = 8;                  // stamps a visit
constexpr int kTimelineProducer = kMaxConsumers;    // the producer's row
// A consumer visit's points (ws_mainloop.cuh's consumer_step) and the producer's (ws_producer.cuh).
enum TimelinePoint {
    kVisitStart = 0,     // the visit begins
    kVisitSettled = 1,   // the P V it waited for done (defer_pv_wait), O rescaled, P packed (serial_pv: at once,
                         // its own P V falls in the time between visits)
    kOperandsIn = 2,     // its K and V stages landed
    kIssued = 3,         // its products issued (the turns taken)
    kScoresIn = 4,       // S landed
    kSoftmaxDone = 5,    // P and the row statistics
    kKIssued = 1,        // producer: the visit's K load issued (its stage acquired)
    kVIssued = 2,        // producer: the visit's V load issued
};
// A backward consumer's points of a visit (one query block; bwd_consumer.cuh).
enum BwdTimelinePoint {
    kBwdVisitStart = 0,   // the visit begins
    kBwdIssued = 1,       // S^T and dP^T issued (Q and dO landed)
    kBwdScoresIn = 2,     // S^T landed
    kBwdDvIssued = 3,     // P^T formed, dV += P^T dO issued
    kBwdDpIn = 4,         // dP^T landed
    kBwdDsStored = 5,     // dS^T formed and stored to its shared tile
    kBwdDsShared = 6,     // every consumer's dS^T rows stored (the barrier)
    kBwdVisitDone = 7,    // dQ and dK issued, waited for, dQ handed on; Q and dO stages handed back
};

#if FLASHKIT_TIMELINE
extern "C" __device__ unsigned long long flashkit_timeline[kTimelineProducer + 1][kTimelineVisits][kTimelinePoints];
#endif

// Stamp `point` of visit `visit` for the calling role's row (consumer warpgroup c: row c; the producer warpgroup:
// kTimelineProducer): only CTA (0, 0, 0), a warpgroup's first thread, the first kTimelineVisits visits.
__device__ __forceinline__ void timeline_stamp(int visit, int point) {
#if FLASHKIT_TIMELINE
    if (blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 && threadIdx.x % gmma::kWarpgroupThreads == 0 &&
        visit < kTimelineVisits) {
        unsigned long long t;
        asm volatile("mov.u64 %0, %%clock64;" : "=l"(t)::"memory");
        const int warpgroup = threadIdx.x / gmma::kWarpgroupThreads;   // 0: the producer
        flashkit_timeline[warpgroup == 0 ? kTimelineProducer : warpgroup - 1][visit][point] = t;
    }
#else
    (void)visit;
    (void)point;
#endif
}

}  // namespace hopper
}  // namespace flashkit
