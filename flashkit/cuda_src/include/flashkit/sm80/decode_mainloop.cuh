// The split-KV decode forward on mma.sync (sm_80+): one CTA per (key chunk, row block, kv head, sequence).
//
// Rows: 16 packed (query row, group head) rows (gqa_pack.cuh), Q held in registers by every warp (read from
// the shared Q tile at each k-step instead where O's and Q's fragments together pass kDecodeQInRegsBudget).
// Head dims: kHeadDim is the compiled class (a multiple of 32, traits.cuh); with kHeadDimPadded the call's
// head dim (Params::head_dim, a multiple of 8) is below it: Q, K and V load zero-filled columns past it, so S
// and the call's columns of O are exact, and only those columns are stored.
// Keys: the chunk's 16-key tiles are dealt round-robin to the warps (warp w takes tiles first + w,
// first + w + kWarps, ...). Each warp runs its own cp.async ring of kStages (K, V) tile pairs in its own
// slice of shared memory: no CTA barrier in the main loop, up to (kStages - 1) tiles in flight per warp.
// Per tile, in the warp:
//   S = Q K_j^T                      mma.sync m16n8k16, K_j by ldmatrix (swizzled)
//   S = mod(S)                       a score modification that reads no index (softcap; score_mod.cuh)
//   S = -inf outside [key_begin, key_end)   (the sequence's length, the causal bound, a window) on boundary tiles
//   {m, l}, P = online softmax(S)    softmax.cuh, O *= alpha
//   O += P V_j                       P as the A fragment, V_j by ldmatrix.trans
// End: each warp's (O / l, LSE) goes to shared memory and the CTA merges its warps exactly
// (split_kv.cuh's rule); the result is the output (one split) or the chunk's fp32 partial.
#pragma once

#include "flashkit/gqa_pack.cuh"
#include "flashkit/paged_kv.cuh"
#include "flashkit/score_mod.cuh"
#include "flashkit/sm80/mma.cuh"
#include "flashkit/softmax.cuh"
#include "flashkit/split_kv.cuh"
#include "flashkit/tile.cuh"

namespace flashkit {

// Registers (a thread's O and Q fragments) up to which a decode warp holds Q: hd128's 96. Past it (hd160 and up)
// the held Q pushed the kernel to 255 registers and spills, while reading it from the Q tile costs one ldmatrix a
// k-step beside K's and V's, on a kernel bound by the cache's HBM reads.
constexpr int kDecodeQInRegsBudget = 96;

template <int kHeadDim_, int kWarps_, int kStages_, typename Element_, typename OutT_>
struct DecodeTraits {
    typedef Element_ Element;
    typedef OutT_ OutT;
    static constexpr int kHeadDim = kHeadDim_;   // the class; the call's Params::head_dim with kHeadDimPadded
    enum : int { kHeadDimPadded = FLASHKIT_HEAD_DIM_PADDED != 0 };
    static constexpr int kWarps = kWarps_;
    static constexpr int kStages = kStages_;
    static constexpr int kThreads = kWarps * kWarpSize;
    static constexpr int kBlockM = kMmaM;         // packed rows per CTA: one m16 tile
    static constexpr int kBlockN = 2 * kMmaN;     // keys per warp tile: one k16 step of P V
    static constexpr int kNTiles = kBlockN / kMmaN;
    static constexpr int kDTiles = kHeadDim / kMmaN;
    static constexpr int kQKSteps = kHeadDim / kMmaK;
    static constexpr int kElemBytes = sizeof(Element);
    static constexpr int kRowBytes = kHeadDim * kElemBytes;
    static constexpr int kRowChunks = kRowBytes / kChunkBytes;
    static constexpr int kTileBytes = kBlockN * kRowBytes;        // one K or V tile
    static constexpr int kStageBytes = 2 * kTileBytes;            // K then V
    static constexpr int kWarpBytes = kStages * kStageBytes;      // a warp's ring
    static constexpr int kQBytes = kBlockM * kRowBytes;
    static constexpr int kSmemBytes = kQBytes + kWarps * kWarpBytes;
    // The merge reuses the rings for each warp's fp32 O and the Q tile for the warps' LSE.
    static constexpr int kMergeOBytes = kBlockM * kHeadDim * 4;
    // A thread's O accumulator (kBlockM x kHeadDim fp32 over a warp) and Q fragments (16-bit pairs).
    static constexpr int kORegs = kBlockM * kHeadDim / kWarpSize;
    static constexpr int kQRegs = kBlockM * kHeadDim / (2 * kWarpSize);
    static constexpr bool kQInRegs = kORegs + kQRegs <= kDecodeQInRegsBudget;
    typedef typename LdsmColumnsOf<kRowChunks>::type Columns;   // ldmatrix columns of the swizzled rows

