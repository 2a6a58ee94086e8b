// Compile-time geometry of the FlashAttention-2 backward (fa2_bwd.cu) and its workspace layout.
//
// A CTA owns kBlockN keys of one (kv head, batch) and walks the query blocks of every query head of the kv
// head's group. Its warps form a kKeyWarps x kPartWarps grid:
//   S^T = K Q^T, dP^T = V dO^T  (kBlockN x kBlockM): warp (kw, pw) computes keys [kWarpKeys kw, + kWarpKeys) x
//                               queries [kWarpQueries pw, + kWarpQueries), kQueryChunks times (the chunks one
//                               after the other, kWarpQueries apart: hd64's two of 64)
//   dV += P^T dO, dK += dS^T Q  (kBlockN x kHeadDim): warp (kw, pw) owns the same keys x head-dim columns
//                               [kWarpCols pw, + kWarpCols), fp32 registers over the whole walk
//   dQ = dS K                   (kBlockM x kHeadDim): kDqWarpsM x kDqWarpsD warp tiles of 32 x (kHeadDim / kDqWarpsD)
// hd128 takes FlashAttention-2's grid, 32 x 32 warp tiles (4 x 2 warps): every ldmatrix.x4 feeds two mma.sync or
// more, 144 of them a warp a visit against 200 with 16-key warp strips (1.05-1.08x on the H200), P^T and dS^T
// through shared memory. hd64 keeps 16-key strips over all queries and columns (8 x 1 warps): a warp's own P^T
// and dS^T are its dV and dK products' A operands in registers (the 32-key grid ran 0.88x there). Its blocks are
// FlashAttention-2's 128 queries (fa2_bwd.cu's manifest; 64 on 99 KB GPUs), walked by each warp in two 64-query
// chunks: the registers of one chunk, the loads, barriers and dQ of a 128-query visit (1.05-1.06x on the H200).
// hd256 takes FlashAttention-2's 64-key blocks with the same 32-key warp grid (2 x 4 warps: 32 x 16 of S^T, 32 x 64
// of dK and dV), and so does hd192 (32 x 48 of dK and dV); on 32-key blocks (sm_86's hd192) the warps take 16-key
// strips, 2 x 4.
// Shared memory (dynamic), 16-bit tiles in the swizzled layout of tile.cuh:
//   [ Q: S x kBlockM x D | dO: S x kBlockM x Dv | K: kBlockN x D | V: kBlockN x Dv |   (Dv = kHeadDimVTiles, v's)
//     dS^T: kBlockN x kBlockM | P^T: kBlockN x kBlockM (not with register operands) | lse2: S x kBlockM (fp32) |
//     dsum: S x kBlockM (fp32) ],  S = kQStages
// With two stages Q, dO, lse2 and dsum are double-buffered: query block i + 1 streams in under block i. One stage
// (where two do not fit an SM's shared memory: sm_80 at hd256, sm_86 / sm_89's 99 KB at hd128) loads block i + 1
// once every warp is done with Q_i and dO_i, under dQ_i = dS_i K only (sm80/bwd_walk.cuh).
#pragma once

#include "flashkit/bwd_passes.cuh"
#include "flashkit/dq_layout.cuh"
#include "flashkit/tile.cuh"
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

template <int kHeadDim_, int kBlockM_, int kBlockN_, int kWarps_, typename Element_, int kQStages_ = 2,
          int kHeadDimV_ = kHeadDim_, bool kVInRegs_ = false>
struct BwdTraits {
    typedef Element_ Element;
    static constexpr int kHeadDim = kHeadDim_;
    static constexpr int kHeadDimV = kHeadDimV_;   // V, dO, dV: v's class (below kHeadDim where v is narrower)
    // The main loop's V, dO and dV tiles: v's class where it is 64 or 128, else q's (v of 192 under 256: dV's warp
    // tiles of 48 columns made ptxas spill the walk's scalars, 60 B), zero-filled past head_dim_v as a padded V is.
    static constexpr int kHeadDimVTiles = (kHeadDimV & (kHeadDimV - 1)) == 0 ? kHeadDimV : kHeadDim;
    static constexpr bool kVRaised = kHeadDimVTiles != kHeadDimV;
    static constexpr int kBlockM = kBlockM_;   // query rows per visited block
    static constexpr int kBlockN = kBlockN_;   // keys per CTA
    static constexpr int kWarps = kWarps_;
    static constexpr int kThreads = kWarps * kWarpSize;
    static constexpr int kElemBytes = sizeof(Element);
    static constexpr int kQStages = kQStages_;   // buffers of Q, dO, lse2 and dsum (see above)
    // V's A fragments held in registers over the walk (FlashAttention-2's "V in regs" for 99 KB GPUs at hd256): V
    // lands in Q's buffer once, each warp loads its keys' fragments, and the walk's Q and dO take the buffer over.
    static constexpr bool kVInRegs = kVInRegs_;

