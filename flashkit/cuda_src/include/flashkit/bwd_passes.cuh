// What every backward kernel family shares (fa2_bwd's mma.sync main loop in sm80/, fa3_bwd's wgmma one in
// hopper/): the dq_accum workspace, the causal geometry of a key block, and the two light passes around the
// main kernel, one CTA per (query block, head, batch):
//   bwd_prepass:    dsum_i = rowsum(dO_i * O_i) (fp32), lse2_i = LSE_i * log2(e) (+inf where the row
//                   sees no key or lies past seqlen_q), dq_accum rows and the block's semaphore zeroed
//   bwd_convert_dq: dQ = dq_accum in the input dtype, read in the main kernel's dq_accum layout
//                   (dq_layout.cuh), scaled by softmax_scale unless the main kernel's sums already are
// With FLASHKIT_VARLEN each CTA sees its packed sequence (varlen.cuh): q, o, dO, dQ and the LSE rows are
// offset by the sequence's origin; the workspace keeps one padded slot per (sequence, head), sized by
// max_seqlen_q (BwdWorkspace over the call's parameter block, not the sequence's view).
// The passes read of their traits Kt only Element, kHeadDim, kHeadDimV, kBlockM, kWarps and kThreads (BwdPassTraits).
// head_dim_v (v narrower than q and k; DeepSeek's MLA: 128 under 192): V, dO and dV have a head-dim class of their
// own, kHeadDimV (FLASHKIT_HEAD_DIM_V), padded as Q's is (FLASHKIT_HEAD_DIM_V_PADDED: columns past the call's
// head_dim_v zero-filled by the loads, so dP^T = V dO^T adds exact zeros there, and dV's past it not stored);
// dsum = rowsum(dO O) runs over head_dim_v (BwdVColumns).
#pragma once

#include "flashkit/dq_layout.cuh"
#include "flashkit/params.cuh"
#include "flashkit/traits.cuh"
#include "flashkit/varlen.cuh"

