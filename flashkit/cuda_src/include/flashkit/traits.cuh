// Compile-time tile geometry of the tensor-core forward kernels (fa2, causal, fa1).
//
// A CTA owns kBlockM query rows; its kWarps warps split them (split-Q): warp w owns rows
// [w * kWarpRows, (w + 1) * kWarpRows), i.e. kMTiles tiles of 16 rows (the m of mma.m16n8k16),
// and never exchanges data with another warp. K and V stream through shared memory in tiles
// of kBlockN keys. Shared memory (dynamic), each tile in the swizzled layout of tile.cuh:
//   [ Q: kBlockM x kHeadDim | K: kBlockN x kHeadDim | V: kBlockN x kHeadDimV ]
// The Q region is reused to stage O (kBlockM x kHeadDimV) in the epilogue.
//
// kHeadDimV (FLASHKIT_HEAD_DIM_V, default FLASHKIT_HEAD_DIM) is the head dim of V and O, which may be
// below that of Q and K (DeepSeek's MLA: 192 / 128): S = Q K^T runs over kHeadDim, O += P V, the O
// accumulator, the V tiles and the epilogue over kHeadDimV. Like kHeadDim it is a class; with
// kHeadDimVPadded the call's head_dim_v (Params::head_dim_v) is below it (zero-filled V columns, O
// columns beyond it not stored).
//
// kHeadDim is the compiled head-dim CLASS (a multiple of 32: 32, 64, 96, ...). With kHeadDimPadded
// the call's head dim (Params::head_dim, a multiple of 8) is below it: the loads zero-fill the
// columns >= head_dim of Q, K and V and the epilogue stores only the first head_dim columns of O;
// the products over the zero columns add exact zeros, so S and the real columns of O are exact.
#pragma once

#include "flashkit/numeric.cuh"

namespace flashkit {

// Shape of one mma.sync.m16n8k16 instruction.
constexpr int kMmaM = 16;
constexpr int kMmaN = 8;
constexpr int kMmaK = 16;
constexpr int kWarpSize = 32;
constexpr unsigned kFullWarp = 0xffffffffu;   // the lane mask of a whole warp (the *_sync intrinsics)
// Row offset of c2, c3 (and a1, a3) from c0, c1 in an mma fragment: rows g and g + 8.
constexpr int kFragRowHalf = 8;
// Lanes sharing the rows of a fragment (a quad: t = lane % 4), and the 2 columns each owns.
constexpr int kQuadLanes = 4;
constexpr int kFragCols = 2;
// cp.async / ldmatrix move 16-byte chunks.
constexpr int kChunkBytes = 16;

// threadIdx.x from a volatile read of %tid.x: a value ptxas cannot prove equal to an earlier read, so what derives
// from it (a thread's shared-memory addresses, its fragment indices) is formed where it is used rather than hoisted
// out of a loop and held in registers over the loop's register peak (where it spilled: the persistent forward's
// epilogue addresses beside a drop-in functor; the backward's dQ staging and score indices).
__device__ __forceinline__ int fresh_thread_index() {
    unsigned thread;
    asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(thread));
    return static_cast<int>(thread);
}

// x through a volatile move: a value ptxas cannot prove equal to x, so that what is formed from it is formed where
// it is used rather than hoisted out of a loop and held over the loop's register peak (fa2_bwd's tile addresses and
// its walk's flag; the Hopper backward's visit count).
__device__ __forceinline__ int fresh_value(int x) {
    asm volatile("mov.b32 %0, %0;\n" : "+r"(x));
    return x;
}

// x from lane 0 of the warp: a value ptxas knows to be the same in every lane, so that what derives from it (ring
// slots, wgmma descriptors) stays in uniform registers instead of one register a thread (a warpgroup's index, where
// the warpgroups' registers run short: the Hopper kernels' kUniformConsumer).
__device__ __forceinline__ int warp_uniform(int x) { return __shfl_sync(kFullWarp, x, 0); }

// Per-thread register budget (32-bit registers) below which Q is kept in registers for the
// whole main loop instead of being re-read from shared memory with ldmatrix every K/V tile.
constexpr int kQInRegsBudget = 160;

// A drop-in functor built in (functor.cuh includes its file): its score_mod, its mask_mod. Every kernel header that
// specializes on them reads these defaults.
#ifndef FLASHKIT_SCORE_MOD
#define FLASHKIT_SCORE_MOD 0
#endif
#ifndef FLASHKIT_MASK_MOD
#define FLASHKIT_MASK_MOD 0
#endif

#ifndef FLASHKIT_HEAD_DIM_PADDED
#define FLASHKIT_HEAD_DIM_PADDED 0   // the call's head dim is the class itself
#endif
#ifdef FLASHKIT_HEAD_DIM_V   // the runtime defines it only when v's head dim differs from q's and k's
#define FLASHKIT_OWN_HEAD_DIM_V 1
#else
#define FLASHKIT_OWN_HEAD_DIM_V 0
#ifdef FLASHKIT_HEAD_DIM
#define FLASHKIT_HEAD_DIM_V FLASHKIT_HEAD_DIM   // V's head dim is Q's and K's (every family: sm80 and Hopper)
#endif
#endif
#ifndef FLASHKIT_HEAD_DIM_V_PADDED
#define FLASHKIT_HEAD_DIM_V_PADDED FLASHKIT_HEAD_DIM_PADDED   // V as Q and K unless the runtime says otherwise
#endif

