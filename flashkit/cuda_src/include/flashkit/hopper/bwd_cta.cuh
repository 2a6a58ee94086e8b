// What every role of a warp-specialized Hopper backward CTA shares: its barriers and stage rings, the
// tensor maps, and the sequence of visits (query head, query block) that the producer and every consumer
// walk in the same order.
//   kv_full   K and V of the key block landed (one phase: loaded once)
//   q_ring    Q and the lse2 row of visit i in stage i % kStages (full: landed, and a mask_mod's keep bits of the
//             visit written; empty: every consumer thread is done with it)
//   do_ring   dO of visit i, likewise (a ring of its own, so that S^T = K Q^T starts before dO lands)
#pragma once

#include "flashkit/bwd_passes.cuh"
#include "flashkit/bwd_visits.cuh"
#include "flashkit/hopper/bwd_traits.cuh"

namespace flashkit {
namespace hopper {

struct BackwardMaps {
    const TensorMap& q;
    const TensorMap& k;
    const TensorMap& v;
    const TensorMap& dout;
};

// The visit's query block of dq_accum (Kt::DqLayout) at a consumer's first dQ column col0 (BwdShare's dq_col0; 0
// where the consumers take dQ by turns).
template <class Kt>
__device__ __forceinline__ float* dq_block(const BwdWorkspace<Kt::kBlockM, Kt::kHeadDim>& ws, index_t ws_row,
                                          int col0) {
    return ws.dq_accum + ws_row * Kt::kHeadDim + Kt::DqLayout::template offset<Kt::kHeadDim>(0, col0);
}

// The deterministic dQ order, for the thread about to add a panel: wait until the semaphore reads `turn` (the panels
// before this one have been added: bwd_passes.cuh's wait_semaphore), then order their bulk adds before this one's.
__device__ __forceinline__ void await_dq_turn(const int* sema, int turn) {
    wait_semaphore(sema, turn);
    fence_proxy_async_global();
}

// One thread: dq_accum block += `panels` staged dQ panels, by one bulk reduction; `complete`: wait until the adds are
// done and visible to the next panel in the deterministic order, else only commit them.
template <class Kt>
__device__ __forceinline__ void reduce_panel(float* block, u32 panel, bool complete, int panels = 1) {
    bulk_reduce_add(block, panel, panels * Kt::DqLayout::kPanelBytes);
    bulk_commit();
    if (complete) {
        bulk_wait();
        fence_proxy_async_global();
        __threadfence();
    }
}

// Where thread `tid` (0 .. 127) of a consumer warpgroup sits in the wgmma accumulator layout (fragment.cuh's m16n8
// conventions): its first row, 16 warp + g (a key of S^T), and its first column within an 8-wide tile, 2 t.
struct ConsumerPlace {
    int row, col2;
    __device__ __forceinline__ explicit ConsumerPlace(int tid) {
        const int lane = tid % kWarpSize;
        row = tid / kWarpSize * kMmaM + lane / kQuadLanes;
        col2 = kFragCols * (lane % kQuadLanes);
    }
};

template <class Kt>
struct BwdCta : WsRoles {   // smem: the layout in bwd_traits.cuh
    typedef typename Kt::Ring Ring;
    Ring q_ring, do_ring;
    u32 kv_full;

    // Every thread: carve shared memory, set the barriers up (thread 0) and publish them.
    __device__ __forceinline__ explicit BwdCta(u32 smem_)
        : WsRoles(smem_), q_ring(smem_ + Kt::kQRingOffset),
          do_ring(smem_ + Kt::kDoRingOffset), kv_full(smem_ + Kt::kKvBarOffset) {
        if (tid == 0) {
            mbarrier_init(kv_full, 1);
            q_ring.init(Kt::kConsumerThreads, Kt::kMaskThreads);   // a mask_mod's keep bits complete Q's stage
            do_ring.init(Kt::kConsumerThreads);
            fence_barrier_init();
        }
        __syncthreads();
    }
    __device__ __forceinline__ u32 q_tile(int visit) const {
        return smem + Kt::kQOffset + Ring::stage(visit) * Kt::kQStageBytes;
    }
    __device__ __forceinline__ u32 do_tile(int visit) const {
        return smem + Kt::kDoOffset + Ring::stage(visit) * Kt::kDoStageBytes;
    }
    // The address of a mask_mod's keep bits of consumer thread `thread` (0 .. kConsumerThreads - 1) for visit i: in
    // Q's stage with mask warps, else the thread's one word (Kt::kKeepSets).
    __device__ __forceinline__ u32 keep_word(int visit, int thread) const {
        const int set = Kt::kKeepSets > 1 ? Ring::stage(visit) : 0;
        return smem + Kt::kKeepOffset + set * Kt::kKeepStageBytes + thread * 4;
    }
    // The producer warpgroup's threads that write those bits (every warp but the loading thread's).
    __device__ __forceinline__ bool mask_thread() const { return Kt::kMaskWarps > 0 && producer() && tid >= kWarpSize; }
    // The producer warpgroup's warps that issue the dQ reductions, one a consumer (bwd_dq_writer.cuh), where
    // Kt::kDqWriter.
    __device__ __forceinline__ bool dq_writer() const {
        const int warp = tid / kWarpSize;
        return Kt::kDqWriter && producer() && warp >= Kt::kDqWriterWarp0 && warp < Kt::kDqWriterWarp0 + Kt::kConsumers;
    }
    // The visit's lse2 row (kBlockM floats), landed with Q (its stage's full barrier); only where Kt::kStagedRows.
    __device__ __forceinline__ u32 lse2_row(int visit) const {
        return smem + Kt::kLse2Offset + Ring::stage(visit) * Kt::kRowVecBytes;
    }
    __device__ __forceinline__ u32 ds_tile(int visit) const {   // dS^T, by visit parity
        return smem + Kt::kDsOffset + (visit % Kt::kDsBuffers) * Kt::kDsBufferBytes;
    }
    // A consumer's staged dQ: split by keys, its own panel; split by columns, the panels of its columns from col0
    // (BwdShare's dq_col0) in the staged block.
    __device__ __forceinline__ u32 dq_panel(int consumer) const {
        static_assert(Kt::kDqBulk && !Kt::kSplitColumns, "split by keys, dQ staged");
        return smem + Kt::kDqOffset + consumer * Kt::kDqBufferBytes;
    }
    __device__ __forceinline__ u32 dq_columns(int col0) const {
        static_assert(Kt::kDqBulk && Kt::kSplitColumns, "split by columns, dQ staged");
        return smem + Kt::kDqOffset + col0 / Kt::kPanelElems * Kt::kDqBufferBytes;
    }
    __device__ __forceinline__ u32 dq_staging(int consumer, int col0) const {
        if constexpr (Kt::kSplitColumns) return dq_columns(col0);
        else return dq_panel(consumer);
    }
    __device__ __forceinline__ u32 pt_tile(int visit) const {   // P^T (split by columns), by visit parity
        static_assert(Kt::kPtBuffers == Kt::kDsBuffers, "P^T is shared only when the consumers split columns");
        return smem + Kt::kPtOffset + (visit % Kt::kPtBuffers) * Kt::kDsBufferBytes;
    }
};

}  // namespace hopper
}  // namespace flashkit