namespace flashkit {

// The columns of V, dO, O and dV a backward build reads and writes: v's class where V is not padded, else the call's
// head_dim_v where v has a head dim of its own, else its head_dim (the same value, and the code of before).
struct BwdVColumns {
    static constexpr bool kPadded = FLASHKIT_HEAD_DIM_V_PADDED != 0;
    // v's head dim below q's and k's: dV's columns end at head_dim_v (a main kernel may run V's tiles wider than
    // v's class, zero-filled, as fa3_bwd's column split does).
    static constexpr bool kNarrower = FLASHKIT_OWN_HEAD_DIM_V != 0;
    __device__ __forceinline__ static int call(const Params& p) {
        return FLASHKIT_OWN_HEAD_DIM_V ? p.head_dim_v : p.head_dim;
    }
    // Whether dV's column col lies past the call's head_dim_v (whole 8-column tiles: head_dim_v is a multiple of 8),
    // so that it holds zeros and is not stored; kClip: the build's V tiles may reach past head_dim_v.
    template <bool kClip>
    __device__ __forceinline__ static bool past(const Params& p, int col) {
        return kClip && col >= call(p);
    }
};

// Where the main kernels' epilogues store: dK's and dV's rows from key row key_row of (batch, kv_head) on (batch: the
// tensors' own, varlen's packed batch included; key_row: the sequence's origin plus the block's first key).
template <typename Element>
struct BwdGradRows {
    Element* dk;
    Element* dv;
    __device__ __forceinline__ BwdGradRows(const Params& p, int batch, int kv_head, index_t key_row)
        : dk(static_cast<Element*>(p.bwd.dk) + batch * p.bwd.dk_batch_stride + kv_head * p.bwd.dk_head_stride +
             key_row * p.bwd.dk_row_stride),
          dv(static_cast<Element*>(p.bwd.dv) + batch * p.bwd.dv_batch_stride + kv_head * p.bwd.dv_head_stride +
             key_row * p.bwd.dv_row_stride) {}
};

// The geometry the passes need, for a main kernel whose own traits carry more (or other) constraints.
template <typename Element_, int kHeadDim_, int kBlockM_, int kWarps_, int kHeadDimV_ = kHeadDim_>
struct BwdPassTraits {
    typedef Element_ Element;
    static constexpr int kHeadDim = kHeadDim_;
    static constexpr int kHeadDimV = kHeadDimV_;   // of dO and O (the pre-pass's rowsum)
    static constexpr int kBlockM = kBlockM_;
    static constexpr int kWarps = kWarps_;
    static constexpr int kThreads = kWarps * kWarpSize;
};

// The workspace (manifest kind dq_accum), all fp32 over seqlen_q padded to whole query blocks:
//   dq_accum (batch, heads, seqlen_pad, D) | lse2 (batch, heads, seqlen_pad) | dsum (same) |
//   semaphores (batch, heads, m_blocks) int32
// lse2 = LSE * log2(e), +inf where a row sees no key or lies past seqlen_q (so that P = 0 there);
// dsum = rowsum(dO * O). The pre-pass writes lse2 and dsum and zeroes dq_accum and the semaphores.
// Varlen (FLASHKIT_VARLEN): batch = the packed sequences, seqlen_q = max_seqlen_q: sequence b's rows use
// slot b (its first ceil(len_q / kBlockM) blocks); build it from the call's parameter block, never from a
// sequence's view (varlen.cuh), whose seqlen_q is the sequence's own.
// D is the compiled head dim kHeadDim (the class; a padded call's columns past Params.head_dim stay 0).
template <int kBlockM, int kHeadDim>
struct BwdWorkspace {
    float* dq_accum;
    float* lse2;
    float* dsum;
    int* sema;
    int m_blocks, seqlen_pad;
    __device__ __forceinline__ BwdWorkspace(const Params& p) {
        m_blocks = (p.seqlen_q + kBlockM - 1) / kBlockM;
        seqlen_pad = m_blocks * kBlockM;
        const index_t rows = static_cast<index_t>(p.batch) * p.heads * seqlen_pad;
        dq_accum = static_cast<float*>(p.workspace);
        lse2 = dq_accum + rows * kHeadDim;
        dsum = lse2 + rows;
        sema = reinterpret_cast<int*>(dsum + rows);
    }
    // First padded row of (batch, head).
    __device__ __forceinline__ index_t row0(const Params& p, int batch, int head) const {
        return (static_cast<index_t>(batch) * p.heads + head) * seqlen_pad;
    }
    __device__ __forceinline__ int* semaphore(const Params& p, int batch, int head, int m_block) const {
        return sema + (static_cast<index_t>(batch) * p.heads + head) * m_blocks + m_block;
    }
    // The same, of the query block starting at padded row ws_row (row0 + m_block kBlockM).
    __device__ __forceinline__ int* semaphore(index_t ws_row) const { return sema + ws_row / kBlockM; }
};

// Causal, bottom-right aligned: key j is visible to query i iff j <= i + seqlen_k - seqlen_q.
template <bool kCausal>
struct BwdCausal {
    // First query block that sees any key of the block starting at key n0 (m_blocks: none does).
    __device__ __forceinline__ static int first_m_block(const Params& p, int n0, int block_m) {
        if (!kCausal) return 0;
        const int q_lo = n0 - (p.seqlen_k - p.seqlen_q);   // smallest query that sees key n0
        if (q_lo >= p.seqlen_q) return (p.seqlen_q + block_m - 1) / block_m;
        return q_lo > 0 ? q_lo / block_m : 0;
    }
    // Whether tile (query block at m0, key block at n0) crosses the diagonal; offset = seqlen_k - seqlen_q.
    __device__ __forceinline__ static bool crosses(int offset, int m0, int n0, int block_n) {
        return kCausal && n0 + block_n - 1 > m0 + offset;
    }
};

// Deterministic dQ: spin until the semaphore of (batch, head, m_block) reads `want` (the key blocks before
// this one have added their dQ), with acquire semantics so that their adds are visible first.
__device__ __forceinline__ void wait_semaphore(const int* sema, int want) {
    int seen;
    do {
        asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(seen) : "l"(sema) : "memory");
    } while (seen != want);
}

// +inf as a float bit pattern: exp2(s - (+inf)) = 0 for every finite or -inf s.
#define FLASHKIT_POS_INF (__int_as_float(0x7f800000))

