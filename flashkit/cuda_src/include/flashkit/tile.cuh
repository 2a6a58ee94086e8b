// Global <-> shared memory movement for the tensor-core kernels.
//
// Shared layout of a (rows x kCols) 16-bit tile: row-major, rows of kCols elements, with the
// 16-byte chunk index XOR-swizzled by the row:  chunk' = chunk ^ (row % 8).
// An ldmatrix phase reads one 16 B chunk from each of 8 consecutive rows at the same logical
// chunk; after the swizzle those land on 8 distinct 16 B bank groups (a row is a multiple of
// 128 B), so ldmatrix and the 16 B cp.async stores are bank-conflict free without padding.
#pragma once

#include "flashkit/traits.cuh"

namespace flashkit {

// Rows of the swizzle pattern: chunk' = chunk ^ (row & kSwizzleMask).
constexpr int kSwizzleRows = 8;
constexpr int kSwizzleMask = kSwizzleRows - 1;

// Element offset of (row, col) in a swizzled tile with kCols columns; col % 8 is kept.
template <int kCols, int kChunkElems = 8>
__device__ __forceinline__ int swizzle_offset(int row, int col) {
    const int chunk = (col / kChunkElems) ^ (row & kSwizzleMask);
    return row * kCols + chunk * kChunkElems + col % kChunkElems;
}

__device__ __forceinline__ u32 smem_u32(const void* ptr) {
    return static_cast<u32>(__cvta_generic_to_shared(ptr));
}

// ---- cp.async (sm80+) ------------------------------------------------------------------
// 16 B global -> shared copy that bypasses L1; when !pred the 16 B are zero-filled and
// nothing is read (src-size 0), so tails of K/V/Q tiles are exact zeros.
__device__ __forceinline__ void cp_async_16(u32 dst, const void* src, bool pred) {
    const int src_bytes = pred ? kChunkBytes : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Wait until at most kPending committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// Asynchronously copy kRows rows of kRowBytes bytes (row r at gmem + r * row_stride bytes) into
// shared memory, 16 B chunk c of row r at smem_base + Layout::chunk_offset(r, c) (the layout's
// swizzle); rows >= rows_valid are zero-filled. All kThreads threads call it; thread tid always
// owns chunk column tid % (kRowBytes / 16). Every tile loader of flashkit is this with a layout.
template <int kRows, int kRowBytes, int kThreads, class Layout>
__device__ __forceinline__ void load_rows_async(u32 smem_base, const u8* gmem, index_t row_stride,
                                                int rows_valid, int tid) {
    constexpr int kRowChunks = kRowBytes / kChunkBytes;
    constexpr int kRowsPerPass = kThreads / kRowChunks;
    static_assert(kThreads % kRowChunks == 0 && kRows % kRowsPerPass == 0, "tile loads split evenly");
    const int chunk = tid % kRowChunks;
    const int row0 = tid / kRowChunks;
    // One running pointer (not one per pass) keeps the loop-invariant state to 2 registers.
    const u8* src = gmem + row0 * row_stride + chunk * kChunkBytes;
    const index_t pass_stride = kRowsPerPass * row_stride;
#pragma unroll
    for (int pass = 0; pass < kRows / kRowsPerPass; ++pass) {
        const int row = row0 + pass * kRowsPerPass;
        const bool valid = row < rows_valid;
        // Out-of-range rows read nothing (zero-fill); keep the address in range anyway.
        cp_async_16(smem_base + Layout::chunk_offset(row, chunk), valid ? src : gmem, valid);
        src += pass_stride;
    }
}

// The swizzled (kRows x kCols) tile of elements T that ldmatrix reads (swizzle_offset).
template <int kCols, typename T>
struct SwizzledTile {
    static constexpr int kChunkElems = kChunkBytes / sizeof(T);
    __device__ __forceinline__ static int chunk_offset(int row, int chunk) {
        return swizzle_offset<kCols, kChunkElems>(row, chunk * kChunkElems) * static_cast<int>(sizeof(T));
    }
};

// load_rows_async of a SwizzledTile, with the pointer and row stride in elements.
template <int kRows, int kCols, int kThreads, typename T>
__device__ __forceinline__ void load_tile_async(u32 smem_base, const T* gmem, index_t row_stride,
                                                int rows_valid, int tid) {
    load_rows_async<kRows, kCols * static_cast<int>(sizeof(T)), kThreads, SwizzledTile<kCols, T>>(
        smem_base, reinterpret_cast<const u8*>(gmem), row_stride * static_cast<index_t>(sizeof(T)), rows_valid, tid);
}

// Per-thread column offsets (elements) for ldmatrix over a swizzled tile whose row index
// satisfies row % 8 == lane % 8, for logical chunk 2 * j + hi (j = 0..3, hi = which 8-column
// half of a 16-wide k-step this lane addresses). Chunk 8 * q + c sits at 8 * q + (c ^ row%8),
// so the column of k-step s is (s / 4) * 64 + offsets[s % 4]: compile-time except the table.
struct LdsmColumns {
    int x;   // (hi ^ row % 8) restricted to bit 0, plus (row % 8) bits 1-2 as the chunk XOR
    __device__ __forceinline__ LdsmColumns(int lane, int hi) { x = hi ^ (lane & kSwizzleMask); }
    // Column (elements) of the 16-wide step s, as the swizzle places it.
    __device__ __forceinline__ int col(int s) const { return (s / 4) * 64 + ((2 * (s % 4)) ^ x) * 8; }
};

// Copy a warp's (kRows x kCols) slice of a swizzled shared tile to global memory with 16 B
// stores; rows >= rows_valid are not written. Called by one whole warp.
template <int kRows, int kCols, typename T>
__device__ __forceinline__ void store_tile_warp(const T* smem, T* gmem, index_t row_stride,
                                                int rows_valid, int lane) {
    constexpr int kChunkElems = kChunkBytes / sizeof(T);
    constexpr int kRowChunks = kCols / kChunkElems;
    constexpr int kPasses = kRows * kRowChunks / kWarpSize;
    static_assert((kRows * kRowChunks) % kWarpSize == 0, "warp store splits evenly");
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
        const int idx = pass * kWarpSize + lane;
        const int row = idx / kRowChunks;
        const int col = (idx % kRowChunks) * kChunkElems;
        if (row < rows_valid) {
            const uint4 v =
                *reinterpret_cast<const uint4*>(smem + swizzle_offset<kCols, kChunkElems>(row, col));
            *reinterpret_cast<uint4*>(gmem + row * row_stride + col) = v;
        }
    }
}

}  // namespace flashkit
