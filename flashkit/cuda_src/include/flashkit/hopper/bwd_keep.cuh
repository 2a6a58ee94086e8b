// A mask_mod's element mask on the backward's partial visits (FLASHKIT_MASK_MOD), evaluated off the consumers'
// path: the producer warpgroup's warps besides the loading thread's (Kt::kMaskThreads threads, idle otherwise)
// write, for visit i, every consumer thread's word of keep bits into Q stage i % kStages (BwdCta::keep_word), then
// arrive on that stage's full barrier, which completes with Q's bytes; a consumer reads its word once Q has landed
// (BwdConsumerBase::staged_keep). Before, each consumer thread evaluated its 32 (key, query) pairs at the top of
// the visit: the evaluation cost the consumers' chain its time, and at hd128 non-causal 32-48 B of spills on
// 128-key blocks.
// Bit Kt::kKeepRowBits h + 2 ni + c of consumer thread (consumer, tid)'s word keeps its S^T element (key row
// warp_row + 8 h, query col2 + 8 ni + c: fragment.cuh's m16n8 conventions, bwd_consumer_base.cuh's place); the
// words of full visits are not written (the consumers do not read them). Indices are clamped into the sequences
// (functor.cuh's contract).
#pragma once

#include "flashkit/functor.cuh"
#include "flashkit/hopper/bwd_cta.cuh"

namespace flashkit {
namespace hopper {

#if FLASHKIT_MASK_MOD
// The keep bits of consumer thread `word` (0 .. kConsumerThreads - 1) on the visit of query block m0 of `head`.
template <class Kt>
__device__ __forceinline__ u32 keep_bits(const Params& p, int batch, int head, int n_block, int m0, int word) {
    const int consumer = word / gmma::kWarpgroupThreads, tid = word % gmma::kWarpgroupThreads;
    const int lane = tid % kWarpSize;
    // the consumer's place (bwd_consumer_base.cuh): key0 + warp_row, and its first query s_query0 + col2
    const int key0 = n_block * Kt::kBlockN + (Kt::kSplitColumns ? 0 : consumer * Kt::kConsumerKeys) +
                     tid / kWarpSize * kMmaM + lane / kQuadLanes;
    const int query0 = m0 + (Kt::kSplitColumns ? consumer * Kt::kSQueries : 0) + kFragCols * (lane % kQuadLanes);
    u32 bits = 0;
#pragma unroll 1
    for (int h = 0; h < 2; ++h) {
        const int key = min(key0 + h * kFragRowHalf, p.seqlen_k - 1);
#pragma unroll 1
        for (int c = 0; c < Kt::kKeepRowBits; ++c) {
            const int query = min(query0 + (c >> 1) * kMmaN + (c & 1), p.seqlen_q - 1);
            bits |= static_cast<u32>(::mask_mod(batch, head, query, key, p.mods.args)) << (h * Kt::kKeepRowBits + c);
        }
    }
    return bits;
}

// A mask thread's run: every visit of the CTA in the producer's order; the partial ones' words, kMaskThreads apart.
template <class Kt, class Visits>
__device__ __forceinline__ void bwd_stage_keeps(const Params& p, const BwdCta<Kt>& cta, const Visits& visits,
                                                int n_block, int batch) {
    for (int i = 0; i < visits.total; ++i) {
        const BwdVisit at = visits.at(i);
        cta.q_ring.wait_empty(i);   // every consumer is done with the stage's previous visit (and its words)
        if (at.partial) {
            for (int word = cta.tid - kWarpSize; word < Kt::kConsumerThreads; word += Kt::kMaskThreads)
                cta.store_keep(i, word, keep_bits<Kt>(p, batch, at.head, n_block, at.m_block * Kt::kBlockM, word));
        }
        cta.q_ring.co_fill(i);   // release: the words before the stage completes
    }
}
#else
template <class Kt, class Visits>
__device__ __forceinline__ void bwd_stage_keeps(const Params&, const BwdCta<Kt>&, const Visits&, int, int) {}
#endif

}  // namespace hopper
}  // namespace flashkit