    static_assert(kElemBytes == 2, "mma.sync path: 16-bit elements");
    static_assert(kStages >= 2, "a ring needs two stages");
    static_assert(kHeadDim % (2 * kMmaK) == 0,
                  "head-dim class: a multiple of 32 (swizzled rows of 8-chunk groups and a 4-chunk tail)");
    static_assert(kMergeOBytes <= kWarpBytes, "a warp's O fits in its ring");
    static_assert(kWarps * kBlockM * 4 <= kQBytes, "the warps' LSE fit in the Q tile");
};

// The keys [begin(qi), end(qi)) query row qi of a sequence of seqlen_k keys sees: all of them, the causal ones
// (bottom-right aligned), or with kLocal flash-attn's window (left, right) about the diagonal qi + seqlen_k -
// seqlen_q (a causal window arrives as right = 0; an open side as seqlen_q + the capacity: features/mods.py). Both
// ends are non-decreasing in qi, so a block of rows sees [begin(first row), end(last row)).
template <bool kCausal, bool kLocal>
struct DecodeRowKeys {
    const Params& p;
    int seqlen_k;
    __device__ __forceinline__ DecodeRowKeys(const Params& p_, int seqlen_k_) : p(p_), seqlen_k(seqlen_k_) {}
    __device__ __forceinline__ int begin(int qi) const {
        if constexpr (kLocal) return max(0, qi + seqlen_k - p.seqlen_q - p.mods.window_left);
        return 0;
    }
    __device__ __forceinline__ int end(int qi) const {
        if constexpr (kLocal) return max(0, min(seqlen_k, qi + seqlen_k - p.seqlen_q + p.mods.window_right + 1));
        return row_key_end<kCausal>(qi, seqlen_k, p.seqlen_q);
    }
};

// A thread's two rows' key bounds (rows g and g + 8 of its row block; a row past the block's sees no key), for the
// element mask of the boundary tiles. Held in registers (kLower: false, the keys below every row's end) ...
template <class RowKeys>
struct HeldRowBounds {
    static constexpr bool kLower = false;
    int hi[2];
    __device__ __forceinline__ HeldRowBounds(const RowKeys& keys, const PackedRows& pack, int row0, int lane) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = row0 + lane / kQuadLanes + h * kFragRowHalf;
            hi[h] = row < pack.rows ? keys.end(pack.query_row(row)) : 0;
        }
    }
    __device__ __forceinline__ void keys(int h, int& lo, int& hi_) const { lo = 0, hi_ = hi[h]; }
};
// ... or, for a window's two ends, formed at each masked tile (a window's few edge tiles a row block) from a fresh
// thread index, instead of held in registers across the ring's loop (held, padded builds spilled at hd128).
template <class RowKeys>
struct FormedRowBounds {
    static constexpr bool kLower = true;
    const RowKeys& row_keys;
    const PackedRows& pack;
    int row0;
    __device__ __forceinline__ FormedRowBounds(const RowKeys& k, const PackedRows& p, int r0, int)
        : row_keys(k), pack(p), row0(r0) {}
    __device__ __forceinline__ void keys(int h, int& lo, int& hi) const {
        const int row = row0 + fresh_thread_index() % kWarpSize / kQuadLanes + h * kFragRowHalf;
        const int qi = pack.query_row(row);
        lo = row < pack.rows ? row_keys.begin(qi) : 0;
        hi = row < pack.rows ? row_keys.end(qi) : 0;
    }
};

template <bool kLocal, class RowKeys>
struct RowBoundsOf {
    typedef HeldRowBounds<RowKeys> type;
};
template <class RowKeys>
struct RowBoundsOf<true, RowKeys> {
    typedef FormedRowBounds<RowKeys> type;
};

