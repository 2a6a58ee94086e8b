// Per-lane ldmatrix addressing of swizzled 16-bit tiles (tile.cuh's layout) for the mma.sync backward's
// products, which read the same tiles both ways (sm80/bwd_mainloop.cuh).
#pragma once

#include "flashkit/tile.cuh"

namespace flashkit {

// Per-lane ldmatrix.x4 addressing of the 16 x 16 blocks of a swizzled 16-bit tile with kCols columns.
// Two ways a block is read (rows of the lane's 8x8 matrix: row % 8 == lane % 8 in both):
//   LdsmRows16:  A fragments of a [m][k] tile, or .trans B fragments of a [k][n] tile (two 8-wide n tiles):
//                row lane % 16, 8-column half lane / 16
//   LdsmRows8x2: B fragments of a [n][k] tile (two 8-wide n tiles), or .trans A fragments of a [k][m] tile:
//                row (lane / 16) 8 + lane % 8, 8-column half (lane / 8) % 2
// The swizzle's XOR depends on the lane only (LdsmColumns), so a block at (16-multiple row r0, 16-wide
// column step s) costs one add to a per-lane base and compile-time offsets.
template <int kCols>
struct LdsmLane {
    int row_bytes;       // this lane's row offset, bytes
    LdsmColumns cols;
    __device__ __forceinline__ LdsmLane(int row, int hi, int lane) : row_bytes(row * kCols * 2), cols(lane, hi) {}
    __device__ __forceinline__ u32 addr(u32 base, int r0, int s) const {
        return base + row_bytes + r0 * kCols * 2 + cols.col(s) * 2;
    }
};
template <int kCols>
__device__ __forceinline__ LdsmLane<kCols> ldsm_rows16(int lane) {
    return LdsmLane<kCols>(lane % 16, lane / 16, lane);
}
template <int kCols>
__device__ __forceinline__ LdsmLane<kCols> ldsm_rows8x2(int lane) {
    return LdsmLane<kCols>((lane / 16) * 8 + lane % 8, (lane / 8) % 2, lane);
}

}  // namespace flashkit
