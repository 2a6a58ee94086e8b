/*---
name: fa1
summary: FlashAttention-1 forward as in its paper (K/V-outer loop, running O, m, l in global memory)
entry: flashkit_fa1_fwd
arch: {min: "8.0", targets: {"8.6": sm_86}}
dtypes: [float16, bfloat16]
head_dims: [64, 128, 256]
features: {causal: true, block_sparse: false, fp8: false, backward: false, lse: true, gqa: true}
priority: 10
launch: {grid: heads, block_m: 128, block_n: 64, warps: 4}
overrides: {"hd128": {block_n: 32}, "hd256": {warps: 8}, "8.6": {}, "8.6/hd256": &hd256_99kb {block_n: 32},
            "12.0": {}, "12.0/hd256": *hd256_99kb}
# sm_86 / sm_89 and sm_120 (99 KB of shared memory a block) take smaller tiles where these do not fit: hd256 on 32-key tiles (96 KB against 128 KB).
workspace: running_state
---*/
// FlashAttention-1 forward (Dao et al., 2022, Algorithm 1), tensor cores through mma.sync.
// Grid (heads, batch): one CTA per (head, batch). Outer loop over K/V tiles j (resident in
// shared memory), inner loop over query tiles i; the running state of every query row lives in
// global memory (the running_state workspace) and is read and written back at every (i, j):
//   S = Q_i K_j^T (scaled by c = softmax_scale * log2 e inside exp2)
//   m~ = rowmax(S),  P = exp2(S c - m~ c),  l~ = rowsum(P)
//   m_new = max(m, m~),  l_new = exp2((m - m_new) c) l + exp2((m~ - m_new) c) l~
//   O_new = (l exp2((m - m_new) c) O + exp2((m~ - m_new) c) P V_j) / l_new   (O kept normalized)
// Workspace (float32), per (batch, head) slab b * heads + h:
//   O at [slab][seqlen_q][head_dim], then m at [slab][seqlen_q], then l at [slab][seqlen_q].
// The CTA initialises its own slab (m = -inf, l = 0, O = 0): the workspace is not zeroed.
// Rows that never see a key keep l = 0 and end with O = 0, LSE = -inf.
#include "flashkit/sm80/fwd_mainloop.cuh"

using namespace flashkit;
typedef KernelTraits Kt;
typedef DenseMask<FLASHKIT_CAUSAL, Kt::kBlockM, Kt::kBlockN>::type Fa1Mask;
constexpr bool kCausal = FLASHKIT_CAUSAL != 0;

FLASHKIT_EXPORT_SMEM_BYTES(Kt::kSmemBytes);

// One (query tile m0, K/V tile n0) step of Algorithm 1 for this warp's rows.
__device__ __forceinline__ void fa1_step(FwdMainloop<Kt, Fa1Mask>& tile, const Fa1Mask& mask,
                                         const Params& p, float* ws_o, float* ws_m, float* ws_l,
                                         int m0, int n0, int warp, int lane) {
    const float c = p.softmax_scale_log2;
    const int g = lane / kQuadLanes;
    const int t = lane % kQuadLanes;
    const int row0 = m0 + warp * Kt::kWarpRows + g;   // absolute row of (mi = 0, h = 0)
    const int col_lane = kFragCols * t;

    // Old state of the owned rows (rows >= seqlen_q: empty state, never written).
    float m_old[Kt::kMTiles][2], l_old[Kt::kMTiles][2];
#pragma unroll
    for (int mi = 0; mi < Kt::kMTiles; ++mi)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = row0 + mi * kMmaM + h * kFragRowHalf;
            const bool valid = row < p.seqlen_q;
            m_old[mi][h] = valid ? ws_m[row] : FLASHKIT_NEG_INF;
            l_old[mi][h] = valid ? ws_l[row] : 0.f;
        }

    // S = Q_i K_j^T; mask the K tail and, when causal, tiles crossing the diagonal.
    float s[Kt::kMTiles][Kt::kNTiles][4];
    tile.gemm_qk(s);
    const bool tail = n0 + Kt::kBlockN > p.seqlen_k;
    const bool diagonal = kCausal && n0 + Kt::kBlockN - 1 > m0 + (p.seqlen_k - p.seqlen_q);
    if (tail || diagonal) apply_mask(mask, s, row0, n0 + col_lane);

    // Block statistics m~, P, l~ and the combination coefficients of the old and new parts.
    float coef_old[Kt::kMTiles][2], coef_new[Kt::kMTiles][2], l_new[Kt::kMTiles][2];