// One warp's state: Q fragments (or their shared address), O accumulator, online softmax.
template <class Kt, class ScoreMod>
struct DecodeWarp {
    typedef typename Kt::Element Element;
    typedef typename Kt::Columns Columns;
    typedef u32 Frag[4];   // an A fragment of m16n8k16 (four 16-bit pairs)
    Frag q_frag[Kt::kQInRegs ? Kt::kQKSteps : 1];
    float acc_o[1][Kt::kDTiles][4];
    OnlineSoftmax<1> softmax;
    u32 q_lane;                   // this lane's ldmatrix row of the Q tile (shared address)
    u32 k_lane, v_lane;           // this lane's ldmatrix row offset in a K / V tile (bytes)
    Columns cols_hi16, cols_hi8;

    __device__ __forceinline__ DecodeWarp(u32 sQ, int lane)
        : cols_hi16(lane, lane / 16), cols_hi8(lane, lane / 8 % 2) {
        const int r8 = lane % 8;
        k_lane = ((lane / 16) * kMmaN + r8) * Kt::kRowBytes;        // B of Q K^T: keys 8-15 for lanes 16+
        v_lane = (((lane / 8) % 2) * kMmaN + r8) * Kt::kRowBytes;   // B of P V (.trans): keys 8-15, lanes 8-15/24-31
        q_lane = sQ + (lane % 16) * Kt::kRowBytes;
        if constexpr (Kt::kQInRegs) {
#pragma unroll
            for (int kk = 0; kk < Kt::kQKSteps; ++kk) load_q(q_frag[kk], kk);
        }
        zero_fragments(acc_o);
        softmax.init();
    }

    // The A fragment of Q for k-step kk, from the shared Q tile.
    __device__ __forceinline__ void load_q(Frag& a, int kk) const {
        ldsm_x4(a, q_lane + cols_hi16.col(kk) * Kt::kElemBytes);
    }
    // Q's A fragment for k-step kk: the held one, or read into scratch.
    __device__ __forceinline__ const Frag& q_at(int kk, Frag& scratch) const {
        if constexpr (Kt::kQInRegs) {
            return q_frag[kk];
        } else {
            load_q(scratch, kk);
            return scratch;
        }
    }

    // One tile at shared address sK (V right after it); keys from n0; masked: keep keys [lo, hi) of each of the
    // thread's two rows h (bounds.keys(h, lo, hi)).
    template <class Bounds>
    __device__ __forceinline__ void step(u32 sK, int n0, bool masked, const Bounds& bounds,
                                         const ScoreMod& score_mod, int lane, float scale_log2) {
        float s[1][Kt::kNTiles][4];
        zero_fragments(s);
#pragma unroll
        for (int kk = 0; kk < Kt::kQKSteps; ++kk) {   // S = Q K^T
            u32 b[4];
            ldsm_x4(b, sK + k_lane + cols_hi8.col(kk) * Kt::kElemBytes);
            Frag scratch;
            const Frag& a = q_at(kk, scratch);
            mma_16816<Element>(s[0][0], a, b[0], b[1]);
            mma_16816<Element>(s[0][1], a, b[2], b[3]);
        }
        static_assert(!ScoreMod::kIndexed, "decode: a score modification reads no row index (rows pack heads)");
        apply_score_mod(score_mod, s, 0, n0 + kFragCols * (lane % kQuadLanes));   // S = mod(S), before the mask
        if (masked) {   // S = -inf for keys outside the row's [lo, hi)
            const int col = n0 + kFragCols * (lane % kQuadLanes);
            int lo[2], hi[2];
            bounds.keys(0, lo[0], hi[0]);
            bounds.keys(1, lo[1], hi[1]);
#pragma unroll
            for (int ni = 0; ni < Kt::kNTiles; ++ni)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int c = col + ni * kMmaN + (e & 1);
                    if (c >= hi[e / 2] || (Bounds::kLower && c < lo[e / 2])) s[0][ni][e] = FLASHKIT_NEG_INF;
                }
        }
        softmax.update(s, acc_o, scale_log2);   // S -> P, O *= alpha
        u32 a[4];
        pack_a_fragment<Element>(a, s[0], 0);
        const u32 sV = sK + Kt::kTileBytes;
#pragma unroll
        for (int dp = 0; dp < Kt::kDTiles / 2; ++dp) {   // O += P V
            u32 b[4];
            ldsm_x4_trans(b, sV + v_lane + cols_hi16.col(dp) * Kt::kElemBytes);
            mma_16816<Element>(acc_o[0][2 * dp], a, b[0], b[1]);
            mma_16816<Element>(acc_o[0][2 * dp + 1], a, b[2], b[3]);
        }
    }
};

