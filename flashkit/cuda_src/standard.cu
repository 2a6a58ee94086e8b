/*---
name: standard
summary: textbook attention baseline in three kernels (S = scale Q K^T, row softmax, O = P V), scores in fp32 workspace
entry: [flashkit_standard_scores, flashkit_standard_softmax, flashkit_standard_pv]
arch: {min: "7.5"}                # NVRTC 13 has no sm_70/72
dtypes: [float16, bfloat16, float32]
head_dims: {min: 8, max: 256, multiple_of: 8}
features: {causal: true, block_sparse: false, fp8: false, backward: false, lse: true, gqa: true}
priority: 0
launch: {grid: [score_tiles, row_groups, q_blocks], block_m: 64, block_n: 64, block_k: 16, warps: 4}
workspace: scores
---*/
// The materialized-scores baseline every other variant is measured against:
//   stage 1 (score_tiles): S = softmax_scale * Q K^T, masked entries -inf   -> workspace (B, H, Sq, Sk) fp32
//   stage 2 (row_groups):  P = softmax(S) in place, one warp per row; LSE = m + log(l)
//   stage 3 (q_blocks):    O = P V, converted to the output dtype
// Stages 1 and 3 are classic shared-memory tiled GEMMs with fp32 FMA (no tensor cores, no cuBLAS).
#include "flashkit/numeric.cuh"
#include "flashkit/params.cuh"

#ifndef FLASHKIT_BLOCK_K
#define FLASHKIT_BLOCK_K 16
#endif

