// The warp-specialized Hopper forward (FlashAttention-3's design): what every Hopper forward variant
// drives with its mask, for one query tile a CTA or for every tile a persistent scheduler gives the CTA
// (tile_scheduler.cuh). ws_cta.cuh holds what carries over from tile to tile. Thread roles:
//   warpgroup 0 (producer)     gives registers back (setmaxnreg.dec); one thread issues the TMA loads of
//                              Q and of the K/V stage rings for each tile (ws_producer.cuh)
//   warpgroups 1.. (consumers) take registers (setmaxnreg.inc); each runs, per tile, the products and the
//                              softmax of its 64 query rows in ping-pong order (ws_mainloop.cuh), then O
//                              by TMA store and the LSE (tma_epilogue.cuh), then hands the Q tile back
// A tile whose mask visits no K/V tile writes O = 0 and LSE = -inf without touching the rings.
// Each role runs the variant's tile loop on its own branch, after its setmaxnreg: ptxas gives a region
// the register budget of the setmaxnreg that dominates it, so the roles must not share code after it.
#pragma once

#include "flashkit/hopper/tile_scheduler.cuh"
#include "flashkit/hopper/tma_epilogue.cuh"
#include "flashkit/hopper/ws_cta.cuh"
#include "flashkit/hopper/ws_mainloop.cuh"
#include "flashkit/hopper/ws_producer.cuh"
#include "flashkit/varlen.cuh"

