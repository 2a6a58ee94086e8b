// What both consumers of the warp-specialized Hopper backward share (split by keys: bwd_consumer.cuh; by
// head-dim columns: bwd_column_consumer.cuh): the thread's place in the wgmma layouts, dK and dV of the
// consumer's 64 keys x its columns (Share: bwd_traits.cuh's BwdShare) in fp32 registers over every visit, the dQ
// adds into dq_accum, and the final dK, dV store (its definition: bwd_epilogue.cuh); the score modification
// (softcap / ALiBi) and the window's element mask (Mask: bwd_mask.cuh) of the recomputed scores, and softcap's slope
// on dS.
#pragma once

#include "flashkit/bwd_mask.cuh"
#include "flashkit/functor.cuh"
#include "flashkit/fragment.cuh"
#include "flashkit/hopper/bwd_cta.cuh"
#include "flashkit/hopper/bwd_keep.cuh"
#include "flashkit/reduce.cuh"

namespace flashkit {
namespace hopper {

template <class Kt, class Mask, class Share_ = BwdShare<Kt> >
struct BwdConsumerBase {
    typedef Share_ Share;
    typedef typename Kt::Element Element;
    typedef typename Kt::QTile QTile;
    typedef typename Kt::KTile KTile;
    static constexpr int kD = Kt::kHeadDim;
    // Each consumer at its own copy of the visit (Kt::kUnevenColumns: the shares differ), its named barriers reached
    // at other instructions than the other consumer's or inside the branch between the copies: the non-aligned forms
    // (barrier.cuh; aligned ones there made ptxas serialize every wgmma, C7520).
    static constexpr bool kAlignedBarriers = !Kt::kUnevenColumns;
    static constexpr int kNoMaskShift = 1 << 30;   // a causal shift that masks no key

    const Params& p;
    const BwdWorkspace<Kt::kBlockM, Kt::kHeadDim> ws;
    const Mask mask;
    int batch, kv_head, n_block;
    int consumer;   // 0 .. kConsumers - 1
    int key0;       // first key (within the sequence) of this consumer's rows
    int tid;        // thread within the warpgroup
    int warp_row;   // 16 warp + g: this thread's first row (key) within the consumer's 64, the other + 8
    int col2;       // 2 t: this thread's first column within an 8-wide column tile

    float acc_dk[Share::kDkTiles][4];   // dK of the consumer's keys and columns, wgmma accumulator layout
    float acc_dv[Share::kDvTiles][4];   // dV of its keys and v's columns

    __device__ __forceinline__ BwdConsumerBase(const Params& p_, int consumer_, int n_block_, int kv_head_, int batch_)
        : p(p_), ws(p_), mask(p_), batch(batch_), kv_head(kv_head_), n_block(n_block_),
          consumer(Kt::kUniformConsumer ? warp_uniform(consumer_) : consumer_) {
        key0 = n_block * Kt::kBlockN + (Kt::kSplitColumns ? 0 : consumer * Kt::kConsumerKeys);
        tid = threadIdx.x % gmma::kWarpgroupThreads;
        const ConsumerPlace at(tid);
        warp_row = at.row;
        col2 = at.col2;
#pragma unroll
        for (int nd = 0; nd < Share::kAccTiles; ++nd)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                if (nd < Share::kDvTiles) acc_dv[nd][e] = 0.f;
                if (nd < Share::kDkTiles) acc_dk[nd][e] = 0.f;
            }
    }

    // This thread's two values of a visit's per-query row in column tile ni of the consumer's queries: lse2 from
    // its stage's row in shared memory (BwdCta's lse2_row),
    __device__ __forceinline__ float2 query_pair(u32 row, int ni) const {
        return ld_shared_f2(row + (s_query0() + ni * kMmaN + col2) * static_cast<int>(sizeof(float)));
    }
    // or lse2 or dsum from the workspace's row in global memory.
    __device__ __forceinline__ float2 query_pair(const float* row, int ni) const {
        return *reinterpret_cast<const float2*>(row + s_query0() + ni * kMmaN + col2);
    }