#pragma unroll
    for (int mi = 0; mi < Kt::kMTiles; ++mi)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float m_blk = FLASHKIT_NEG_INF;
#pragma unroll
            for (int ni = 0; ni < Kt::kNTiles; ++ni)
                m_blk = fmaxf(m_blk, fmaxf(s[mi][ni][2 * h], s[mi][ni][2 * h + 1]));
            m_blk = quad_max(m_blk);
            const float m_blk_scaled = scaled_row_max(m_blk, c);
            float l_blk = 0.f;
#pragma unroll
            for (int ni = 0; ni < Kt::kNTiles; ++ni)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    float& x = s[mi][ni][2 * h + e];
                    x = fast_exp2(fmaf(x, c, -m_blk_scaled));   // P = exp2(S c - m~ c)
                    l_blk += x;
                }
            l_blk = quad_sum(l_blk);
            const float m_new = fmaxf(m_old[mi][h], m_blk);
            const float m_new_scaled = scaled_row_max(m_new, c);
            coef_old[mi][h] = fast_exp2(m_old[mi][h] * c - m_new_scaled);
            coef_new[mi][h] = fast_exp2(m_blk * c - m_new_scaled);
            l_new[mi][h] = coef_old[mi][h] * l_old[mi][h] + coef_new[mi][h] * l_blk;
            m_old[mi][h] = m_new;   // now holds m_new
        }

    // P V_j into the (zeroed) accumulator.
#pragma unroll
    for (int mi = 0; mi < Kt::kMTiles; ++mi)
#pragma unroll
        for (int nd = 0; nd < Kt::kDTiles; ++nd)
#pragma unroll
            for (int e = 0; e < 4; ++e) tile.acc_o[mi][nd][e] = 0.f;
    tile.gemm_pv(s);

    __syncwarp();   // every lane of a quad has read m, l before lane t = 0 rewrites them
#pragma unroll
    for (int mi = 0; mi < Kt::kMTiles; ++mi)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = row0 + mi * kMmaM + h * kFragRowHalf;
            if (row >= p.seqlen_q) continue;
            const float inv_l = l_new[mi][h] > 0.f ? 1.f / l_new[mi][h] : 0.f;
            const float w_old = l_old[mi][h] * coef_old[mi][h] * inv_l;
            const float w_new = coef_new[mi][h] * inv_l;
            float* o_row = ws_o + static_cast<index_t>(row) * Kt::kHeadDim + col_lane;
#pragma unroll
            for (int nd = 0; nd < Kt::kDTiles; ++nd) {
                float2* o2 = reinterpret_cast<float2*>(o_row + nd * kMmaN);
                float2 o = *o2;   // O_new = w_old O + w_new (P V)
                o.x = w_old * o.x + w_new * tile.acc_o[mi][nd][2 * h];
                o.y = w_old * o.y + w_new * tile.acc_o[mi][nd][2 * h + 1];
                *o2 = o;
            }
            if (t == 0) {
                ws_m[row] = m_old[mi][h];
                ws_l[row] = l_new[mi][h];
            }
        }
}