namespace flashkit {
namespace hopper {

// The 1024 B aligned base of the dynamic shared memory (the layout in ws_traits.cuh).
__device__ __forceinline__ u32 ws_smem_base() {
    return (smem_u32(dynamic_smem()) + gmma::kTileAlign - 1) & ~static_cast<u32>(gmma::kTileAlign - 1);
}

// Query block m_block of (head, batch): `mask` (mask.cuh's interface) says which K/V tiles the block
// visits, in which order, and which of them need the element mask. `origin`: where the sequence's row 0
// lies in the tensors the maps describe (row 0 of `batch`, or a packed varlen sequence's first row).
template <class Kt, class Mask>
__device__ __forceinline__ void produce_tile(WsCta<Kt>& cta, const Params& p, const ForwardMaps& maps,
                                             const Mask& mask, int m_block, int head, int batch,
                                             const SeqOrigin& origin) {
    const int n_blocks = mask.num_kv_blocks();
    const int kv_head = head / (p.heads / p.kv_heads);   // GQA / MQA: the kv head of this query head
    produce<Kt>(cta, p, mask, n_blocks, maps, TileCoords{origin.q_row + m_block * Kt::kBlockM, head, origin.batch},
                TileCoords{origin.k_row, kv_head, origin.batch}, batch);
    cta.advance(n_blocks);
}

// The same tile on a consumer warpgroup. Mainloop: the precision's products and softmax (ws_mainloop.cuh's
// WsMainloop for 16-bit inputs; fp8_ws_mainloop.cuh's for e4m3), with ScoreMod (score_mod.cuh) modifying the
// scores before the softmax.
template <class Kt, class ScoreMod, template <class, class, class> class Mainloop, class Mask>
__device__ __forceinline__ void consume_tile(WsCta<Kt>& cta, const Params& p, const ForwardMaps& maps,
                                             const Mask& mask, int m_block, int head, int batch,
                                             const SeqOrigin& origin) {
    const int n_blocks = mask.num_kv_blocks();
    const TileCoords q_at{m_block * Kt::kBlockM, head, batch};   // rows within the sequence
    const int consumer = Kt::kUniformConsumer ? warp_uniform(cta.consumer()) : cta.consumer();
    const int tid_in_group = cta.tid % gmma::kWarpgroupThreads;
    const int lane = cta.tid % kWarpSize;
    typedef Mainloop<Kt, Mask, ScoreMod> Loop;
    Loop loop(mask, p, head, batch, cta.smem, consumer, q_at.row);
    mbarrier_wait(cta.q_full, static_cast<u32>(cta.tiles) & 1u);   // Q landed (or an empty tile announced)
    if (n_blocks > 0) {   // (with kOwnOTile, hands Q back after its last S)
        const int row0 = q_at.row + consumer * gmma::kWarpgroupRows + tid_in_group / kWarpSize * Kt::kWarpRows +
                         lane / kQuadLanes;
        const typename TurnsOf<Loop::kPingPong, Kt::kConsumers>::type turn(consumer);
        // (only where a tile has more rows than keys: on 128 x 128 tiles every consumer sees the same key tiles
        // when seqlen_q = seqlen_k, and the pass-by code measured 5% slower at hd64 2k causal)
        constexpr bool kPass = kPassUnseen && Kt::kBlockM > Kt::kBlockN;
        const int skip = kPass ? unseen_leading_visits(mask, q_at.row + consumer * gmma::kWarpgroupRows,
                                                       gmma::kWarpgroupRows, p.seqlen_q)
                               : 0;
        consumer_mainloop<Kt>(loop, turn, cta, n_blocks, skip, row0, kFragCols * (lane % kQuadLanes));
    } else if constexpr (Kt::kOwnOTile) {
        mbarrier_arrive(cta.q_empty);
    }
    float lse[1][2];
    loop.finalize(lse);
    // In a persistent loop the epilogue takes a fresh thread index (fresh_thread_index): ptxas otherwise formed the
    // O staging addresses once before the loop and held them over every tile's main loop (16 registers), which made
    // the mask_mod functors' builds spill there (measured 5-8% faster persistent at hd128, BENCHMARKS.md).
    const int epilogue_tid = FLASHKIT_PERSISTENT ? fresh_warpgroup_thread() : tid_in_group;
    store_output_tma<Kt>(loop.acc_o, lse, cta.smem, consumer, maps.o, p, q_at, origin, epilogue_tid);
    if (!Kt::kOwnOTile && tid_in_group == 0) mbarrier_arrive(cta.q_empty);   // its O has left the Q rows
    cta.advance(n_blocks);
}

// A role's work on one tile, as the variant's tile loop calls it: visit(p, mask, m_block, head, batch, origin).
// (Function objects, not generic lambdas: NVRTC 13.0 takes an `auto` lambda parameter for host code.)
template <class Kt>
struct ProduceTile {
    WsCta<Kt>& cta;
    const ForwardMaps& maps;
    template <class Mask>
    __device__ __forceinline__ void operator()(const Params& p, const Mask& mask, int m_block, int head, int batch,
                                               const SeqOrigin& origin) const {
        produce_tile<Kt>(cta, p, maps, mask, m_block, head, batch, origin);
    }
};
template <class Kt, class ScoreMod, template <class, class, class> class Mainloop>
struct ConsumeTile {
    WsCta<Kt>& cta;
    const ForwardMaps& maps;
    template <class Mask>
    __device__ __forceinline__ void operator()(const Params& p, const Mask& mask, int m_block, int head, int batch,
                                               const SeqOrigin& origin) const {
        consume_tile<Kt, ScoreMod, Mainloop>(cta, p, maps, mask, m_block, head, batch, origin);
    }
};

// The forward of every tile `tiles` names: tiles(visit) calls visit(p, mask, m_block, head, batch, origin)
// for each of the CTA's tiles, in the same order on every call (the variant's scheduler and masks).
template <class Kt, class ScoreMod, class TileLoop, template <class, class, class> class Mainloop = WsMainloop>
__device__ __forceinline__ void ws_forward_tiles(const ForwardMaps& maps, const TileLoop& tiles) {
    WsCta<Kt> cta(ws_smem_base());
    if (cta.producer()) {
        release_registers<Kt::kProducerRegs>();
        if (cta.issuer()) tiles(ProduceTile<Kt>{cta, maps});
        return;
    }
    claim_registers<Kt::kConsumerRegs>();
    tiles(ConsumeTile<Kt, ScoreMod, Mainloop>{cta, maps});
    drain_output_stores<Kt>(cta.tid % gmma::kWarpgroupThreads);
}

// The tile loop of a CTA that handles one tile (the q_blocks grid).
template <class Mask>
struct OneTile {
    const Params& p;
    const Mask& mask;
    int m_block, head, batch;
    SeqOrigin origin;
    template <class Visit>
    __device__ __forceinline__ void operator()(const Visit& visit) const {
        visit(p, mask, m_block, head, batch, origin);
    }
};

// The tile loop of a `tiles` grid: the CTA's tiles in the scheduler's order (tile_scheduler.cuh; causal: each
// head's heaviest block first), each with its sequence's view (kVarlen: varlen.cuh) and its Mask.
template <class Mask, int kBlockM, bool kCausal, bool kVarlen>
struct ScheduledTiles {
    const Params& params;
    template <class Visit>
    __device__ __forceinline__ void operator()(const Visit& visit) const {
        const SnakeScheduler<kBlockM, kCausal> scheduler(params);
        scheduler.for_each_tile([&](const TileIndex& t) {
            for_sequence<kVarlen, kBlockM>(params, t.batch, t.m_block, [&](const Params& p, const SeqOrigin& origin) {
                visit(p, make_mask<Mask>(p, t.m_block, t.head, t.batch), t.m_block, t.head, t.batch, origin);
            });
        });
    }
};

template <class Kt, class ScoreMod = NoScoreMod, class Mask>
__device__ __forceinline__ void ws_forward(const Params& p, const ForwardMaps& maps, const Mask& mask, int m_block,
                                           int head, int batch, const SeqOrigin& origin) {
    ws_forward_tiles<Kt, ScoreMod>(maps, OneTile<Mask>{p, mask, m_block, head, batch, origin});
}

}  // namespace hopper
}  // namespace flashkit
