// One consumer warpgroup of the warp-specialized Hopper forward: the products, the softmax and
// their order (FlashAttention-3, sections 3.1-3.2). Per visited K/V tile i (keys [n0, n0 + kBlockN)):
//   S_i = Q K_i^T              wgmma m64 n{kBlockN} k16, Q and K_i from shared memory (K-major)
//   S_i = mod(S_i)             softcap / ALiBi (score_mod.cuh; NoScoreMod: nothing)
//   S_i = -inf where masked    only on the tiles the mask says cross a boundary
//   {m, l}, P_i = exp2(S_i c - m c)   OnlineSoftmax (c = softmax_scale log2 e); O owes alpha
//   O += P_i V_i               wgmma m64 n{kHeadDimV} k16, P from registers (A), V_i read MN-major
// Order, with i - 1's P V still owed:
//   wait turn (ping-pong); issue S_i, then O += P_{i-1} V_{i-1}; pass the turn
//   wait S_i; hand K_i back; softmax of S_i     (under P_{i-1} V_{i-1} and the other warpgroup's products)
//   wait P V; hand V_{i-1} back; O *= alpha_i; P_i -> 16-bit A fragments
// The ping-pong (named barriers, one per consumer) makes the warpgroups issue their products in
// turn, so that one warpgroup's softmax runs while the tensor cores serve the other's products; a main loop
// may ask for FreeIssue instead (kPingPong = false: fp8's, whose products are short beside its softmax).
#pragma once

#include "flashkit/hopper/timeline.cuh"
#include "flashkit/hopper/ws_cta.cuh"
#include "flashkit/fragment.cuh"
#include "flashkit/mask.cuh"
#include "flashkit/score_mod.cuh"
#include "flashkit/softmax.cuh"

namespace flashkit {
namespace hopper {

// Consumers issue their tensor-core work in the cyclic order 0, 1, .., kConsumers - 1, 0, ...:
// consumer c waits on its barrier (completed by its predecessor's pass) and passes to c + 1.
template <int kConsumers>
struct PingPong {
    static constexpr int kPairThreads = 2 * gmma::kWarpgroupThreads;   // one waiter, one passer
    int me;