// rowsum(dO * O) over a row's first `words` loads of Word (uint4: 8 elements, u32: a pair), by the kLanes lanes of
// a row group (lane_in_row of them): each lane's words, then a butterfly over the group (every lane ends with the
// sum).
template <typename Element, typename Word, int kLanes>
__device__ __forceinline__ float row_dot(const Word* d, const Word* o, int words, int lane_in_row) {
    constexpr int kPairs = static_cast<int>(sizeof(Word) / sizeof(u32));   // 16-bit pairs of a word
    float acc = 0.f;
    for (int c = lane_in_row; c < words; c += kLanes) {
        const Word dv = d[c], ov = o[c];
        const u32* dw = reinterpret_cast<const u32*>(&dv);
        const u32* ow = reinterpret_cast<const u32*>(&ov);
#pragma unroll
        for (int w = 0; w < kPairs; ++w) {
            float d0, d1, o0, o1;
            unpack_float2<Element>(dw[w], d0, d1);
            unpack_float2<Element>(ow[w], o0, o1);
            acc = fmaf(d0, o0, fmaf(d1, o1, acc));
        }
    }
#pragma unroll
    for (int s = kLanes / 2; s > 0; s /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, s);
    return acc;
}

// The largest power of two at most n (n >= 1).
__host__ __device__ constexpr int floor_pow2(int n) { return n & (n - 1) ? floor_pow2(n & (n - 1)) : n; }

__device__ __forceinline__ bool aligned16(const void* p, index_t row_stride_elems, int elem_bytes) {
    return (reinterpret_cast<unsigned long long>(p) % 16 == 0) && (row_stride_elems * elem_bytes) % 16 == 0;
}

// Query block m_block of (head, sequence `batch`); p: the sequence's view, origin: where its rows lie.
template <class Kt>
__device__ __forceinline__ void bwd_prepass_block(const Params& p, const BwdWorkspace<Kt::kBlockM, Kt::kHeadDim>& ws,
                                                  int m_block, int head, int batch, const SeqOrigin& origin) {
    typedef typename Kt::Element Element;
    constexpr int kD = Kt::kHeadDim;     // of a dq_accum row
    constexpr int kDv = Kt::kHeadDimV;   // of a dO and O row
    constexpr int kElem = static_cast<int>(sizeof(Element));
    constexpr int kChunkElems = 16 / kElem;                                  // elements of a 16-byte chunk
    // The lanes of a row: one a chunk of v's class's row, at most a warp, rounded down to a power of two (192's 24
    // chunks: 16 lanes, some taking two).
    constexpr int kRowChunks = kDv / kChunkElems < kWarpSize ? kDv / kChunkElems : kWarpSize;
    constexpr int kRowLanes = floor_pow2(kRowChunks);
    constexpr int kRowsPerWarp = kWarpSize / kRowLanes;
    static_assert((kRowLanes & (kRowLanes - 1)) == 0, "a power-of-two lane group per row");
    // 16-bit pairs (chunks) of a dO and O row that hold data: v's head dim when it is below the compiled class
    const int pairs = BwdVColumns::kPadded ? BwdVColumns::call(p) / 2 : kDv / 2;
    const int chunks = BwdVColumns::kPadded ? BwdVColumns::call(p) / kChunkElems : kDv / kChunkElems;
    const int tid = threadIdx.x;
    const int warp = tid / kWarpSize;
    const int lane = tid % kWarpSize;
    const int m0 = m_block * Kt::kBlockM;
    const index_t ws_row0 = ws.row0(p, batch, head) + m0;
    const Element* dout = static_cast<const Element*>(p.bwd.dout) + origin.batch * p.bwd.do_batch_stride +
                          head * p.bwd.do_head_stride + static_cast<index_t>(origin.q_row) * p.bwd.do_row_stride;
    const Element* out = static_cast<const Element*>(p.o) + origin.batch * p.o_batch_stride +
                         head * p.o_head_stride + static_cast<index_t>(origin.q_row) * p.o_row_stride;
    const float* lse = p.lse + origin.batch * p.lse_batch_stride + head * p.lse_head_stride + origin.q_row;
    // dsum = sum_d dO * O, kRowsPerWarp rows a warp at a time by 16-byte loads (the head dim is a multiple of 8
    // elements); a row a warp by 4-byte loads where dO or O rows are not 16-byte aligned.
    const bool vector = aligned16(dout, p.bwd.do_row_stride, kElem) && aligned16(out, p.o_row_stride, kElem) &&
                        (BwdVColumns::kPadded ? BwdVColumns::call(p) % kChunkElems == 0 : true);
    const int rows_per_warp = vector ? kRowsPerWarp : 1;
    const int lane_row = vector ? lane / kRowLanes : 0;
    for (int r0 = warp * rows_per_warp; r0 < Kt::kBlockM; r0 += Kt::kWarps * rows_per_warp) {
        const int r = r0 + lane_row;
        const int row = m0 + r;
        const bool live = row < p.seqlen_q;
        float acc;
        if (vector) {
            const uint4* d4 = reinterpret_cast<const uint4*>(dout + static_cast<index_t>(row) * p.bwd.do_row_stride);
            const uint4* o4 = reinterpret_cast<const uint4*>(out + static_cast<index_t>(row) * p.o_row_stride);
            acc = row_dot<Element, uint4, kRowLanes>(d4, o4, live ? chunks : 0, lane % kRowLanes);
        } else {
            const u32* d2 = reinterpret_cast<const u32*>(dout + static_cast<index_t>(row) * p.bwd.do_row_stride);
            const u32* o2 = reinterpret_cast<const u32*>(out + static_cast<index_t>(row) * p.o_row_stride);
            acc = row_dot<Element, u32, kWarpSize>(d2, o2, live ? pairs : 0, lane);   // a row a warp
        }
        if ((vector ? lane % kRowLanes : lane) == 0 && r < Kt::kBlockM) {
            const float l = live ? lse[row] : FLASHKIT_NEG_INF;
            ws.dsum[ws_row0 + r] = acc;
            ws.lse2[ws_row0 + r] = l == FLASHKIT_NEG_INF ? FLASHKIT_POS_INF : l * kLog2e;
        }
    }
    // dq_accum rows of the block = 0, 16 bytes a thread a pass.
    uint4* acc4 = reinterpret_cast<uint4*>(ws.dq_accum + ws_row0 * kD);
    const uint4 zero = {0u, 0u, 0u, 0u};
    for (int i = tid; i < Kt::kBlockM * kD / 4; i += Kt::kThreads) acc4[i] = zero;
    if (tid == 0) *ws.semaphore(p, batch, head, m_block) = 0;
}