    // Address of this thread's 16-bit pair (two queries) in a shared [key][query] tile (dS^T, P^T: Kt::DsTile) at
    // key row row0 + 8 h, 16 B chunk `chunk` (its column tile), where row0 is a fragment's first row. Rows g and
    // g + 8 share their swizzle key (the row mod 8), so the second half is the first plus 8 rows: ptxas keeps
    // one set of chunk offsets over the visits rather than two (with two, hd64 float16 spilled 4 B).
    __device__ __forceinline__ u32 pair_address(u32 tile, int row0, int chunk, int h) const {
        typedef typename Kt::DsTile DsTile;
        return tile + DsTile::chunk_offset(row0, chunk) + h * kFragRowHalf * DsTile::kPanelBytes +
               col2 * Kt::kElemBytes;
    }

    // The consumer's S^T and dP^T: its first rows of the K and V tiles (keys) and of the Q and dO tiles (queries).
    __device__ __forceinline__ int s_key_row0() const { return Kt::kSplitColumns ? 0 : consumer * Kt::kConsumerKeys; }
    __device__ __forceinline__ int s_query0() const { return Kt::kSplitColumns ? consumer * Kt::kSQueries : 0; }

    // S^T = K Q^T over the head dim and dP^T = V dO^T over v's, issued as two groups, each once its stage has landed.
    __device__ __forceinline__ void issue_scores(const BwdCta<Kt>& cta, int slot, float (&s)[Kt::kQTiles][4],
                                                 float (&dp)[Kt::kQTiles][4]) const {
        const int k_row0 = s_key_row0(), q0 = s_query0();
        const u32 k_tile = cta.smem + Kt::kKOffset;
        const u32 v_tile = cta.smem + Kt::kVOffset;
        cta.q_ring.wait_full(slot);
        gmma::fence();
#pragma unroll
        for (int kk = 0; kk < Kt::kDSteps; ++kk)   // S^T = K Q^T
            gmma::Mma<Element, Kt::kSQueries>::ss(s, KTile::desc(k_tile, k_row0, kk * gmma::kKBytes),
                                                   QTile::desc(cta.q_tile(slot), q0, kk * gmma::kKBytes), kk > 0);
        gmma::commit();
        cta.do_ring.wait_full(slot);
        // Each consumer at its own copy (kUnevenColumns): a fence after dO's wait loop, else ptxas inserted one there
        // for dP^T's accumulators itself (C7519), and beside the staged dQ's handshake serialized every wgmma (C7520).
        if constexpr (!kAlignedBarriers) gmma::fence();
#pragma unroll
        for (int kk = 0; kk < Kt::kDvSteps; ++kk)   // dP^T = V dO^T
            gmma::Mma<Element, Kt::kSQueries>::ss(dp, Kt::VTile::desc(v_tile, k_row0, kk * gmma::kKBytes),
                                                   Kt::DoTile::desc(cta.do_tile(slot), q0, kk * gmma::kKBytes), kk > 0);
        gmma::commit();
    }

    // key - query of the thread's first element of the visit at m0 (row warp_row, query col2 of the consumer's
    // first); element c of row half h in column tile ni is at `+ 8 h - (8 ni + c)` from it (the step's offsets).
    __device__ __forceinline__ int key_minus_query(int m0) const {
        return key0 + warp_row - (m0 + s_query0() + col2);
    }

    // Causal, bottom-right aligned: key > query + shift -> P = 0, with the shift past every key where no key of
    // the consumer's rows crosses the diagonal of the visit at query block m0 (one copy of the step serves
    // masked and unmasked visits). As one register: key - query - shift.
    __device__ __forceinline__ int causal_over(int m0) const {
        const int shift = Mask::kCausal &&
                                  BwdCausal<true>::crosses(p.seqlen_k - p.seqlen_q, m0, key0, Kt::kConsumerKeys)
                              ? p.seqlen_k - p.seqlen_q
                              : kNoMaskShift;
        return key_minus_query(m0) - shift;
    }