    __device__ __forceinline__ explicit PingPong(int consumer) : me(consumer) {}
    // Consumer 0 goes first: the last consumer opens its turn.
    __device__ __forceinline__ void start() const {
        if (me == kConsumers - 1) named_arrive(kSchedulerBarrierBase, kPairThreads);
    }
    __device__ __forceinline__ void wait_turn() const { named_sync(kSchedulerBarrierBase + me, kPairThreads); }
    __device__ __forceinline__ void pass_turn() const {
        named_arrive(kSchedulerBarrierBase + (me + 1) % kConsumers, kPairThreads);
    }
    // After the last product: consumer 0 takes the turn the last consumer's final pass opened,
    // so that no barrier is left half-arrived.
    __device__ __forceinline__ void finish() const {
        if (me == 0) wait_turn();
    }
};

// S = Q K^T of a consumer's 64 rows (Q tile rows from q_row0) and the K tile in ring slot `slot`, on Kt::Element's
// wgmma (k16 for 16-bit, k32 for e4m3: 32 bytes a step either way); asynchronous, the first k-step overwrites s.
// Every precision's main loop issues its scores so.
template <class Kt>
__device__ __forceinline__ void issue_qk(float (&s)[Kt::kNTiles][4], u32 q_tile, int q_row0, u32 k_tiles, int slot) {
    const u32 k_tile = k_tiles + Kt::Ring::stage(slot) * Kt::kKStageBytes;
    gmma::fence();
#pragma unroll
    for (int kk = 0; kk < Kt::kQKSteps; ++kk)
        gmma::Mma<typename Kt::Element, Kt::kBlockN>::ss(s, Kt::QTile::desc(q_tile, q_row0, kk * gmma::kKBytes),
                                                         Kt::KTile::desc(k_tile, 0, kk * gmma::kKBytes), kk > 0);
    gmma::commit();
}

// No turns: each consumer issues its products as soon as its operands have landed. The fp8 main loop's choice:
// at e4m3's rate a tile's products are short beside its softmax, and the turns only add waits (measured in one
// run without them: 4-8% faster at hd128, 6-10% at hd64, the same at hd256; bf16 is 1-8% slower without them).
struct FreeIssue {
    __device__ __forceinline__ explicit FreeIssue(int) {}
    __device__ __forceinline__ void start() const {}
    __device__ __forceinline__ void wait_turn() const {}
    __device__ __forceinline__ void pass_turn() const {}
    __device__ __forceinline__ void finish() const {}
};

// The 16-bit main loop's order (launch flag free_issue, FLASHKIT_FREE_ISSUE): FreeIssue where a manifest says so.
// Measured on the H200 against the turns: 0.2-3% faster on hd192 / hd256's 128 x 64 tiles, mixed at hd128 (ALiBi 5%
// slower), 2-8% slower on three consumers (hd64, hd96), whose turns keep one consumer's softmax under two others'
// products.
#ifndef FLASHKIT_FREE_ISSUE
#define FLASHKIT_FREE_ISSUE 0
#endif
constexpr bool kFreeIssue = FLASHKIT_FREE_ISSUE != 0;

// The issue order a main loop asks for (Loop::kPingPong).
template <bool kPingPong, int kConsumers>
struct TurnsOf {
    typedef PingPong<kConsumers> type;
};
template <int kConsumers>
struct TurnsOf<false, kConsumers> {
    typedef FreeIssue type;
};

// Where an unmasked visit takes its row maxima (launch flag max_first, FLASHKIT_MAX_FIRST): before the per-element
// modification, so that the maxima and the shuffles between lanes need not wait for it:
//   softcap (MonotoneMod): over the raw scores, mapped once a row (max(mod(S)) = mod(max(S)));
//   ALiBi (LinearBias) on a tile left of every row's diagonal: over v = S + slope k, one FFMA a score where the exact
//     bias takes two, with the row term slope (diag - col0) added once a row (OnlineSoftmax::update_max_offset).
// Measured on the H200 against the modification first (interleaved A/B): softcap 30 5-8% faster at hd256 (2k-16k,
// causal or not), 4-6% slower at hd64 and hd128, up to 9% at hd96 and 6% at hd192; ALiBi 4-14% faster at hd256, 1-11%
// slower at hd64 and hd128 (the same causal at hd128, 5% slower non-causal), 2-14% at hd192. A manifest sets it per head dim.
#ifndef FLASHKIT_MAX_FIRST
#define FLASHKIT_MAX_FIRST 0
#endif
constexpr bool kMaxFirst = FLASHKIT_MAX_FIRST != 0;

template <class Kt, class Mask, class ScoreMod = NoScoreMod>
struct WsMainloop {
    typedef typename Kt::Element Element;
    typedef typename Kt::VTile VTile;
    typedef typename Kt::Ring Ring;
    static constexpr int kBN = Kt::kBlockN;
    static constexpr bool kPingPong = !kFreeIssue;   // the consumers take turns to issue (PingPong), or not

    const Mask& mask;
    ScoreMod score_mod;
    u32 q_tile;          // this consumer's 64 rows start at row 64 * consumer of the Q tile
    u32 k_tiles, v_tiles;
    int q_row0;          // first Q tile row of this consumer
    float scale_log2;
    float acc_o[1][Kt::kDTiles][4];    // O: kHeadDimV columns
    float s[1][Kt::kNTiles][4];        // S_i, then its P (floats)
    u32 p_frag[Kt::kPVSteps][4];       // 16-bit P of the tile being multiplied (wgmma A operand)
    float alpha[1][2];                 // what O owes before its next product
    OnlineSoftmax<1> softmax;

    // (tile_row0: the tile's first query row within the sequence; the fp8 loop's row scales need it.)
    __device__ __forceinline__ WsMainloop(const Mask& mask_, const Params& p, int head, int batch, u32 smem,
                                          int consumer, int /*tile_row0*/)
        : mask(mask_), score_mod(p, head, batch), q_tile(smem + Kt::kQOffset), k_tiles(smem + Kt::kKOffset), v_tiles(smem + Kt::kVOffset),
          q_row0(consumer * gmma::kWarpgroupRows), scale_log2(p.softmax_scale_log2) {
        zero_fragments(acc_o);
        softmax.init();
    }

    // A visit's K stage has landed in ring slot `slot`: what the producer staged beside the tile (nothing here; the
    // fp8 loop's scales, stage_scales.cuh), read before the stage is handed back.
    __device__ __forceinline__ void stage_landed(int /*slot*/) {}

    // S_i = Q K_i^T from ring slot `slot` (asynchronous; the first k-step overwrites s).
    __device__ __forceinline__ void issue_scores(int slot) { issue_qk<Kt>(s[0], q_tile, q_row0, k_tiles, slot); }

