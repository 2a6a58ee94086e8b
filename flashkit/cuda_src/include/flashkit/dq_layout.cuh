// The layouts of the backward's dq_accum workspace (bwd_passes.cuh): how a query block of kRows x kHeadDim fp32
// dQ sums lies in its kRows * kHeadDim floats. `offset` places an element; bwd_convert_dq reads a block in 16-byte
// chunks of storage order, whose four floats are two element pairs: (r, c), (r, c + 1) from `chunk`, and
// (r + kPairRows, c + kPairCols), (r + kPairRows, c + kPairCols + 1).
//   DqRowMajor          rows of kHeadDim floats (fa2_bwd off Hopper, whose scalar atomics add a fragment's
//                       row pairs)
//   DqFragments<kRows>  the order of the m16n8 accumulator fragments that produce it, so that a warp's partial
//                       sums reach it as whole contiguous runs: 64-column panels, each ordered
//                       [column tile ct (8)][row tile rt (kRows / 16)][lane (32)][e (4)], where lane g * 4 + t
//                       holds rows 16 rt + g + 8 h and columns 8 ct + 2 t + c as e = 2 h + c (fragment.cuh's
//                       conventions). One lane's four floats of a tile are 16 contiguous bytes (one
//                       red.global.add.v4.f32), a warp's 512. A wgmma warpgroup's accumulators over 64 rows are
//                       warp w = row tile w, so its thread tid's four floats of column tile i lie at
//                       i * 512 + tid * 4 within a panel, and a 64 x 64 panel is one run (one bulk reduction).
// kScaled: the sums already carry softmax_scale (else bwd_convert_dq multiplies).
#pragma once

#include "flashkit/traits.cuh"

namespace flashkit {

template <bool kScaled_>
struct DqRowMajor {
    static constexpr bool kScaled = kScaled_;
    static constexpr bool kRowChunks = true;             // a chunk: four columns of one row
    static constexpr int kPairRows = 0, kPairCols = 2;
    template <int kHeadDim>
    __device__ __forceinline__ static void chunk(int i, int& r, int& c) {
        r = i / (kHeadDim / 4);
        c = i % (kHeadDim / 4) * 4;
    }
    template <int kHeadDim>
    __device__ __forceinline__ static int offset(int r, int c) {
        return r * kHeadDim + c;
    }
};

template <int kRows, bool kScaled_>
struct DqFragments {
    static constexpr bool kScaled = kScaled_;
    static constexpr int kPanelCols = 64;                        // columns of a panel
    static constexpr int kTilesPerPanel = kPanelCols / kMmaN;    // 8 column tiles
    static constexpr int kRowTiles = kRows / kMmaM;
    static constexpr int kFragFloats = 4;                        // e: one lane's floats of a tile
    static constexpr int kTileFloats = kWarpSize * kFragFloats;  // 128
    static constexpr int kPanelFloats = kRows * kPanelCols;
    static constexpr int kPanelBytes = kPanelFloats * static_cast<int>(sizeof(float));
    static_assert(kRows % kMmaM == 0, "whole 16-row tiles");

    // Float offset of `lane`'s four floats of the tile at (row tile rt, column tile ct) in the block.
    __device__ __forceinline__ static int fragment(int ct, int rt, int lane) {
        return ct / kTilesPerPanel * kPanelFloats + ((ct % kTilesPerPanel) * kRowTiles + rt) * kTileFloats +
               lane * kFragFloats;
    }
    // fragment(ct + i, rt + j, lane) - fragment(ct, rt, lane) while ct + i stays in ct's panel: a compile-time offset
    // for compile-time i, j (the fragment addresses of a warp's run of tiles from one base).
    __device__ __forceinline__ static constexpr int run_offset(int i, int j) {
        return (i * kRowTiles + j) * kTileFloats;
    }
    static constexpr bool kRowChunks = false;   // a chunk: rows g and g + 8 of two columns
    static constexpr int kPairRows = kFragRowHalf, kPairCols = 0;
    // Row and column of the first pair of the block's 16-byte chunk i (storage order: the inverse of `fragment`).
    template <int kHeadDim>
    __device__ __forceinline__ static void chunk(int i, int& r, int& c) {
        constexpr int kPanelChunks = kPanelFloats / kFragFloats;
        const int in_panel = i % kPanelChunks;
        const int tile = in_panel / kWarpSize, lane = in_panel % kWarpSize;
        r = tile % kRowTiles * kMmaM + lane / kQuadLanes;
        c = (i / kPanelChunks * kTilesPerPanel + tile / kRowTiles) * kMmaN + lane % kQuadLanes * kFragCols;
    }
    // Float offset of (row r, column c) in the block (c and c + 1 adjacent for even c); kHeadDim a multiple of 64.
    template <int kHeadDim>
    __device__ __forceinline__ static int offset(int r, int c) {
        static_assert(kHeadDim % kPanelCols == 0, "whole 64-column panels");
        const int lane = r % kFragRowHalf * kQuadLanes + c % kMmaN / kFragCols;
        return fragment(c / kMmaN, r / kMmaM, lane) + r % kMmaM / kFragRowHalf * kFragCols + c % kFragCols;
    }
};

// A main kernel's dq_accum layout: fragment order (unscaled sums) or rows (scaled).
template <bool kFragments, int kRows>
struct DqLayoutOf {
    typedef DqRowMajor<true> type;
};
template <int kRows>
struct DqLayoutOf<true, kRows> {
    typedef DqFragments<kRows, false> type;
};

}  // namespace flashkit