    // S^T = mod(S^T) (the visit's head's modification), every visit, at the thread's fresh place (FreshPlace).
    template <class Mod>
    __device__ __forceinline__ void modify_scores(const Mod& mod, float (&s)[Kt::kQTiles][4], int m0) const {
        const FreshPlace at;
        apply_score_mod_transposed(mod, s, key0 + at.row, m0 + s_query0() + at.col2);
    }
    // Nothing to do (not even the fresh read: the unmodified builds' code stays as it was).
    __device__ __forceinline__ void modify_scores(const NoScoreMod&, float (&)[Kt::kQTiles][4], int) const {}
    // The same, with each element's slope taken for dS (Kt::holds_slopes / stashes_slopes: ds_pair's slope_pair).
    template <class Mod>
    __device__ __forceinline__ void modify_scores(const Mod& mod, float (&s)[Kt::kQTiles][4],
                                                  u32 (&slope)[Kt::kQTiles][2], int m0) const {
        const FreshPlace at;
        apply_score_mod_transposed(mod, s, slope, key0 + at.row, m0 + s_query0() + at.col2);
    }

    // A mask_mod's element mask of a partial visit (FLASHKIT_MASK_MOD), as bits: bit kKeepRowBits h + 2 ni + c keeps
    // key row warp_row + 8 h, query s_query0() + 8 ni + col2 + c of the visit at m0. Without mask warps
    // (Kt::kMaskWarps: then hopper/bwd_keep.cuh writes them) the consumer thread evaluates them before the visit's
    // products (no wgmma in flight, so the branch costs ptxas nothing) into its word of Q's stage (held in a register
    // over the products, the hd128 build spilled 16-24 B). Indices clamped into the sequences (functor.cuh's
    // contract).
    __device__ __forceinline__ void stage_keep(const BwdCta<Kt>& cta, int slot, bool partial, int head, int m0) const {
#if FLASHKIT_MASK_MOD
        if constexpr (Kt::kMaskWarps == 0) {   // written out here: through a helper shared with bwd_keep.cuh's
            u32 bits = ~0u;                     // word_bits (the same sums), ptxas made the hd64 build 56
                                                // instructions longer
            if (partial) {
                bits = 0;
#pragma unroll 1
                for (int h = 0; h < 2; ++h) {
                    const int key = min(key0 + warp_row + h * kFragRowHalf, p.seqlen_k - 1);
#pragma unroll kMaskModUnroll
                    for (int c = 0; c < Kt::kKeepRowBits; ++c) {
                        const int query = min(m0 + s_query0() + (c >> 1) * kMmaN + col2 + (c & 1), p.seqlen_q - 1);
                        bits |= static_cast<u32>(::mask_mod(batch, head, query, key, p.mods.args))
                                << (h * Kt::kKeepRowBits + c);
                    }
                }
            }
            st_shared_b32(cta.keep_word(slot, fresh_thread_index() - gmma::kWarpgroupThreads), bits);
        }
#else
        (void)cta, (void)slot, (void)partial, (void)head, (void)m0;
#endif
    }
    // The thread's word of keep bits for visit `slot` (Q has landed: issue_scores waited for it); all ones on full
    // visits (the mask warps write none there) and without a mask_mod.
    __device__ __forceinline__ static u32 staged_keep(const BwdCta<Kt>& cta, int slot, bool partial) {
#if FLASHKIT_MASK_MOD
        const u32 word = ld_shared_b32(cta.keep_word(slot, fresh_thread_index() - gmma::kWarpgroupThreads));
        return Kt::kMaskWarps == 0 || partial ? word : ~0u;
#else
        (void)cta, (void)slot, (void)partial;
        return ~0u;
#endif
    }
    // x where the keep bits keep element e of column tile ni (the C fragment's order), else 0.
    __device__ __forceinline__ static float keeps(u32 bits, int ni, int e, float x) {
        return (bits >> ((e / 2) * Kt::kKeepRowBits + 2 * ni + e % 2)) & 1u ? x : 0.f;
    }