    // O += P V_i from ring slot `slot` (asynchronous; p_frag stays untouched until it completes). k-step
    // kk: keys kStepKeys kk .. + kStepKeys - 1, rows of the V tile.
    __device__ __forceinline__ void issue_pv(int slot) {
        const u32 v_tile = v_tiles + Ring::stage(slot) * Kt::kVStageBytes;
        gmma::fence();
#pragma unroll
        for (int kk = 0; kk < Kt::kPVSteps; ++kk)
            gmma::MmaBT<Element, Kt::kHeadDimV>::rs(acc_o[0], p_frag[kk],
                                                    VTile::desc_mn_major(v_tile, kk * Kt::kStepKeys), 1);
        gmma::commit();
    }

    // S_i (landed) -> P_i in place, and alpha; keys of tile n_block, thread's rows from row0.
    template <bool kMasked>
    __device__ __forceinline__ void softmax_step(int n_block, int row0, int col_lane) {
        gmma::fence_registers(s[0]);
        if constexpr (kMaxFirst && !kMasked && LinearBias<ScoreMod>::value) {   // ALiBi left of the diagonal
            const int warp_row0 = row0 - static_cast<int>(threadIdx.x % kWarpSize) / kQuadLanes;
            if (score_mod.left_of_diagonal(warp_row0, n_block * kBN + kBN - 1)) {
                float offset[1][2];
                apply_linear_bias(score_mod, s, row0, n_block * kBN + col_lane, offset);
                softmax.update_max_offset(s, alpha, scale_log2, offset);
                softmax.exponentiate_offset(s, scale_log2, offset);
                return;
            }
        }
        if constexpr (kMaxFirst && !kMasked && MonotoneMod<ScoreMod>::value) {   // max(mod(S)) = mod(max(S))
            softmax.update_max_mapped(s, alpha, scale_log2, score_mod);
            apply_score_mod<false>(score_mod, s, row0, n_block * kBN + col_lane);   // S = mod(S)
        } else {
            apply_score_mod<kMasked>(score_mod, s, row0, n_block * kBN + col_lane);   // S = mod(S)
            if constexpr (kMasked) apply_mask(mask, s, row0, n_block * kBN + col_lane);
            softmax.update_max(s, alpha, scale_log2);
        }
        softmax.exponentiate(s, scale_log2);
    }

    // After the previous P V completed: O *= alpha, and P (s) -> 16-bit A fragments.
    __device__ __forceinline__ void rescale_and_pack() {
        gmma::fence_registers(acc_o[0]);
        OnlineSoftmax<1>::rescale_if_owed(acc_o, alpha);
#pragma unroll
        for (int kk = 0; kk < Kt::kPVSteps; ++kk) pack_a_fragment<Element>(p_frag[kk], s[0], kk);
    }