    // The warp grid of S^T, dP^T, dK and dV: kKeyWarps along the keys, kPartWarps along the queries (S^T, dP^T)
    // and the head dim (dK, dV).
    // keys (rows of S^T, dK, dV) per warp: 16-key strips at hd64, and on 32-key blocks (sm_86's hd192: 2 x 4 warps)
    static constexpr int kWarpKeys = kHeadDim > 64 && kBlockN > 32 ? 32 : 16;
    static constexpr int kKeyWarps = kBlockN / kWarpKeys;
    static constexpr int kPartWarps = kWarps / kKeyWarps;
    static constexpr bool kRegisterOperands = kPartWarps == 1;   // P^T, dS^T as register A fragments (dV, dK)
    // A warp's queries of a block, in chunks of at most 64 taken one after the other (hd64's 128-query blocks: two
    // chunks, so that the registers of S^T, dP^T and P^T stay a 64-query chunk's while the visit's fixed work, its
    // loads, barriers and dQ, spreads over 128 queries, as FlashAttention-2's 128 x 128 hd64 tiles).
    static constexpr int kQueryChunks = kRegisterOperands && kBlockM > 64 ? kBlockM / 64 : 1;
    static constexpr int kWarpQueries = kBlockM / kPartWarps / kQueryChunks;   // columns of S^T per warp and chunk
    static constexpr int kWarpCols = kHeadDim / kPartWarps;     // columns of dK per warp
    static constexpr int kWarpColsV = kHeadDimVTiles / kPartWarps;   // of dV
    static constexpr int kKeyTiles = kWarpKeys / kMmaM;         // 16-key row tiles of a warp
    static constexpr int kQueryTiles = kWarpQueries / kMmaN;    // 8-query column tiles of a warp's S^T
    static constexpr int kColTiles = kWarpCols / kMmaN;         // 8-wide column tiles of a warp's dK
    static constexpr int kColTilesV = kWarpColsV / kMmaN;       // of its dV
    static constexpr int kDvSteps = kHeadDimVTiles / kMmaK;     // k-steps over v's head dim (dP^T)
    static constexpr int kMSteps = kBlockM / kMmaK;             // k-steps over a block's queries (dV, dK)
    static constexpr int kChunkSteps = kWarpQueries / kMmaK;    // over a warp's chunk (dS^T by 16 queries; dV, dK
                                                                // from register operands)
    static constexpr int kNSteps = kBlockN / kMmaK;             // k-steps over the keys (dQ)

    // dQ = dS K: warp tiles of 32 queries (two 16-row tiles) by kHeadDim / kDqWarpsD columns.
    static constexpr int kDqWarpsM = kBlockM / 32;
    static constexpr int kDqWarpsD = kWarps / kDqWarpsM;
    static constexpr int kDqMTiles = kBlockM / kMmaM / kDqWarpsM;   // 16-row tiles per warp
    static constexpr int kDqDTiles = kHeadDim / kMmaN / kDqWarpsD;  // 8-wide column tiles per warp
    // dQ formed and reduced in parts of two column tiles (16 columns) of the warp's (sm80/bwd_dq.cuh), so that a
    // part's reductions drain under the next part's products: hd64 1.02-1.03x, hd256 1.03-1.04x on the H200; not at
    // hd128 and hd192, where reading dS's fragments once a part cost more than it gained (0.95-0.97x).
    static constexpr int kDqParts = kHeadDim == 64 || kHeadDim == 256 ? kDqDTiles / 2 : 1;
    // dq_accum (dq_layout.cuh; FLASHKIT_BWD_DQ_FRAGMENTS above) in fragment order where a warp's dQ columns stay in
    // one 64-column panel (sm80/bwd_dq.cuh), else in rows (hd192's warp tiles of 48 columns).
    static constexpr bool kDqFragments =
        FLASHKIT_BWD_DQ_FRAGMENTS && DqFragments<kBlockM, false>::kTilesPerPanel % kDqDTiles == 0;
    typedef typename DqLayoutOf<kDqFragments, kBlockM>::type DqLayout;

