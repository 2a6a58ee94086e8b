// Compile-time geometry of the FlashAttention-2 backward (fa2_bwd.cu) and its workspace layout.
//
// A CTA owns kBlockN keys of one (kv head, batch) and walks the query blocks of every query head
// of the kv head's group. Warp w owns keys [16 w, 16 w + 16) of the block (split-K): its rows of
// S^T = K Q^T, dP^T = V dO^T, dV += P^T dO and dK += dS^T Q never leave its registers. dQ = dS K
// needs every key of the block, so dS^T goes through shared memory and the warps split dQ's
// (kBlockM x kHeadDim) tile as kDqWarpsM x kDqWarpsD.
// Shared memory (dynamic), 16-bit tiles in the swizzled layout of tile.cuh:
//   [ Q: 2 x kBlockM x D | dO: 2 x kBlockM x D | K: kBlockN x D | V: kBlockN x D |
//     dS^T: kBlockN x kBlockM | lse2: 2 x kBlockM (fp32) | dsum: 2 x kBlockM (fp32) ]
// Q, dO, lse2 and dsum are double-buffered: query block i + 1 streams in under block i.
#pragma once

#include "flashkit/bwd_passes.cuh"
#include "flashkit/dq_layout.cuh"
#include "flashkit/traits.cuh"

// fa2_bwd's dq_accum layout (dq_layout.cuh): on sm_90 in fragment order, unscaled, one 16-byte reduction a tile
// a lane into 512 contiguous bytes a warp (red.global.add.v4.f32; measured 10-12% faster than rows on the H200);
// before sm_90 in rows, scaled, where a fragment's scalar atomics touch 8 rows of 32 bytes rather than 16
// sectors. Varlen builds keep rows: at 255 registers with the sequence offsets, the fragment order's build
// spilled 8-16 B (float16 hd128).
#if __CUDA_ARCH__ >= 900 && !FLASHKIT_VARLEN
#define FLASHKIT_BWD_DQ_FRAGMENTS 1
#else
#define FLASHKIT_BWD_DQ_FRAGMENTS 0
#endif

namespace flashkit {

template <int kHeadDim_, int kBlockM_, int kBlockN_, int kWarps_, typename Element_>
struct BwdTraits {
    typedef Element_ Element;
    static constexpr int kHeadDim = kHeadDim_;
    static constexpr int kBlockM = kBlockM_;   // query rows per visited block
    static constexpr int kBlockN = kBlockN_;   // keys per CTA
    static constexpr int kWarps = kWarps_;
    static constexpr int kThreads = kWarps * kWarpSize;
    static constexpr int kElemBytes = sizeof(Element);

    static constexpr int kWarpKeys = kBlockN / kWarps;   // keys (rows of dK, dV) per warp
    // dq_accum (dq_layout.cuh; FLASHKIT_BWD_DQ_FRAGMENTS above)
#if FLASHKIT_BWD_DQ_FRAGMENTS
    typedef DqFragments<kBlockM, false> DqLayout;
#else
    typedef DqRowMajor<true> DqLayout;
#endif
    // A query block is processed in slices of kSubM queries (S^T, P^T, dP^T of one slice in registers
    // at a time): narrower slices at large head dims, where dK and dV take most registers.
#ifdef FLASHKIT_SUB_M
    static constexpr int kSubM = FLASHKIT_SUB_M;
#else
    static constexpr int kSubM = kHeadDim > 64 ? 32 : kBlockM;
#endif
    static constexpr int kMCols = kSubM / kMmaN;         // 8-query column tiles of a slice of S^T
    static constexpr int kMSteps = kSubM / kMmaK;        // k-steps over a slice's queries (dV, dK)
    static constexpr int kDTiles = kHeadDim / kMmaN;     // 8-wide column tiles of dK, dV
    static constexpr int kDSteps = kHeadDim / kMmaK;     // k-steps over the head dim (S^T, dP^T)
    static constexpr int kNSteps = kBlockN / kMmaK;      // k-steps over keys (dQ)

    // dQ = dS K: warps split the (kBlockM x kHeadDim) tile.
    static constexpr int kDqWarpsM = kWarps < kBlockM / kMmaM ? kWarps : kBlockM / kMmaM;
    static constexpr int kDqWarpsD = kWarps / kDqWarpsM;
    static constexpr int kDqMTiles = kBlockM / kMmaM / kDqWarpsM;   // 16-row tiles per warp
    static constexpr int kDqDTiles = kDTiles / kDqWarpsD;           // 8-wide column tiles per warp

    static constexpr int kQElems = kBlockM * kHeadDim;
    static constexpr int kKVElems = kBlockN * kHeadDim;
    static constexpr int kDsElems = kBlockN * kBlockM;
    static constexpr int kSmemBytes =
        (4 * kQElems + 2 * kKVElems + kDsElems) * kElemBytes + 4 * kBlockM * 4;

    static_assert(kElemBytes == 2, "tensor-core path: 16-bit elements only");
    static_assert(kBlockM % kSubM == 0 && kSubM % (2 * kMmaK) == 0, "query slices split the block");
    static_assert(kWarpKeys == kMmaM, "each warp owns one 16-key tile of dK and dV");
    static_assert(kBlockM % 64 == 0, "the dS^T tile's rows span the 8 chunks of the swizzle");
    static_assert(kHeadDim % 64 == 0, "head dim: multiple of 64 (swizzle spans 8 chunks of a row)");
    static_assert(kWarps % kDqWarpsM == 0 && kDTiles % (2 * kDqWarpsD) == 0, "dQ tile splits evenly");
    static_assert(kBlockM * 4 / kChunkBytes <= kWarpSize, "one warp loads lse2 and dsum");
};

#if defined(FLASHKIT_HEAD_DIM) && defined(FLASHKIT_BLOCK_M) && defined(FLASHKIT_BLOCK_N) && \
    defined(FLASHKIT_WARPS) && defined(FLASHKIT_DTYPE)
typedef BwdTraits<FLASHKIT_HEAD_DIM, FLASHKIT_BLOCK_M, FLASHKIT_BLOCK_N, FLASHKIT_WARPS, Element>
    BwdKernelTraits;
#endif

}  // namespace flashkit