// The pre-pass CTA of (query block, head, batch): with FLASHKIT_VARLEN of packed sequence `batch`, and
// nothing past the sequence's last query block.
template <class Kt>
__device__ __forceinline__ void bwd_prepass(const Params& params, int m_block, int head, int batch) {
    const BwdWorkspace<Kt::kBlockM, Kt::kHeadDim> ws(params);
    for_sequence<FLASHKIT_VARLEN != 0, Kt::kBlockM>(params, batch, m_block,
                                                    [&](const Params& p, const SeqOrigin& origin) {
                                                        bwd_prepass_block<Kt>(p, ws, m_block, head, batch, origin);
                                                    });
}

// dQ rows m0 + r of a block: 8 elements (16 bytes) a store where dQ's rows allow it, else 4-byte pairs.
template <typename Element>
__device__ __forceinline__ void store_dq_chunk(Element* row, int c, uint4 w, bool vector) {
    if (vector) {
        *reinterpret_cast<uint4*>(row + c) = w;
    } else {
        u32* out = reinterpret_cast<u32*>(row + c);
        out[0] = w.x, out[1] = w.y, out[2] = w.z, out[3] = w.w;
    }
}

// dq_accum of the block in Layout, scaled unless it is already; threads take 16-byte chunks in storage order (a warp
// reads 512 contiguous bytes). A row-major chunk is four columns of one row, written as they are. A fragment
// chunk holds two columns of rows r and r + 8: the block goes through shared memory one 64-column panel at a time,
// converted, so that dQ is written a row at a time, 16 bytes a thread (rows of 4-byte pairs would fill half of
// every sector they touch: measured 1.5-2x slower at hd128 and hd256).
template <class Kt, class Layout>
__device__ __forceinline__ void bwd_convert_dq_block(const Params& p,
                                                     const BwdWorkspace<Kt::kBlockM, Kt::kHeadDim>& ws, int m_block,
                                                     int head, int batch, const SeqOrigin& origin) {
    typedef typename Kt::Element Element;
    constexpr int kD = Kt::kHeadDim;
    constexpr int kChunkElems = 16 / static_cast<int>(sizeof(Element));   // dQ elements of a 16-byte store
    const int cols = FLASHKIT_HEAD_DIM_PADDED ? p.head_dim : kD;        // of a dQ row
    const int m0 = m_block * Kt::kBlockM;
    const float4* acc = reinterpret_cast<const float4*>(ws.dq_accum + (ws.row0(p, batch, head) + m0) * kD);
    const float scale = Layout::kScaled ? 1.f : p.softmax_scale;
    Element* dq = static_cast<Element*>(p.bwd.dq) + origin.batch * p.bwd.dq_batch_stride +
                  head * p.bwd.dq_head_stride + static_cast<index_t>(origin.q_row + m0) * p.bwd.dq_row_stride;
    const int rows = min(Kt::kBlockM, p.seqlen_q - m0);
    if constexpr (Layout::kRowChunks) {
        for (int i = threadIdx.x; i < Kt::kBlockM * kD / 4; i += Kt::kThreads) {
            int r, c;
            Layout::template chunk<kD>(i, r, c);
            const float4 x = acc[i];
            if (r < rows && c < cols) {
                Element* row = dq + r * p.bwd.dq_row_stride;
                *reinterpret_cast<u32*>(row + c) = pack_float2<Element>(x.x * scale, x.y * scale);
                *reinterpret_cast<u32*>(row + c + Layout::kPairCols) = pack_float2<Element>(x.z * scale, x.w * scale);
            }
        }
    } else {
        constexpr int kPanelCols = Layout::kPanelCols;
        constexpr int kPanelChunks = Kt::kBlockM * kPanelCols / 4;     // 16-byte chunks of sums a panel
        constexpr int kStride = kPanelCols / 2 + 4;                    // u32 pairs a staged row, 4 words apart in
                                                                       // bank (a warp's pairs hit 32 banks)
        constexpr int kRowStores = kPanelCols / kChunkElems;           // 16-byte stores a panel row
        __shared__ __align__(16) u32 stage[Kt::kBlockM * kStride];
        const bool vector = aligned16(dq, p.bwd.dq_row_stride, static_cast<int>(sizeof(Element)));
        for (int panel = 0; panel * kPanelCols < cols; ++panel) {
            for (int j = threadIdx.x; j < kPanelChunks; j += Kt::kThreads) {
                int r, c;
                Layout::template chunk<kD>(panel * kPanelChunks + j, r, c);
                const float4 x = acc[panel * kPanelChunks + j];
                const int pair = (c - panel * kPanelCols) / 2;
                stage[r * kStride + pair] = pack_float2<Element>(x.x * scale, x.y * scale);
                stage[(r + Layout::kPairRows) * kStride + pair + Layout::kPairCols / 2] =
                    pack_float2<Element>(x.z * scale, x.w * scale);
            }
            __syncthreads();
            for (int j = threadIdx.x; j < Kt::kBlockM * kRowStores; j += Kt::kThreads) {
                const int r = j / kRowStores, part = j % kRowStores;
                const int c = panel * kPanelCols + part * kChunkElems;
                if (r < rows && c < cols)
                    store_dq_chunk(dq + r * p.bwd.dq_row_stride, c,
                                   *reinterpret_cast<const uint4*>(&stage[r * kStride + part * kChunkElems / 2]),
                                   vector);
            }
            __syncthreads();
        }
    }
}

template <class Kt, class Layout>
__device__ __forceinline__ void bwd_convert_dq(const Params& params, int m_block, int head, int batch) {
    const BwdWorkspace<Kt::kBlockM, Kt::kHeadDim> ws(params);
    for_sequence<FLASHKIT_VARLEN != 0, Kt::kBlockM>(
        params, batch, m_block, [&](const Params& p, const SeqOrigin& origin) {
            bwd_convert_dq_block<Kt, Layout>(p, ws, m_block, head, batch, origin);
        });
}

}  // namespace flashkit
