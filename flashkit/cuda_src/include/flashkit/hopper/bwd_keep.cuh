// A mask_mod's element mask on the backward's partial visits (FLASHKIT_MASK_MOD), as a word of keep bits per consumer
// thread and visit in Q's stage (BwdCta::keep_word). Who evaluates it is the build's choice (launch flag mask_warps):
//   the consumer thread itself, at the top of the visit (BwdConsumerBase::stage_keep), or
//   with FLASHKIT_MASK_WARPS, the producer warpgroup's warps besides the loading thread's (Kt::kMaskThreads threads,
//     idle otherwise; bwd_stage_keeps): for visit i they write every consumer thread's word into Q stage i % kStages,
//     then arrive on that stage's full barrier, which completes with Q's bytes.
// Measured (BENCHMARKS.md): at hd128 non-causal the consumers' evaluation spilled 32-48 B on 128-key blocks, and the
// mask warps there run the document and prefix-LM backward 1.45-1.57x faster than the column split of 64-key blocks
// did; where most visits are partial (a causal document mask) the 96 mask threads, one evaluation at a time in 32
// registers, fall behind the consumers (1.3x slower at hd128, 2x at hd64), so causal builds keep the consumers'.
// Bit Kt::kKeepRowBits h + 2 ni + c of a consumer thread's word keeps its S^T element (key row warp_row + 8 h, query
// col2 + 8 ni + c: fragment.cuh's m16n8 conventions, bwd_consumer_base.cuh's place); the words of full visits are
// not written (the consumers do not read them). Indices are clamped into the sequences (functor.cuh's contract).
#pragma once

#include "flashkit/functor.cuh"
#include "flashkit/hopper/bwd_cta.cuh"

namespace flashkit {
namespace hopper {

#if FLASHKIT_MASK_MOD
// The keep bits of consumer thread `word` (0 .. kConsumerThreads - 1) on the visit of query block m0 of `head`, for a
// mask thread: the consumer's place (bwd_consumer_base.cuh: key rows key0 + warp_row (+ 8), queries s_query0() +
// col2 + 8 ni + c), evaluated one at a time (unrolled, the evaluation spilled at the producer warpgroup's 32
// registers). The consumers' own evaluation (stage_keep) is the same loop, unrolled by kMaskModUnroll.
template <class Kt>
__device__ __forceinline__ u32 word_bits(const Params& p, int batch, int head, int n_block, int m0, int word) {
    const int consumer = word / gmma::kWarpgroupThreads;
    const ConsumerPlace at(word % gmma::kWarpgroupThreads);
    const int key0 = n_block * Kt::kBlockN + (Kt::kSplitColumns ? 0 : consumer * Kt::kConsumerKeys) + at.row;
    const int query0 = m0 + (Kt::kSplitColumns ? consumer * Kt::kSQueries : 0) + at.col2;
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
                st_shared_b32(cta.keep_word(i, word),
                              word_bits<Kt>(p, batch, at.head, n_block, at.m_block * Kt::kBlockM, word));
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