    static constexpr int kQElems = kBlockM * kHeadDim;
    static constexpr int kDoElems = kBlockM * kHeadDimVTiles;
    static constexpr int kKVElems = kBlockN * kHeadDim;   // K's
    static constexpr int kVElems = kBlockN * kHeadDimVTiles;
    static constexpr int kDsElems = kBlockN * kBlockM;
    static constexpr int kTransposedTiles = kRegisterOperands ? 1 : 2;   // dS^T (dQ's operand), P^T
    static constexpr int kQTileBytes = kQElems * kElemBytes;     // one stage of Q
    static constexpr int kDoTileBytes = kDoElems * kElemBytes;   // of dO
    // dS^T's tile (then P^T's) after Q, dO, K and V: it starts a swizzle row, so that a [key][query] pair's XOR
    // address may fold the tile in (sm80/bwd_mainloop.cuh's transposed_pair).
    static constexpr int kDsOffset =
        kQStages * (kQTileBytes + kDoTileBytes) + (kKVElems + (kVInRegs ? 0 : kVElems)) * kElemBytes;
    static constexpr int kTileBytes = kDsOffset + kTransposedTiles * kDsElems * kElemBytes;
    static constexpr int kSmemBytes = kTileBytes + 2 * kQStages * kBlockM * static_cast<int>(sizeof(float));

    static_assert(kElemBytes == 2, "tensor-core path: 16-bit elements only");
    static_assert(kDsOffset % (kSwizzleRows * kChunkBytes) == 0, "dS^T's tile starts a swizzle row");
    static_assert(kKeyWarps * kPartWarps == kWarps && kBlockN % kWarpKeys == 0, "the warp grid covers the keys");
    static_assert(kWarpQueries % (2 * kMmaN) == 0 && kWarpCols % (2 * kMmaN) == 0 && kWarpColsV % (2 * kMmaN) == 0,
                  "whole 16-wide ldmatrix steps");
    static_assert(kBlockM % 64 == 0, "the dS^T tile's rows span the 8 chunks of the swizzle");
    static_assert(kHeadDim % 64 == 0 && kHeadDimV % 64 == 0, "head dims: multiples of 64 (swizzle spans 8 chunks)");
    static_assert(kHeadDimV <= kHeadDim, "v's head dim at most q's");
    static_assert(!kVInRegs || kQStages * kQTileBytes >= kVElems * kElemBytes, "V lands in Q's buffer");
    static_assert(kWarps % kDqWarpsM == 0 && kDqDTiles % 2 == 0 && kDqDTiles * kDqWarpsD * kMmaN == kHeadDim,
                  "dQ tile splits evenly");
    static_assert(kBlockM * 4 / kChunkBytes <= kWarpSize, "one warp loads lse2 and dsum");
    static_assert(kQStages == 1 || kQStages == 2, "Q and dO single- or double-buffered");
};

#if defined(FLASHKIT_HEAD_DIM) && defined(FLASHKIT_BLOCK_M) && defined(FLASHKIT_BLOCK_N) && \
    defined(FLASHKIT_WARPS) && defined(FLASHKIT_DTYPE)
#ifndef FLASHKIT_Q_STAGES
#define FLASHKIT_Q_STAGES 2   // the manifest's launch key q_stages
#endif
#ifndef FLASHKIT_V_IN_REGS
#define FLASHKIT_V_IN_REGS 0   // the manifest's launch key v_in_regs
#endif
typedef BwdTraits<FLASHKIT_HEAD_DIM, FLASHKIT_BLOCK_M, FLASHKIT_BLOCK_N, FLASHKIT_WARPS, Element, FLASHKIT_Q_STAGES,
                  FLASHKIT_HEAD_DIM_V, FLASHKIT_V_IN_REGS != 0>
    BwdKernelTraits;
#endif

}  // namespace flashkit