extern "C" __global__ void __launch_bounds__(Kt::kThreads)
    flashkit_fa1_fwd(const flashkit::Params params) {
    const Params& p = params;
    const int head = blockIdx.x;
    const int batch = blockIdx.y;
    const int tid = threadIdx.x;
    const int warp = tid / kWarpSize;
    const int lane = tid % kWarpSize;
    extern __shared__ __align__(128) unsigned char smem_raw[];
    const u32 sQ = smem_u32(smem_raw);

    // This (batch, head)'s slab of the running state.
    const index_t slab = static_cast<index_t>(batch) * p.heads + head;
    const index_t rows_total = static_cast<index_t>(p.batch) * p.heads * p.seqlen_q;
    float* ws = static_cast<float*>(p.workspace);
    float* ws_o = ws + slab * p.seqlen_q * Kt::kHeadDim;
    float* ws_m = ws + rows_total * Kt::kHeadDim + slab * p.seqlen_q;
    float* ws_l = ws + rows_total * (Kt::kHeadDim + 1) + slab * p.seqlen_q;
    for (int i = tid; i < p.seqlen_q * Kt::kHeadDim; i += Kt::kThreads) ws_o[i] = 0.f;
    for (int i = tid; i < p.seqlen_q; i += Kt::kThreads) {
        ws_m[i] = FLASHKIT_NEG_INF;
        ws_l[i] = 0.f;
    }
    __syncthreads();

    const Fa1Mask mask(p, 0);   // only key_end() is used: it does not depend on the block
    FwdMainloop<Kt, Fa1Mask> tile(mask, p, sQ, head, batch, SeqOrigin{0, 0, batch}, tid);
    const Element* q_gmem =
        static_cast<const Element*>(p.q) + batch * p.q_batch_stride + head * p.q_head_stride;
    const int n_kv_blocks = ceil_div(p.seqlen_k, Kt::kBlockN);
    const int n_q_blocks = ceil_div(p.seqlen_q, Kt::kBlockM);
    const int offset = p.seqlen_k - p.seqlen_q;   // causal diagonal: key i + offset

    for (int j = 0; j < n_kv_blocks; ++j) {   // outer: K_j, V_j to shared memory
        const int n0 = j * Kt::kBlockN;
        tile.template load_kv_async<false>(tile.sK, j);
        tile.template load_kv_async<true>(tile.sV, j);
        // Causal: query rows below n0 - offset see none of this tile.
        const int i_first = kCausal ? max(0, n0 - offset) / Kt::kBlockM : 0;
        for (int i = i_first; i < n_q_blocks; ++i) {   // inner: Q_i, then the state update
            const int m0 = i * Kt::kBlockM;
            load_tile_async<Kt::kBlockM, Kt::kHeadDim, Kt::kThreads>(
                sQ, q_gmem + m0 * p.q_row_stride, p.q_row_stride, p.seqlen_q - m0, tid);
            cp_async_commit();
            cp_async_wait<0>();
            __syncthreads();   // Q_i (and K_j, V_j) resident
            if constexpr (Kt::kQInRegs) tile.load_q_registers();
            fa1_step(tile, mask, p, ws_o, ws_m, ws_l, m0, n0, warp, lane);
            __syncthreads();   // every warp is done with Q_i (and with K_j, V_j after the last i)
        }
        cp_async_wait<0>();   // an empty inner loop leaves K_j, V_j in flight
        __syncthreads();
    }

    // Epilogue: O (already normalized) -> output type; LSE = m * scale + ln(l).
    typedef typename Kt::OutT OutT;
    OutT* o_gmem = static_cast<OutT*>(p.o) + batch * p.o_batch_stride + head * p.o_head_stride;
    constexpr int kPairs = Kt::kHeadDim / 2;
    for (int i = tid; i < p.seqlen_q * kPairs; i += Kt::kThreads) {
        const int row = i / kPairs;
        const int col = (i % kPairs) * 2;
        const float2 o = *reinterpret_cast<const float2*>(ws_o + row * Kt::kHeadDim + col);
        *reinterpret_cast<u32*>(o_gmem + row * p.o_row_stride + col) = pack_float2<OutT>(o.x, o.y);
    }
    if (p.lse != nullptr) {
        float* lse = p.lse + slab * p.seqlen_q;
        for (int row = tid; row < p.seqlen_q; row += Kt::kThreads) {
            const float l = ws_l[row];
            lse[row] = l > 0.f ? (ws_m[row] * p.softmax_scale_log2 + fast_log2(l)) * kLn2
                               : FLASHKIT_NEG_INF;
        }
    }
}