namespace flashkit {
namespace standard {

typedef DType<FLASHKIT_DTYPE>::type Elem;
typedef DType<FLASHKIT_OUT_DTYPE>::type Out;

constexpr int kHeadDim = FLASHKIT_HEAD_DIM;
constexpr int kThreads = FLASHKIT_WARPS * 32;
constexpr int kBlockM = FLASHKIT_BLOCK_M;      // rows of S / O per block
constexpr int kBlockN = FLASHKIT_BLOCK_N;      // columns of S (keys) / of O (head-dim chunk) per block
constexpr int kBlockK = FLASHKIT_BLOCK_K;      // reduction slice staged in shared memory
constexpr int kThreadsX = 16;                  // threads along a tile's columns
constexpr int kThreadsY = kThreads / kThreadsX;
constexpr int kRowsPerThread = kBlockM / kThreadsY;
constexpr int kColsPerThread = kBlockN / kThreadsX;
constexpr int kWarpSize = 32;

static_assert(kThreads % kThreadsX == 0, "warps * 32 must be a multiple of 16");
static_assert(kBlockM % kThreadsY == 0, "block_m must be a multiple of warps * 2");
static_assert(kBlockN % kThreadsX == 0, "block_n must be a multiple of 16");

// A reduction slice of both GEMM operands, stored k-major so the inner product reads rows:
// a[k][m] = A[m][k], b[k][n] = B[k][n]. The +1 pads away bank conflicts on the transposed stores.
struct SmemTile {
    float a[kBlockK][kBlockM + 1];
    float b[kBlockK][kBlockN + 1];
};

// acc[i][j] += sum_k a[k][ty + i*kThreadsY] * b[k][tx + j*kThreadsX]
__device__ __forceinline__ void tile_fma(const SmemTile& t, float (&acc)[kRowsPerThread][kColsPerThread],
                                         int tx, int ty) {
#pragma unroll
    for (int kk = 0; kk < kBlockK; ++kk) {
        float a[kRowsPerThread], b[kColsPerThread];
#pragma unroll
        for (int i = 0; i < kRowsPerThread; ++i) a[i] = t.a[kk][ty + i * kThreadsY];
#pragma unroll
        for (int j = 0; j < kColsPerThread; ++j) b[j] = t.b[kk][tx + j * kThreadsX];
#pragma unroll
        for (int i = 0; i < kRowsPerThread; ++i)
#pragma unroll
            for (int j = 0; j < kColsPerThread; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
}

// float -> output element. bf16 rounding has no cvt below sm_80: round to nearest even by hand there.
__device__ __forceinline__ Out to_out(float f) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800 && FLASHKIT_OUT_DTYPE == FLASHKIT_BFLOAT16
    const u32 bits = __float_as_uint(f);
    const bool nan = (bits & 0x7fffffffu) > 0x7f800000u;
    Out r;
    r.bits = nan ? static_cast<u16>(0x7fc0u) : static_cast<u16>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
    return r;
#else
    return from_float<Out>(f);
#endif
}

// Causal, bottom-right aligned: query i sees key j iff j <= i + seqlen_k - seqlen_q.
__device__ __forceinline__ bool visible(int row, int col, int seqlen_q, int seqlen_k) {
    return !FLASHKIT_CAUSAL || col <= row + seqlen_k - seqlen_q;
}

// Row `row` of the (B, H, Sq, Sk) fp32 scores workspace for head bh = b * heads + h.
__device__ __forceinline__ float* scores_row(const Params& p, int bh, int row) {
    return static_cast<float*>(p.workspace) + (static_cast<index_t>(bh) * p.seqlen_q + row) * p.seqlen_k;
}

}  // namespace standard
}  // namespace flashkit

using namespace flashkit;
using namespace flashkit::standard;

// Stage 1: S[b, h, m, n] = softmax_scale * sum_d Q[b, m, h, d] K[b, n, h_kv, d]; masked -> -inf.
// Grid (ceil(Sk / block_n), ceil(Sq / block_m), batch * heads).
extern "C" __global__ void __launch_bounds__(kThreads)
flashkit_standard_scores(const flashkit::Params params) {
    __shared__ SmemTile smem;
    const int tid = threadIdx.x, tx = tid % kThreadsX, ty = tid / kThreadsX;
    const int col0 = blockIdx.x * kBlockN, row0 = blockIdx.y * kBlockM;
    const int bh = blockIdx.z, b = bh / params.heads, h = bh % params.heads;
    const int h_kv = h / (params.heads / params.kv_heads);
    const int sq = params.seqlen_q, sk = params.seqlen_k, dim = kHeadDim;
    const float neg_inf = FLASHKIT_NEG_INF;

    // A tile whose first key lies past the last row's horizon is fully masked: skip the GEMM.
    const int last_row = min(row0 + kBlockM, sq) - 1;
    const bool all_masked = FLASHKIT_CAUSAL && col0 > last_row + sk - sq;

    const Elem* q = static_cast<const Elem*>(params.q) + b * params.q_batch_stride + h * params.q_head_stride;
    const Elem* k = static_cast<const Elem*>(params.k) + b * params.k_batch_stride + h_kv * params.k_head_stride;

    float acc[kRowsPerThread][kColsPerThread] = {};
    for (int d0 = 0; d0 < dim && !all_masked; d0 += kBlockK) {
        // Stage Q[row0 .. +kBlockM, d0 .. +kBlockK] and K[col0 .. +kBlockN, d0 .. +kBlockK], zero-filled tails.
        for (int idx = tid; idx < kBlockM * kBlockK; idx += kThreads) {
            const int m = idx / kBlockK, kk = idx % kBlockK, row = row0 + m, d = d0 + kk;
            smem.a[kk][m] = (row < sq && d < dim) ? to_float(q[row * params.q_row_stride + d]) : 0.0f;
        }
        for (int idx = tid; idx < kBlockN * kBlockK; idx += kThreads) {
            const int n = idx / kBlockK, kk = idx % kBlockK, col = col0 + n, d = d0 + kk;
            smem.b[kk][n] = (col < sk && d < dim) ? to_float(k[col * params.k_row_stride + d]) : 0.0f;
        }
        __syncthreads();
        tile_fma(smem, acc, tx, ty);
        __syncthreads();
    }

#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
        const int row = row0 + ty + i * kThreadsY;
        if (row >= sq) continue;
        float* s_row = scores_row(params, bh, row);
#pragma unroll
        for (int j = 0; j < kColsPerThread; ++j) {
            const int col = col0 + tx + j * kThreadsX;
            if (col < sk) s_row[col] = visible(row, col, sq, sk) ? params.softmax_scale * acc[i][j] : neg_inf;
        }
    }
}

