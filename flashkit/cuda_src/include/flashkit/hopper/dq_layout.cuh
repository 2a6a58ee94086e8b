// fa3_bwd's dq_accum layout: a query block's dQ sums in the order of one warpgroup's wgmma accumulators, so that
// a consumer's partial dQ reaches it as whole contiguous runs (one bulk reduction a visit, or coalesced 16-byte
// reductions), and bwd_convert_dq (bwd_passes.cuh) reads it back by element.
//
// A query block (kBlockM = 64 rows x kHeadDim columns, the same floats as a row-major block) is kHeadDim / 64
// panels of 64 columns, 4096 floats each, ordered [column tile i (8)][thread (128)][e (4)]: thread
// tid = 32 w + 4 g + t of the warpgroup holds, in tile i, rows 16 w + g + 8 h and columns 8 i + 2 t + c as
// e = 2 h + c (the m64nNk16 accumulator fragment: fragment.cuh's conventions, warp w owning rows 16 w ..).
// So dq[i][0..3] of one thread are 16 contiguous bytes and a warp's 32 threads 512.
// The sums are unscaled: bwd_convert_dq multiplies by softmax_scale (kScaled = false).
#pragma once

#include "flashkit/hopper/wgmma.cuh"
#include "flashkit/traits.cuh"

namespace flashkit {
namespace hopper {

struct DqFragmentLayout {
    static constexpr bool kScaled = false;
    static constexpr int kRows = gmma::kWarpgroupRows;                 // of a query block (64)
    static constexpr int kPanelCols = 64;                              // columns of a panel
    static constexpr int kFragFloats = 4;                              // e: one thread's floats of a tile
    static constexpr int kTileFloats = gmma::kWarpgroupThreads * kFragFloats;   // a column tile: 512
    static constexpr int kPanelFloats = kRows * kPanelCols;            // 4096
    static constexpr int kPanelBytes = kPanelFloats * static_cast<int>(sizeof(float));

    // Float offset of thread tid's fragment of column tile i (i counts 8-column tiles from the block's column 0).
    __device__ __forceinline__ static int fragment(int i, int tid) {
        constexpr int kTilesPerPanel = kPanelCols / kMmaN;
        return i / kTilesPerPanel * kPanelFloats + (i % kTilesPerPanel * gmma::kWarpgroupThreads + tid) * kFragFloats;
    }
    // Float offset of (row r, column c) within a query block (c and c + 1 adjacent for even c).
    template <int kHeadDim>
    __device__ __forceinline__ static int offset(int r, int c) {
        const int w = r / kMmaM, g = r % kFragRowHalf, h = r % kMmaM / kFragRowHalf;
        const int t = c % kMmaN / kFragCols;
        const int tid = w * kWarpSize + g * kQuadLanes + t;
        return fragment(c / kMmaN, tid) + h * kFragCols + c % kFragCols;
    }
};

}  // namespace hopper
}  // namespace flashkit