template <int kHeadDim_, int kBlockM_, int kBlockN_, int kWarps_, typename Element_, typename OutT_,
          int kHeadDimV_ = kHeadDim_>
struct FwdTraits {
    typedef Element_ Element;
    typedef OutT_ OutT;
    static constexpr int kHeadDim = kHeadDim_;
    // The compile's FLASHKIT_HEAD_DIM_PADDED (as FLASHKIT_Q_IN_REGS below). An enumerator, not a static
    // member: the class's cubins stay byte-identical to those built before head-dim classes existed.
    enum : int { kHeadDimPadded = FLASHKIT_HEAD_DIM_PADDED != 0 };
    static constexpr int kHeadDimV = kHeadDimV_;   // V and O (the P V product, the epilogue)
    enum : int { kHeadDimVPadded = FLASHKIT_HEAD_DIM_V_PADDED != 0 };
    // V's columns are Params::head_dim_v (else Params::head_dim: the same value, and the code of before).
    enum : int { kOwnHeadDimV = FLASHKIT_OWN_HEAD_DIM_V };
    static constexpr int kBlockM = kBlockM_;
    static constexpr int kBlockN = kBlockN_;
    static constexpr int kWarps = kWarps_;
    static constexpr int kThreads = kWarps * kWarpSize;

    static constexpr int kWarpRows = kBlockM / kWarps;   // query rows per warp
    static constexpr int kMTiles = kWarpRows / kMmaM;    // 16-row tiles per warp
    static constexpr int kNTiles = kBlockN / kMmaN;      // 8-key column tiles of S
    static constexpr int kDTiles = kHeadDimV / kMmaN;    // 8-wide column tiles of O
    static constexpr int kQKSteps = kHeadDim / kMmaK;    // k-steps of S = Q K^T
    static constexpr int kPVSteps = kBlockN / kMmaK;     // k-steps of O += P V

    static constexpr int kElemBytes = sizeof(Element);
    static constexpr int kChunkElems = kChunkBytes / kElemBytes;   // elements per 16 B
    static constexpr int kRowChunks = kHeadDim / kChunkElems;      // 16 B chunks per Q / K tile row
    static constexpr int kVRowChunks = kHeadDimV / kChunkElems;    // 16 B chunks per V / O tile row

    static constexpr int kQElems = kBlockM * kHeadDim;
    static constexpr int kKElems = kBlockN * kHeadDim;
    static constexpr int kVElems = kBlockN * kHeadDimV;
    static constexpr int kSmemBytes = (kQElems + kKElems + kVElems) * kElemBytes;

    // Accumulator registers per thread: O (fp32), S (fp32), and Q as packed 16-bit pairs.
    static constexpr int kORegs = kWarpRows * kHeadDimV / kWarpSize;
    static constexpr int kSRegs = kWarpRows * kBlockN / kWarpSize;
    static constexpr int kQRegs = kWarpRows * kHeadDim / (2 * kWarpSize);
#ifdef FLASHKIT_Q_IN_REGS
    static constexpr bool kQInRegs = FLASHKIT_Q_IN_REGS != 0;
#else
    static constexpr bool kQInRegs = kORegs + kSRegs + kQRegs <= kQInRegsBudget;
#endif

    static_assert(kElemBytes == 2, "tensor-core path: 16-bit elements only");
    static_assert(kBlockM % (kWarps * kMmaM) == 0, "each warp owns whole 16-row tiles");
    static_assert(kBlockN % (2 * kMmaK) == 0, "ldmatrix.x4 loads two 8-key tiles of K at once");
    static_assert(kHeadDim % (2 * kMmaK) == 0,
                  "head-dim class: a multiple of 32 (swizzled rows of 8-chunk groups and a 4-chunk tail)");
    static_assert(kHeadDimV % (2 * kMmaK) == 0 && kHeadDimV <= kHeadDim,
                  "head_dim_v class: a multiple of 32, at most the head-dim class (O is staged in the Q tile)");
    static_assert((kBlockN * kRowChunks) % kThreads == 0, "K tile loads split evenly");
    static_assert((kBlockN * kVRowChunks) % kThreads == 0 || kThreads % kBlockN == 0,
                  "V tile loads split evenly (or a band's pass covers the tile: load_rows_async)");
    static_assert((kBlockM * kRowChunks) % kThreads == 0, "Q tile loads split evenly");
};

#if defined(FLASHKIT_HEAD_DIM) && defined(FLASHKIT_BLOCK_M) && defined(FLASHKIT_BLOCK_N) && \
    defined(FLASHKIT_WARPS) && defined(FLASHKIT_DTYPE) && defined(FLASHKIT_OUT_DTYPE)
// The traits of this compile, from the -D defines of the kernel contract.
typedef FwdTraits<FLASHKIT_HEAD_DIM, FLASHKIT_BLOCK_M, FLASHKIT_BLOCK_N, FLASHKIT_WARPS, Element,
                  OutT, FLASHKIT_HEAD_DIM_V>
    KernelTraits;
#endif

}  // namespace flashkit