    // After the last P V: O /= l, and the LSE.
    __device__ __forceinline__ void finalize(float (&lse)[1][2]) { softmax.finalize(acc_o, scale_log2, lse); }
};

// Where a consumer waits for its P V: with the launch flag defer_pv_wait (FLASHKIT_DEFER_PV_WAIT = 1), at the top
// of its next visit instead of at the end of the visit that issued it. Same waits, same order; what moves is the
// loop edge. With the wait in the visit's block, ptxas schedules it right after the row maxima (the PTX has it
// after the exponentials), so a consumer's exponentials never run under its own P V; across a loop edge it cannot
// hoist it. Measured 3-15% faster at hd96/128/192 (and with softcap / ALiBi), 1-3% slower at hd64 and hd256
// (BENCHMARKS.md), so a manifest sets it per head dim.
#ifndef FLASHKIT_DEFER_PV_WAIT
#define FLASHKIT_DEFER_PV_WAIT 0
#endif
constexpr bool kDeferPvWait = FLASHKIT_DEFER_PV_WAIT != 0;

// What a visit owes once its P V is issued: the product waited for, its V stage handed back (where `owed`: the
// deferred wait of visit 1 follows no P V), O *= alpha and the next P packed into the A fragments.
template <class Loop>
__device__ __forceinline__ void settle_pv(Loop& loop, const typename Loop::Ring& v_ring, int v_slot, bool owed) {
    gmma::wait<0>();
    if (owed) v_ring.release(v_slot);
    loop.rescale_and_pack();
}

// Visit i >= 1 of a consumer (ring slot `slot` = ring_pos + i): S_i and P_{i-1} V_{i-1} issued in this
// consumer's turn, the softmax of S_i under P_{i-1} V_{i-1}; P_{i-1} V_{i-1} settled at the end of the visit, or
// (kDeferPvWait) P_{i-2} V_{i-2} at its start.
template <bool kMasked, class Loop, class Turn>
__device__ __forceinline__ void consumer_step(Loop& loop, const Turn& turn, const typename Loop::Ring& k_ring,
                                              const typename Loop::Ring& v_ring, int i, int slot, int n_blocks,
                                              int row0, int col_lane) {
    timeline_stamp(i, kVisitStart);
    if constexpr (kDeferPvWait) settle_pv(loop, v_ring, slot - 2, i >= 2);
    timeline_stamp(i, kVisitSettled);
    k_ring.wait_full(slot);
    loop.stage_landed(slot);
    v_ring.wait_full(slot - 1);
    timeline_stamp(i, kOperandsIn);
    turn.wait_turn();
    loop.issue_scores(slot);
    loop.issue_pv(slot - 1);
    turn.pass_turn();
    timeline_stamp(i, kIssued);
    gmma::wait<1>();   // S_i landed; P_{i-1} V_{i-1} still running
    timeline_stamp(i, kScoresIn);
    k_ring.release(slot);
    loop.template softmax_step<kMasked>(loop.mask.kv_block(n_blocks - 1 - i), row0, col_lane);
    timeline_stamp(i, kSoftmaxDone);
    if constexpr (!kDeferPvWait) settle_pv(loop, v_ring, slot - 1, true);
}

// Where a consumer waits for each P V: with the launch flag serial_pv (FLASHKIT_SERIAL_PV = 1), before it issues its
// next S, so that S_{i+1} never lands in registers while P_i is still read by the tensor cores: a visit's S, softmax
// and P V run one after the other in one consumer, and the consumers' products overlap each other's softmax
// (FlashAttention-3 without its intra-warpgroup overlap). What it frees: S and P's A fragments are never live together
// (the register peak is O plus the larger of the two, not O plus both), which lets a wider table fit: e4m3 at hd128 on
// three consumers of 160 registers (a third warp a scheduler to hide the softmax's latency chains), and at hd256 on
// 128-key tiles, whose S = Q K^T on 64-key tiles reads 4 KB of shared memory every 32 tensor cycles (m64n64k32: the
// SM's 128 B a cycle). defer_pv_wait has nothing to defer there.
#ifndef FLASHKIT_SERIAL_PV
#define FLASHKIT_SERIAL_PV 0
#endif
constexpr bool kSerialPv = FLASHKIT_SERIAL_PV != 0;
static_assert(!(kSerialPv && kDeferPvWait), "serial_pv waits for each P V in its own visit: no defer_pv_wait beside it");

// A visit's S = Q K^T, at once: the K stage of ring slot `slot` landed, S issued in this consumer's turn and waited
// for, the stage handed back (the first visit of the main loop, and every visit under serial_pv).
template <class Loop, class Turn>
__device__ __forceinline__ void scores_now(Loop& loop, const Turn& turn, const typename Loop::Ring& k_ring, int i,
                                           int slot) {
    k_ring.wait_full(slot);
    loop.stage_landed(slot);
    timeline_stamp(i, kOperandsIn);
    turn.wait_turn();
    loop.issue_scores(slot);
    turn.pass_turn();
    timeline_stamp(i, kIssued);
    gmma::wait<0>();
    timeline_stamp(i, kScoresIn);
    k_ring.release(slot);
}

// A visit's O += P V, at once: the V stage of ring slot `slot` landed, the product issued in this consumer's turn and
// waited for, the stage handed back (the main loop's last visit, and every visit under serial_pv).
template <class Loop, class Turn>
__device__ __forceinline__ void pv_now(Loop& loop, const Turn& turn, const typename Loop::Ring& v_ring, int slot) {
    v_ring.wait_full(slot);
    turn.wait_turn();
    loop.issue_pv(slot);
    turn.pass_turn();
    gmma::wait<0>();
    v_ring.release(slot);
}

// Visit i of a consumer under serial_pv (ring slot `slot`): S_i, its softmax, O *= alpha, P_i packed, P_i V_i, each
// waited for before the next starts.
template <bool kMasked, class Loop, class Turn>
__device__ __forceinline__ void serial_step(Loop& loop, const Turn& turn, const typename Loop::Ring& k_ring,
                                            const typename Loop::Ring& v_ring, int i, int slot, int n_blocks, int row0,
                                            int col_lane) {
    timeline_stamp(i, kVisitStart);
    timeline_stamp(i, kVisitSettled);   // nothing owed here: the previous visit waited for its P V (in the "rest")
    scores_now(loop, turn, k_ring, i, slot);
    loop.template softmax_step<kMasked>(loop.mask.kv_block(n_blocks - 1 - i), row0, col_lane);
    timeline_stamp(i, kSoftmaxDone);
    loop.rescale_and_pack();   // O is settled: the previous visit waited for its P V
    pv_now(loop, turn, v_ring, slot);
}

// Where a consumer passes by the first visits of a causal tile that none of its rows sees (the launch flag
// pass_unseen, FLASHKIT_PASS_UNSEEN = 1; mask.cuh's unseen_leading_visits): with 192-row tiles, or 64-key tiles, the
// top consumer's rows see fewer key tiles than the bottom one's (8% of a 192 x 128 causal call's products at 4k).
#ifndef FLASHKIT_PASS_UNSEEN
#define FLASHKIT_PASS_UNSEEN 0
#endif
constexpr bool kPassUnseen = FLASHKIT_PASS_UNSEEN != 0;

// A visit a consumer passes by: the stages handed back in their phases (each after it has landed, so that an
// arrival never counts towards an earlier round of the stage) and the turn the visit's products would have taken.
template <class Turn, class Ring>
__device__ __forceinline__ void pass_visit(const Turn& turn, const Ring& k_ring, const Ring& v_ring, int slot) {
    k_ring.wait_full(slot);
    turn.wait_turn();
    turn.pass_turn();
    k_ring.release(slot);
    v_ring.wait_full(slot);
    v_ring.release(slot);
}

// The whole main loop of one consumer over the tile's n_blocks visited tiles (n_blocks > 0; Q has
// landed): visit i is tile mask.kv_block(n_blocks - 1 - i), in ring slot cta.ring_pos + i; the first
// num_masked_blocks() visits need the element mask. The first `skip` visits are passed by (pass_visit) and the rest
// run as a main loop of their own, its slots and visit numbers from the first one run. Masked and unmasked visits
// run in two copies of the step and the last P V is peeled: a branch between the wgmma waits would make ptxas wait
// for every product in flight.
template <class Kt, class Loop, class Turn>
__device__ __forceinline__ void consumer_mainloop(Loop& loop, const Turn& turn, const WsCta<Kt>& cta, int n_blocks,
                                                  int skip, int row0, int col_lane) {
    const typename Kt::Ring& k_ring = cta.k_ring;
    const typename Kt::Ring& v_ring = cta.v_ring;
    const int pos = cta.ring_pos + skip;
    // (every visit passed by is a masked one, but for a consumer wholly past seqlen_q: its one visit may then run
    // unmasked, on rows that are never stored)
    const int n_masked = loop.mask.num_masked_blocks() - skip;
    n_blocks -= skip;
    turn.start();
#pragma unroll 1
    for (int i = 0; i < skip; ++i) pass_visit(turn, k_ring, v_ring, cta.ring_pos + i);
    if constexpr (kSerialPv) {
        // A serial visit issues in two turns and a passed-by one in one, so consumers passing different numbers of
        // visits would take the ping-pong barriers out of step: serial_pv issues freely.
        static_assert(!Loop::kPingPong, "serial_pv runs without ping-pong turns (free_issue: 1, or fp8's FreeIssue)");
        int i = 0;
        for (; i < n_blocks && i < n_masked; ++i)
            serial_step<true>(loop, turn, k_ring, v_ring, i, pos + i, n_blocks, row0, col_lane);
        for (; i < n_blocks; ++i) serial_step<false>(loop, turn, k_ring, v_ring, i, pos + i, n_blocks, row0, col_lane);
        if constexpr (Kt::kOwnOTile) mbarrier_arrive(cta.q_empty);   // every S has read Q: the next tile's may load
        gmma::fence_registers(loop.acc_o[0]);
        turn.finish();
        return;
    }
    scores_now(loop, turn, k_ring, 0, pos);
    if (n_masked > 0) loop.template softmax_step<true>(loop.mask.kv_block(n_blocks - 1), row0, col_lane);
    else loop.template softmax_step<false>(loop.mask.kv_block(n_blocks - 1), row0, col_lane);
    if constexpr (!kDeferPvWait) loop.rescale_and_pack();
    int i = 1;
    for (; i < n_blocks && i < n_masked; ++i)
        consumer_step<true>(loop, turn, k_ring, v_ring, i, pos + i, n_blocks, row0, col_lane);
    for (; i < n_blocks; ++i) consumer_step<false>(loop, turn, k_ring, v_ring, i, pos + i, n_blocks, row0, col_lane);
    if constexpr (Kt::kOwnOTile) mbarrier_arrive(cta.q_empty);   // every S has read Q: the next tile's may load
    const int last = pos + n_blocks - 1;
    if constexpr (kDeferPvWait) settle_pv(loop, v_ring, last - 1, n_blocks >= 2);
    pv_now(loop, turn, v_ring, last);
    gmma::fence_registers(loop.acc_o[0]);
    turn.finish();
}

}  // namespace hopper
}  // namespace flashkit