    // P^T of the element at offset `at` from the thread's first (over, diff: causal_over and key_minus_query of the
    // visit): exp2(S^T scale log2(e) - lse2), 0 above the causal diagonal and, with BwdLocal (a window, no chunk:
    // the manifest leaves chunks to fa2_bwd), where key - query leaves the window's uniform limits. No branch:
    // one copy of the step serves masked and unmasked visits.
    __device__ __forceinline__ float visible_prob(float s, float lse2, int over, int diff, int at) const {
        const float x = fast_exp2(fmaf(s, p.softmax_scale_log2, -lse2));
        if constexpr (Mask::kCausal) return over + at > 0 ? 0.f : x;
        if constexpr (Mask::kLocal)
            return diff + at < mask.key_minus_query_min() || diff + at > mask.key_minus_query_max() ? 0.f : x;
        return x;
    }

    // dS^T = P^T (dP^T - dsum) of a pair of the thread's elements (P^T as rounded: pt_pair), times the
    // modification's slopes where they are not 1, taken at the recompute (Kt::takes_slopes: slope_pair, two of
    // SlopeElement<Mod>); packed to 16 bits.
    template <class Mod>
    __device__ __forceinline__ u32 ds_pair(u32 pt_pair, float dp0, float dp1, float2 dsum, u32 slope_pair) const {
        static_assert(Mod::kUnitGrad || Kt::template takes_slopes<Mod>(), "a slope other than 1 comes from the recompute");
        float p0, p1;
        unpack_float2<Element>(pt_pair, p0, p1);
        float ds0 = p0 * (dp0 - dsum.x), ds1 = p1 * (dp1 - dsum.y);
        if constexpr (!Mod::kUnitGrad) {   // P^T = 0 (masked) gives dS^T = 0: the slope is finite
            float g0, g1;
            unpack_float2<typename SlopeElement<Mod>::type>(slope_pair, g0, g1);
            ds0 *= g0;
            ds1 *= g1;
        }
        return pack_float2<Element, SaturateFinite>(ds0, ds1);
    }

    // The slope stash's 16 bytes of this thread for k-step kk of the visit's queries (Kt::stashes_slopes): only the
    // thread itself reads them, after it wrote them in the same visit, so nothing orders them across threads. The
    // thread index from a fresh read (as FreshPlace's), the stash's address formed where used.
    __device__ __forceinline__ u32 slope_stash(const BwdCta<Kt>& cta, int kk) const {
        return cta.smem + Kt::kSlopeOffset +
               ((consumer * Kt::kQSteps + kk) * gmma::kWarpgroupThreads + fresh_warpgroup_thread()) *
                   Kt::kSlopeStepBytes;
    }
    // slope[2 kk + j][h] to word 2 j + h of k-step kk's 16 bytes.
    __device__ __forceinline__ void stash_slopes(const BwdCta<Kt>& cta, const u32 (&slope)[Kt::kQTiles][2]) const {
#pragma unroll
        for (int kk = 0; kk < Kt::kQSteps; ++kk)
            st_shared_v4(slope_stash(cta, kk), slope[2 * kk][0], slope[2 * kk][1], slope[2 * kk + 1][0],
                         slope[2 * kk + 1][1]);
    }

    // This consumer's first dK, dV column, and its first dQ column.
    __device__ __forceinline__ int own_col0() const { return Share::dk_col0(consumer); }
    __device__ __forceinline__ int own_col0_v() const { return Share::dv_col0(consumer); }
    __device__ __forceinline__ int dq_col0() const { return Share::dq_col0(consumer); }

