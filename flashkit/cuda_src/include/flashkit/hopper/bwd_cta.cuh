// What every role of a warp-specialized Hopper backward CTA shares: its barriers and stage rings, the
// tensor maps, and the sequence of visits (query head, query block) that the producer and every consumer
// walk in the same order.
//   kv_full   K and V of the key block landed (one phase: loaded once)
//   q_ring    Q and the lse2 row of visit i in stage i % kStages (full: landed, and a mask_mod's keep bits of the
//             visit written; empty: every consumer thread is done with it)
//   do_ring   dO of visit i, likewise (a ring of its own, so that S^T = K Q^T starts before dO lands)
#pragma once

#include "flashkit/bwd_lists.cuh"
#include "flashkit/bwd_passes.cuh"
#include "flashkit/hopper/bwd_traits.cuh"

namespace flashkit {
namespace hopper {

struct BackwardMaps {
    const TensorMap& q;
    const TensorMap& k;
    const TensorMap& v;
    const TensorMap& dout;
};

// One visit of a CTA: query block m_block of query head `head`; partial: a mask_mod's element mask applies.
struct BwdVisit {
    int head, m_block;
    bool partial;
};

// The visits of key block n_block: every query head of the kv head's group (GQA / MQA: dK, dV summed in
// the CTA), each over the query blocks that see any key of the block (Mask: bwd_mask.cuh).
template <int kBlockM, int kBlockN, class Mask, bool kListed = Mask::kListed>
struct BwdVisits {
    int group;     // query heads per kv head
    int m_begin;   // first visited query block of each head
    int n_m;       // visited query blocks per head
    int total;     // visits of the CTA (0: no query sees the block; dK = dV = 0)
    int head0;     // first query head of the group

    __device__ __forceinline__ BwdVisits(const Params& p, int n_block, int kv_head, int /*batch*/) {
        group = p.heads / p.kv_heads;
        head0 = kv_head * group;
        const Mask mask(p);
        const int n0 = n_block * kBlockN;
        m_begin = mask.m_begin(n0, kBlockM);
        n_m = max(mask.m_end(min(n0 + kBlockN, p.seqlen_k), kBlockM) - m_begin, 0);
        total = group * n_m;
    }
    __device__ __forceinline__ BwdVisit at(int i) const { return {head0 + i / n_m, m_begin + i % n_m, false}; }
    // Whether visit i exists; kFresh (BwdWsTraits::kFreshVisitCount): with the count formed again at each test from n_m
    // (live for at()) through a volatile move, rather than held over the visits as `total`.
    template <bool kFresh>
    __device__ __forceinline__ bool has(int i) const { return i < (kFresh ? group * fresh_value(n_m) : total); }
    // v = at(next), from v = at(next - 1), with no division (the loading thread's 24 registers).
    __device__ __forceinline__ void advance(BwdVisit& v, int /*next*/) const {
        if (++v.m_block == m_begin + n_m) {
            v.m_block = m_begin;
            ++v.head;
        }
    }
};

// With lists (a block mask or a mask_mod, bwd_lists.cuh): each head of the group visits its row's list of key
// block n_block (one row for every head where the lists broadcast over heads).
template <int kBlockM, int kBlockN, class Mask>
struct BwdVisits<kBlockM, kBlockN, Mask, true> {
    const Params& p;
    int head0, batch, n_block;
    int total;

    __device__ __forceinline__ BwdVisits(const Params& p_, int n_block_, int kv_head, int batch_)
        : p(p_), batch(batch_), n_block(n_block_) {
        const int group = p.heads / p.kv_heads;
        head0 = kv_head * group;
        if (p.bwd_lists.heads == 1) {
            total = group * count(head0)[1];
        } else {
            total = 0;
            for (int h = 0; h < group; ++h) total += count(head0 + h)[1];
        }
    }
    __device__ __forceinline__ int row(int head) const {
        return list_row(p.bwd_lists, batch, head, n_block, p.bwd_lists.k_tiles);
    }
    // {partial visits, all visits} of head's row
    __device__ __forceinline__ const int* count(int head) const { return p.bwd_lists.count + 2 * row(head); }
    __device__ __forceinline__ BwdVisit at(int i) const {
        int head = head0;
        if (p.bwd_lists.heads == 1) {
            const int n = count(head0)[1];
            head += i / n;
            i %= n;
        } else {
            for (int n = count(head)[1]; i >= n; n = count(head)[1]) {
                i -= n;
                ++head;
            }
        }
        const int r = row(head);
        return {head, p.bwd_lists.list[static_cast<index_t>(r) * p.bwd_lists.q_tiles + i],
                i < p.bwd_lists.count[2 * r]};
    }
    template <bool>
    __device__ __forceinline__ bool has(int i) const { return i < total; }
    __device__ __forceinline__ void advance(BwdVisit& v, int next) const {
        if (next < total) v = at(next);
    }
};

// The visit's query block of dq_accum (Kt::DqLayout) at consumer c's first dQ column (every column's first where
// the consumers take dQ by turns).
template <class Kt>
__device__ __forceinline__ float* dq_block(const BwdWorkspace<Kt::kBlockM, Kt::kHeadDim>& ws, index_t ws_row, int c) {
    return ws.dq_accum + ws_row * Kt::kHeadDim + Kt::DqLayout::template offset<Kt::kHeadDim>(0, Kt::dq_col0(c));
}

// The deterministic dQ order, for the thread about to add a panel: wait until the semaphore reads `turn` (the panels
// before this one have been added: bwd_passes.cuh's wait_semaphore), then order their bulk adds before this one's.
__device__ __forceinline__ void await_dq_turn(const int* sema, int turn) {
    wait_semaphore(sema, turn);
    fence_proxy_async_global();
}

// One thread: dq_accum block += a staged dQ panel, by one bulk reduction; `complete`: wait until the adds are done
// and visible to the next panel in the deterministic order, else only commit them.
template <class Kt>
__device__ __forceinline__ void reduce_panel(float* block, u32 panel, bool complete) {
    bulk_reduce_add(block, panel, Kt::DqLayout::kPanelBytes);
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
        return smem + Kt::kDoOffset + Ring::stage(visit) * Kt::kQStageBytes;
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
    __device__ __forceinline__ u32 dq_panel(int consumer) const {   // a consumer's staged dQ (split by keys)
        static_assert(Kt::kDqBulk, "dQ is staged only when the consumers split the keys");
        return smem + Kt::kDqOffset + consumer * Kt::kDqBufferBytes;
    }
    __device__ __forceinline__ u32 pt_tile(int visit) const {   // P^T (split by columns), by visit parity
        static_assert(Kt::kPtBuffers == Kt::kDsBuffers, "P^T is shared only when the consumers split columns");
        return smem + Kt::kPtOffset + (visit % Kt::kPtBuffers) * Kt::kDsBufferBytes;
    }
};

}  // namespace hopper
}  // namespace flashkit