// Stage 2: P = softmax(S) row-wise, in place; one warp per query row.
// m = max_j S_j, l = sum_j exp(S_j - m), P_j = exp(S_j - m) / l, LSE = m + log(l).
// A row with every score -inf gets P = 0 and LSE = -inf.
// Grid (ceil(Sq / warps), heads, batch).
extern "C" __global__ void __launch_bounds__(kThreads)
flashkit_standard_softmax(const flashkit::Params params) {
    const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
    const int row = blockIdx.x * FLASHKIT_WARPS + warp;
    if (row >= params.seqlen_q) return;
    const int h = blockIdx.y, b = blockIdx.z, bh = b * params.heads + h;
    const int sk = params.seqlen_k;
    const float neg_inf = FLASHKIT_NEG_INF;
    float* s_row = scores_row(params, bh, row);

    // m = max_j S_j
    float m = neg_inf;
    for (int j = lane; j < sk; j += kWarpSize) m = fmaxf(m, s_row[j]);
#pragma unroll
    for (int off = kWarpSize / 2; off > 0; off /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));

    // A fully masked row: P = 0, LSE = -inf (S - m would be -inf - -inf = NaN).
    const bool empty = (m == neg_inf);
    const float m_safe = empty ? 0.0f : m;

    // l = sum_j exp(S_j - m)
    float l = 0.0f;
    for (int j = lane; j < sk; j += kWarpSize) l += expf(s_row[j] - m_safe);
#pragma unroll
    for (int off = kWarpSize / 2; off > 0; off /= 2) l += __shfl_xor_sync(0xffffffffu, l, off);

    // P_j = exp(S_j - m) / l
    const float inv_l = empty ? 0.0f : 1.0f / l;
    for (int j = lane; j < sk; j += kWarpSize) s_row[j] = expf(s_row[j] - m_safe) * inv_l;

    if (params.lse != nullptr && lane == 0)
        params.lse[static_cast<index_t>(bh) * params.seqlen_q + row] = empty ? neg_inf : m + logf(l);
}

// Stage 3: O[b, m, h, d] = sum_n P[b, h, m, n] V[b, n, h_kv, d], tiled over (rows, head-dim chunks of block_n).
// Grid (ceil(Sq / block_m), heads, batch).
extern "C" __global__ void __launch_bounds__(kThreads)
flashkit_standard_pv(const flashkit::Params params) {
    __shared__ SmemTile smem;
    const int tid = threadIdx.x, tx = tid % kThreadsX, ty = tid / kThreadsX;
    const int row0 = blockIdx.x * kBlockM, h = blockIdx.y, b = blockIdx.z;
    const int bh = b * params.heads + h, h_kv = h / (params.heads / params.kv_heads);
    const int sq = params.seqlen_q, sk = params.seqlen_k, dim = kHeadDim;

    // Under the causal mask P is 0 past the last row's horizon: stop the reduction there.
    const int last_row = min(row0 + kBlockM, sq) - 1;
    const int key_end = FLASHKIT_CAUSAL ? max(0, min(sk, last_row + sk - sq + 1)) : sk;

    const float* p_tile = scores_row(params, bh, 0);
    const Elem* v = static_cast<const Elem*>(params.v) + b * params.v_batch_stride + h_kv * params.v_head_stride;
    Out* o = static_cast<Out*>(params.o) + b * params.o_batch_stride + h * params.o_head_stride;

    for (int c0 = 0; c0 < dim; c0 += kBlockN) {
        float acc[kRowsPerThread][kColsPerThread] = {};
        for (int n0 = 0; n0 < key_end; n0 += kBlockK) {
            // Stage P[row0 .. +kBlockM, n0 .. +kBlockK] and V[n0 .. +kBlockK, c0 .. +kBlockN], zero-filled tails.
            for (int idx = tid; idx < kBlockM * kBlockK; idx += kThreads) {
                const int m = idx / kBlockK, kk = idx % kBlockK, row = row0 + m, n = n0 + kk;
                smem.a[kk][m] = (row < sq && n < key_end) ? p_tile[static_cast<index_t>(row) * sk + n] : 0.0f;
            }
            for (int idx = tid; idx < kBlockK * kBlockN; idx += kThreads) {
                const int kk = idx / kBlockN, c = idx % kBlockN, n = n0 + kk, d = c0 + c;
                smem.b[kk][c] = (n < key_end && d < dim) ? to_float(v[n * params.v_row_stride + d]) : 0.0f;
            }
            __syncthreads();
            tile_fma(smem, acc, tx, ty);
            __syncthreads();
        }

        // Epilogue: O = P V in the output dtype; rows past seqlen_q and columns past head_dim untouched.
#pragma unroll
        for (int i = 0; i < kRowsPerThread; ++i) {
            const int row = row0 + ty + i * kThreadsY;
            if (row >= sq) continue;
#pragma unroll
            for (int j = 0; j < kColsPerThread; ++j) {
                const int d = c0 + tx + j * kThreadsX;
                if (d < dim) o[row * params.o_row_stride + d] = to_out(acc[i][j]);
            }
        }
    }
}

FLASHKIT_EXPORT_SMEM_BYTES(0);