    // The thread's index in its warpgroup (fresh_warpgroup_thread) and its consumer index, from a volatile read of
    // %tid.x where the dQ staging uses them. ptxas otherwise kept `consumer` (for the panel's address) over the whole
    // visit and spilled it at the register peak (S^T and dP^T in flight beside dK and dV; 4-8 B at hd128 causal)
    // rather than form it again.
    // warp_row and col2 formed again from a fresh index, where per-element indices feed a score modification. From the
    // members, ptxas formed the elements' indices (a functor's 16 clamped queries, ALiBi's distances undone for
    // softcap's slope) before the S^T wait and held them over it: relative_bias and softcap with ALiBi spilled
    // 80-112 B on hd128's non-causal 128-key blocks; 0 from the fresh place. (The members stay formed from
    // threadIdx.x: formed from a FreshPlace too, they were one value to ptxas again, and 120-128 B spilled.)
    struct FreshPlace : ConsumerPlace {
        __device__ __forceinline__ FreshPlace() : ConsumerPlace(fresh_warpgroup_thread()) {}
    };
    __device__ __forceinline__ static int fresh_consumer() {   // consumer warpgroups follow the producer's
        return fresh_thread_index() / gmma::kWarpgroupThreads - 1;
    }

    // Float offset of thread `thread`'s fragment of dQ column tile i (from the consumer's first column): warp w of
    // the warpgroup holds row tile w.
    __device__ __forceinline__ static int dq_fragment(int i, int thread) {
        return Kt::DqLayout::fragment(i, thread / kWarpSize, thread % kWarpSize);
    }

