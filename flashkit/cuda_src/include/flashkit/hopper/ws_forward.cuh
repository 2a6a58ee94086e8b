// The warp-specialized Hopper forward of one query block (FlashAttention-3's design): what every
// Hopper forward variant drives with its mask. Thread roles, after the barriers are set up:
//   warpgroup 0 (producer)     gives registers back (setmaxnreg.dec); one thread issues the TMA
//                              loads of Q and of the K/V stage rings (ws_producer.cuh)
//   warpgroups 1.. (consumers) take registers (setmaxnreg.inc); each runs the products and the
//                              softmax of its 64 query rows in ping-pong order (ws_mainloop.cuh),
//                              then O by TMA store and the LSE (tma_epilogue.cuh)
// A block whose mask visits no tile writes O = 0 and LSE = -inf without touching the rings.
#pragma once

#include "flashkit/hopper/tma_epilogue.cuh"
#include "flashkit/hopper/ws_mainloop.cuh"
#include "flashkit/hopper/ws_producer.cuh"
#include "flashkit/varlen.cuh"

namespace flashkit {
namespace hopper {

struct ForwardMaps {
    const TensorMap& q;
    const TensorMap& k;
    const TensorMap& v;
    const TensorMap& o;
};

// The forward of query block m_block of (head, batch); `mask` (mask.cuh's interface) says which
// K/V tiles the block visits, in which order, and which of them need the element mask; ScoreMod
// (score_mod.cuh) modifies the scores before the softmax. `origin`: where the sequence's row 0 lies in
// the tensors the maps describe (row 0 of `batch`, or a packed varlen sequence's first row; varlen.cuh).
template <class Kt, class ScoreMod = NoScoreMod, class Mask>
__device__ __forceinline__ void ws_forward(const Params& p, const ForwardMaps& maps, const Mask& mask, int m_block,
                                           int head, int batch, const SeqOrigin& origin) {
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const u32 smem = (smem_u32(smem_raw) + gmma::kTileAlign - 1) & ~static_cast<u32>(gmma::kTileAlign - 1);
    const int tid = threadIdx.x;
    const int warpgroup = tid / gmma::kWarpgroupThreads;
    const typename Kt::Ring k_ring(smem + Kt::kKRingOffset);
    const typename Kt::Ring v_ring(smem + Kt::kVRingOffset);
    const u32 q_full = smem + Kt::kQBarOffset;
    if (tid == 0) {
        mbarrier_init(q_full, 1);
        k_ring.init(Kt::kConsumerThreads);
        v_ring.init(Kt::kConsumerThreads);
        fence_barrier_init();
    }
    __syncthreads();

    const int n_blocks = mask.num_kv_blocks();
    const TileCoords q_at{m_block * Kt::kBlockM, head, batch};   // rows within the sequence
    if (warpgroup == 0) {
        release_registers<Kt::kProducerRegs>();
        const int kv_head = head / (p.heads / p.kv_heads);   // GQA / MQA: the kv head of this query head
        if (tid == 0 && n_blocks > 0)
            produce<Kt>(mask, n_blocks, smem, q_full, k_ring, v_ring, maps.q, maps.k, maps.v,
                        TileCoords{origin.q_row + q_at.row, head, origin.batch},
                        TileCoords{origin.k_row, kv_head, origin.batch});
        return;
    }
    claim_registers<Kt::kConsumerRegs>();
    const int consumer = warpgroup - 1;
    const int tid_in_group = tid % gmma::kWarpgroupThreads;
    const int lane = tid % kWarpSize;
    WsMainloop<Kt, Mask, ScoreMod> loop(mask, p, head, batch, smem, consumer);
    if (n_blocks > 0) {
        const int row0 = q_at.row + consumer * gmma::kWarpgroupRows + tid_in_group / kWarpSize * Kt::kWarpRows +
                         lane / kQuadLanes;
        const PingPong<Kt::kConsumers> turn(consumer);
        consumer_mainloop<Kt>(loop, turn, k_ring, v_ring, q_full, n_blocks, row0, kFragCols * (lane % kQuadLanes));
    }
    float lse[1][2];
    loop.softmax.finalize(loop.acc_o, p.softmax_scale_log2, lse);
    store_output_tma<Kt>(loop.acc_o, lse, smem, consumer, maps.o, p, q_at, origin, tid_in_group);
}

}  // namespace hopper
}  // namespace flashkit