// The whole CTA: chunk `split` of the key tiles (row_block, kv_head, batch) sees.
template <class Kt, bool kCausal, bool kLocal, class ScoreMod>
__device__ __forceinline__ void decode_block(const Params& p, int split, int kv_head, int row_block, int batch) {
    typedef typename Kt::Element Element;
    typedef typename Kt::OutT OutT;
    extern __shared__ __align__(128) unsigned char smem_raw[];
    const int tid = threadIdx.x;
    const int warp = tid / kWarpSize;
    const int lane = tid % kWarpSize;
    const u32 sQ = smem_u32(smem_raw);

    const PackedRows pack(p, kv_head);
    const int row0 = row_block * Kt::kBlockM;
    const int last_row = (row0 + Kt::kBlockM < pack.rows ? row0 + Kt::kBlockM : pack.rows) - 1;
    const int seqlen_k = p.cache.seqlens == nullptr ? p.seqlen_k : p.cache.seqlens[batch];
    typedef DecodeRowKeys<kCausal, kLocal> RowKeys;
    const RowKeys keys(p, seqlen_k);
    const int kv_begin = keys.begin(pack.query_row(row0));       // keys [kv_begin, kv_end): what some row sees
    const int kv_end = keys.end(pack.query_row(last_row));
    const int mask_from = keys.end(pack.query_row(row0));        // keys [mask_below, mask_from): what every row sees
    const int mask_below = keys.begin(pack.query_row(last_row));
    const int tile0 = kv_begin / Kt::kBlockN;                    // tiles [tile0, tile0 + n_tiles) are visited
    const int n_tiles = !kLocal || kv_end > kv_begin ? (kv_end + Kt::kBlockN - 1) / Kt::kBlockN - tile0 : 0;
    const SplitRange range(n_tiles, split, p.cache.splits, tile0);

    // The call's columns: the class's, or (padded) Params::head_dim, past which loads zero-fill and stores skip.
    const int cols = Kt::kHeadDimPadded ? p.head_dim : Kt::kHeadDim;
    const int chunks_valid = cols / (kChunkBytes / Kt::kElemBytes);
    load_packed_q_async<Kt::kBlockM, Kt::kHeadDim, Kt::kThreads, Element>(p, pack, sQ, batch, row0, tid,
                                                                          chunks_valid);
    cp_async_wait<0>();
    __syncthreads();
    DecodeWarp<Kt, ScoreMod> w(sQ, lane);
    const ScoreMod score_mod(p, 0, batch);   // (no head: static_assert in step)
    const typename RowBoundsOf<kLocal, RowKeys>::type bounds(keys, pack, row0, lane);

    // This warp's tiles: first + i * kWarps, i < n_it.
    const int first = range.first + warp;
    const int n_it = first < range.end ? (range.end - first + Kt::kWarps - 1) / Kt::kWarps : 0;
    KvTileSource<Kt::kBlockN> src(p, batch, kv_head, Kt::kElemBytes);
    const u32 ring = sQ + Kt::kQBytes + warp * Kt::kWarpBytes;
    typedef SwizzledTile<Kt::kHeadDim, Element> Layout;
    auto issue = [&](int i) {   // cp.async of the warp's i-th (K, V) tile pair into its ring slot
        const int n0 = (first + i * Kt::kWarps) * Kt::kBlockN;
        const int page = src.table == nullptr ? 0 : src.page_of(i, first, Kt::kWarps, range.end, lane);
        const u8 *k_rows, *v_rows;
        src.tile_rows(n0, page, k_rows, v_rows);
        const u32 slot = ring + (i % Kt::kStages) * Kt::kStageBytes;
        constexpr bool kClip = Kt::kHeadDimPadded;
        load_rows_async<Kt::kBlockN, Kt::kRowBytes, kWarpSize, Layout, kClip>(slot, k_rows, src.k_row_bytes,
                                                                              kv_end - n0, lane, chunks_valid);
        load_rows_async<Kt::kBlockN, Kt::kRowBytes, kWarpSize, Layout, kClip>(slot + Kt::kTileBytes, v_rows,
                                                                              src.v_row_bytes, kv_end - n0, lane,
                                                                              chunks_valid);
    };
#pragma unroll
    for (int i = 0; i < Kt::kStages - 1; ++i) {   // prologue: kStages - 1 groups (empty past the end)
        if (i < n_it) issue(i);
        cp_async_commit();
    }
    for (int i = 0; i < n_it; ++i) {
        if (i + Kt::kStages - 1 < n_it) issue(i + Kt::kStages - 1);   // the slot tile i - 1 freed
        cp_async_commit();
        cp_async_wait<Kt::kStages - 1>();   // tile i landed
        __syncwarp();
        const int n0 = (first + i * Kt::kWarps) * Kt::kBlockN;
        const bool masked = n0 + Kt::kBlockN > mask_from || (kLocal && n0 < mask_below);
        w.step(ring + (i % Kt::kStages) * Kt::kStageBytes, n0, masked, bounds, score_mod, lane, p.softmax_scale_log2);
        __syncwarp();   // every lane is done reading the slot before it is refilled
    }
    cp_async_wait<0>();

    // Merge the warps: O_w / l_w and LSE_w to shared memory, then the exact LSE-weighted sum.
    float lse[1][2];
    w.softmax.finalize(w.acc_o, p.softmax_scale_log2, lse);   // O /= l
    __syncthreads();   // every warp is done with Q and its ring
    float* merge_o = reinterpret_cast<float*>(smem_raw + Kt::kQBytes + warp * Kt::kWarpBytes);
    float* merge_lse = reinterpret_cast<float*>(smem_raw);   // [kWarps][kBlockM]
    const int g = lane / kQuadLanes;
    const int t = lane % kQuadLanes;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = g + h * kFragRowHalf;
#pragma unroll
        for (int nd = 0; nd < Kt::kDTiles; ++nd) {
            float2 v2;
            v2.x = w.acc_o[0][nd][2 * h];
            v2.y = w.acc_o[0][nd][2 * h + 1];
            *reinterpret_cast<float2*>(merge_o + r * Kt::kHeadDim + nd * kMmaN + kFragCols * t) = v2;
        }
        if (t == 0) merge_lse[warp * Kt::kBlockM + r] = lse[0][h];
    }
    __syncthreads();

    const SplitPartials part(p);
    constexpr int kVec = 4;
    constexpr int kRowVecs = Kt::kHeadDim / kVec;
    for (int idx = tid; idx < Kt::kBlockM * kRowVecs; idx += Kt::kThreads) {
        const int r = idx / kRowVecs;
        const int c = (idx % kRowVecs) * kVec;
        const int row = row0 + r;
        if (row >= pack.rows || c >= cols) continue;
        float m = FLASHKIT_NEG_INF;
#pragma unroll
        for (int ww = 0; ww < Kt::kWarps; ++ww) m = fmaxf(m, merge_lse[ww * Kt::kBlockM + r]);
        float row_lse = FLASHKIT_NEG_INF;
        float acc[kVec] = {0.f, 0.f, 0.f, 0.f};
        if (m != FLASHKIT_NEG_INF) {
            float sum = 0.f;
#pragma unroll
            for (int ww = 0; ww < Kt::kWarps; ++ww) sum += exp_diff(merge_lse[ww * Kt::kBlockM + r], m);
            row_lse = m + fast_log2(sum) * kLn2;
#pragma unroll
            for (int ww = 0; ww < Kt::kWarps; ++ww) {
                const float wt = exp_diff(merge_lse[ww * Kt::kBlockM + r], row_lse);
                const float4 o = *reinterpret_cast<const float4*>(
                    smem_raw + Kt::kQBytes + ww * Kt::kWarpBytes + (r * Kt::kHeadDim + c) * 4);
                acc[0] += wt * o.x;
                acc[1] += wt * o.y;
                acc[2] += wt * o.z;
                acc[3] += wt * o.w;
            }
        }
        const index_t out_row = (static_cast<index_t>(batch) * p.heads + pack.head(row)) * p.seqlen_q +
                                pack.query_row(row);
        if (p.cache.splits == 1) {
            store4(output_row<OutT>(p, out_row) + c, acc[0], acc[1], acc[2], acc[3]);
            if (c == 0 && p.lse != nullptr) p.lse[out_row] = row_lse;
        } else {
            *reinterpret_cast<float4*>(part.o_row(split, out_row) + c) = make_float4(acc[0], acc[1], acc[2], acc[3]);
            if (c == 0) part.lse_of(split, out_row) = row_lse;
        }
    }
}

}  // namespace flashkit