    // dq_accum of the visit += dQ (this consumer's columns, or at hd64 every column in its turn; unscaled), in two
    // steps so that a kernel may issue work between them: stage_dq, then publish_dq. Staged (kDqBulk: split by keys,
    // or by columns at hd192): the partial goes to the consumer's shared panel (split by columns: its columns' panels
    // of the staged block) in dq_accum's own order, and the whole of it is added by one bulk reduction, issued by
    // the dQ writer warp (Kt::kDqWriter: bwd_dq_writer.cuh; the consumer only arrives) or by the consumer's thread
    // 0; else (hd256): one 16-byte reduction a tile a thread, straight from the registers.
    // Deterministic (p.bwd.deterministic), without the writer: in key-block order. Key block j waits until the
    // semaphore of (batch, head, m_block) reads the key blocks before j that visit m_block (Mask::dq_turn), adds,
    // waits for its adds to complete, and increments it (at hd64 the turn's consumer alone: one panel a visit).
    // Consumer me's staged dQ in shared memory: its panel (split by keys) or its columns' panels (by columns).
    __device__ __forceinline__ static u32 staged_dq(const BwdCta<Kt>& cta, int me) {
        return cta.dq_staging(me, Share::dq_col0(me));
    }
    __device__ __forceinline__ void stage_dq(const BwdCta<Kt>& cta, const float (&dq)[Share::kDqTiles][4],
                                             int slot) const {
        if constexpr (Kt::kDqBulk) {
            const int thread = fresh_warpgroup_thread(), me = fresh_consumer();
            const u32 panel = staged_dq(cta, me);
            // the writer's reduction of the consumer's previous panel has read it (see bwd_dq_writer.cuh)
            if (Kt::kDqWriter && (Kt::kSplitColumns || slot >= Kt::kDqTurnStride))
                named_sync<kAlignedBarriers>(kBwdDqEmptyBarrier + me, Kt::kDqHandshake);
#pragma unroll
            for (int i = 0; i < Share::kDqTiles; ++i)
                st_shared_v4(panel + dq_fragment(i, thread) * sizeof(float), dq[i]);
        } else {
            (void)cta, (void)dq, (void)slot;
        }
    }
    __device__ __forceinline__ void publish_dq(const BwdCta<Kt>& cta, const float (&dq)[Share::kDqTiles][4], int head,
                                               int m_block, index_t ws_row) const {
        const bool ordered = p.bwd.deterministic != 0;
        if constexpr (Kt::kDqWriter) {   // to the consumer's writer warp (bwd_dq_writer.cuh)
            gmma::fence_proxy_async();   // the panel's stores (generic proxy), before the bulk reduction reads it
            named_arrive<kAlignedBarriers>(kBwdDqFullBarrier + fresh_consumer(), Kt::kDqHandshake);
            (void)cta, (void)dq, (void)head, (void)m_block, (void)ws_row;
            return;
        }
        if constexpr (Kt::kDqTurns) {   // this consumer's turn: the visit's whole dQ, one panel, one reduction
            const int thread = fresh_warpgroup_thread(), me = fresh_consumer();
            gmma::fence_proxy_async();   // the panel's stores (generic proxy), before the bulk reduction reads it
            named_sync(kBwdConsumerBarrier + me, gmma::kWarpgroupThreads);
            if (thread == 0) {
                int* sema = ws.semaphore(p, batch, head, m_block);
                if (ordered)
                    await_dq_turn(sema, dq_turn<Kt::kBlockM, Kt::kBlockN>(mask, m_block, n_block, head, batch));
                reduce_panel<Kt>(dq_block<Kt>(ws, ws_row, Kt::dq_col0(me)), cta.dq_panel(me), ordered);
                if (ordered) atomicAdd(sema, 1);
            }
            (void)dq;
            return;
        }
        const bool leader = fresh_thread_index() == gmma::kWarpgroupThreads;   // consumer 0's thread 0
        if (ordered) {
            if (leader)
                await_dq_turn(ws.semaphore(p, batch, head, m_block),
                              dq_turn<Kt::kBlockM, Kt::kBlockN>(mask, m_block, n_block, head, batch));
            named_sync<kAlignedBarriers>(kBwdDqOrderBarrier, Kt::kConsumerThreads);
        }
        if constexpr (Kt::kDqBulk) {
            const int thread = fresh_warpgroup_thread(), me = fresh_consumer();
            const u32 panel = staged_dq(cta, me);
            gmma::fence_proxy_async();   // the panel's stores (generic proxy), before the bulk reduction reads it
            named_sync<kAlignedBarriers>(kBwdConsumerBarrier + me, gmma::kWarpgroupThreads);
            if (thread == 0)
                reduce_panel<Kt>(dq_block<Kt>(ws, ws_row, Share::dq_col0(me)), panel, ordered, Share::kDqPanels);
        } else {
            float* block = dq_block<Kt>(ws, ws_row, dq_col0());
#pragma unroll
            for (int i = 0; i < Share::kDqTiles; ++i) {
                float* at = block + dq_fragment(i, tid);
                red_add_v4(at, dq[i][0], dq[i][1], dq[i][2], dq[i][3]);
            }
            if (ordered) __threadfence();
        }
        if (ordered) {
            named_sync<kAlignedBarriers>(kBwdDqOrderBarrier, Kt::kConsumerThreads);
            if (leader) atomicAdd(ws.semaphore(p, batch, head, m_block), 1);
        }
    }

    // Before a visit's dQ is staged: thread 0 waits until the previous visit's bulk reduction has read the
    // panel; the named barrier that every consumer thread passes next (dS^T ready) publishes it.
    __device__ __forceinline__ void dq_panel_free() const {
        if (Kt::kDqBulk && !Kt::kDqWriter && fresh_warpgroup_thread() == 0) bulk_wait_read();
    }
    // After the last visit: the last reduction complete before the CTA (and its shared memory) ends.
    __device__ __forceinline__ void dq_drain() const {
        if (Kt::kDqBulk && !Kt::kDqWriter && tid == 0) bulk_wait();
    }

    // dK = scale dK and dV, 16-bit, of the consumer's keys and columns, through the K and V tiles (defined in
    // hopper/bwd_epilogue.cuh).
    __device__ __forceinline__ void store_dk_dv(const BwdCta<Kt>& cta) const;
};

}  // namespace hopper
}  // namespace flashkit
