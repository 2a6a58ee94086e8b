// Global <-> shared memory movement for the tensor-core kernels.
//
// Shared layout of a (rows x kCols) 16-bit tile: row-major, rows of kCols elements (R = kCols / 8
// chunks of 16 bytes, no padding), the chunk index XOR-swizzled by the row:
//   whole groups of 8 chunks:              chunk' = chunk ^ (row % 8)
//   a last group of 4 (R % 8 == 4; head-dim classes 32, 96, 160):  chunk' = chunk ^ ((row / 2) % 4)
// An ldmatrix phase (and the epilogue's 4-byte stores) touches one 16 B chunk of each of 8
// consecutive rows (row % 8 = 0..7) at the same logical chunk. Its 16 B bank group is
// (row * R + chunk') % 8. R % 8 == 0: row * R vanishes and chunk ^ row % 8 takes 8 distinct
// values. R % 8 == 4: row * R % 8 = 4 (row % 2), which XORs bit 2, so a whole group gives
// chunk ^ row ^ 4 (row % 2), a bijection of row % 8, and the tail 4 (row % 2) + (chunk ^ (row / 2) % 4),
// distinct too. Both layouts are bank-conflict free for ldmatrix, with no padding.
#pragma once

#include "flashkit/traits.cuh"

namespace flashkit {

// Rows of the swizzle pattern: chunk' = chunk ^ (row & kSwizzleMask).
constexpr int kSwizzleRows = 8;
constexpr int kSwizzleMask = kSwizzleRows - 1;

// A row of R % 8 == 4 chunks ends in a tail group of 4, swizzled by (row / 2) % 4. (An enumerator: a
// namespace-scope constexpr variable would add a symbol to every cubin.)
enum : int { kTailChunks = 4 };

// Physical chunk of logical chunk `chunk` of `row` in a tile of kRowChunks 16 B chunks a row.
template <int kRowChunks>
__device__ __forceinline__ int swizzle_chunk(int row, int chunk) {
    static_assert(kRowChunks % kSwizzleRows == 0 || kRowChunks % kSwizzleRows == kTailChunks,
                  "swizzled rows: whole groups of 8 chunks and at most one tail of 4");
    constexpr int kWholeChunks = kRowChunks / kSwizzleRows * kSwizzleRows;
    if constexpr (kWholeChunks == kRowChunks) {
        return chunk ^ (row & kSwizzleMask);
    } else {
        return chunk < kWholeChunks ? chunk ^ (row & kSwizzleMask)
                                    : chunk ^ ((row >> 1) & (kTailChunks - 1));
    }
}

// Element offset of (row, col) in a swizzled tile with kCols columns; col % 8 is kept.
template <int kCols, int kChunkElems = 8>
__device__ __forceinline__ int swizzle_offset(int row, int col) {
    const int chunk = swizzle_chunk<kCols / kChunkElems>(row, col / kChunkElems);
    return row * kCols + chunk * kChunkElems + col % kChunkElems;
}

__device__ __forceinline__ u32 smem_u32(const void* ptr) {
    return static_cast<u32>(__cvta_generic_to_shared(ptr));
}

// shared[addr .. addr + 4) = v (a staged tile: sm80/bwd_epilogue.cuh, the Hopper kernels' stagings).
__device__ __forceinline__ void st_shared_b32(u32 addr, u32 v) {
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
// 16 bytes from shared memory that the thread itself stored, or that a barrier orders after their stores.
__device__ __forceinline__ void ld_shared_v4(u32 addr, u32 (&v)[4]) {
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3])
                 : "r"(addr)
                 : "memory");
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

// Chunk columns of the band that load_rows_async hands the threads at chunk kChunk0 of a row:
// the widest power of two that fits the kLeft chunks left and divides kThreads, so that a thread
// keeps one chunk column of the band (a row of R = 12 chunks loads as bands of 8 and 4).
template <int kLeft, int kThreads>
__host__ __device__ constexpr int load_band_chunks() {
    int band = 1;
    while (2 * band <= kLeft && kThreads % (2 * band) == 0) band *= 2;
    return band;
}

// Asynchronously copy kRows rows of kRowBytes bytes (row r at gmem + r * row_stride) into shared
// memory, 16 B chunk c of row r at smem_base + Layout::chunk_offset(r, c) (the layout's swizzle);
// rows >= rows_valid are zero-filled, and with kClipChunks so are chunks >= chunks_valid (the
// columns of a head dim below its compiled class). All kThreads threads call it. The row is
// loaded as bands of chunk columns (load_band_chunks); in each, thread tid always owns column
// tid % band (a row that kThreads divides is one band). A narrow band whose pass would cover more
// rows than the tile has (32 rows of 160 columns: a band of 4 chunks, 64 rows a pass) is one pass of
// the threads whose row falls in the tile. Every tile loader of flashkit is this with a layout.
template <int kRows, int kRowBytes, int kThreads, class Layout, bool kClipChunks = false, int kChunk0 = 0>
__device__ __forceinline__ void load_rows_async(u32 smem_base, const u8* gmem, index_t row_stride,
                                                int rows_valid, int tid, int chunks_valid = 0) {
    constexpr int kRowChunks = kRowBytes / kChunkBytes;
    constexpr int kBandChunks = load_band_chunks<kRowChunks - kChunk0, kThreads>();
    constexpr int kRowsPerPass = kThreads / kBandChunks;
    constexpr bool kPartialPass = kRowsPerPass > kRows;   // one pass, of the threads whose row is in the tile
    static_assert(kRowChunks > kChunk0 && (kRows % kRowsPerPass == 0 || (kPartialPass && kRowsPerPass % kRows == 0)),
                  "tile loads split evenly");
    const int chunk = kChunk0 + tid % kBandChunks;
    const int row0 = tid / kBandChunks;
    const bool chunk_valid = !kClipChunks || chunk < chunks_valid;
    // One running pointer (not one per pass) keeps the loop-invariant state to 2 registers.
    const u8* src = gmem + row0 * row_stride + chunk * kChunkBytes;
    const index_t pass_stride = kRowsPerPass * row_stride;
#pragma unroll
    for (int pass = 0; pass < (kPartialPass ? 1 : kRows / kRowsPerPass); ++pass) {
        const int row = row0 + pass * kRowsPerPass;
        if (kPartialPass && row >= kRows) break;
        const bool valid = row < rows_valid && chunk_valid;
        // Out-of-range rows read nothing (zero-fill); keep the address in range anyway.
        cp_async_16(smem_base + Layout::chunk_offset(row, chunk), valid ? src : gmem, valid);
        src += pass_stride;
    }
    if constexpr (kChunk0 + kBandChunks < kRowChunks) {
        load_rows_async<kRows, kRowBytes, kThreads, Layout, kClipChunks, kChunk0 + kBandChunks>(
            smem_base, gmem, row_stride, rows_valid, tid, chunks_valid);
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

// load_rows_async of a SwizzledTile, with the pointer and row stride in elements; with kClipCols,
// columns >= cols_valid (a multiple of the 16 B chunk's elements) are zero-filled too.
template <int kRows, int kCols, int kThreads, typename T, bool kClipCols = false>
__device__ __forceinline__ void load_tile_async(u32 smem_base, const T* gmem, index_t row_stride,
                                                int rows_valid, int tid, int cols_valid = kCols) {
    constexpr int kChunkElems = kChunkBytes / static_cast<int>(sizeof(T));
    load_rows_async<kRows, kCols * static_cast<int>(sizeof(T)), kThreads, SwizzledTile<kCols, T>, kClipCols>(
        smem_base, reinterpret_cast<const u8*>(gmem), row_stride * static_cast<index_t>(sizeof(T)), rows_valid, tid,
        cols_valid / kChunkElems);
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

// LdsmColumns of a tile whose rows end in a tail of 4 chunks (kRowChunks % 8 == 4): the steps of
// the tail (2 of them) XOR their chunk with (row / 2) % 4 instead (s is a compile-time step).
template <int kRowChunks>
struct LdsmTailColumns {
    static constexpr int kWholeSteps = kRowChunks / kSwizzleRows * (kSwizzleRows / 2);
    int x, x_tail;
    __device__ __forceinline__ LdsmTailColumns(int lane, int hi)
        : x(hi ^ (lane & kSwizzleMask)), x_tail(hi ^ ((lane >> 1) & (kTailChunks - 1))) {}
    __device__ __forceinline__ int col(int s) const {
        return (s / 4) * 64 + ((2 * (s % 4)) ^ (s < kWholeSteps ? x : x_tail)) * 8;
    }
};

// The ldmatrix column table of a swizzled tile with kRowChunks chunks a row.
template <int kRowChunks, bool kTail = (kRowChunks % kSwizzleRows != 0)>
struct LdsmColumnsOf { typedef LdsmColumns type; };
template <int kRowChunks>
struct LdsmColumnsOf<kRowChunks, true> { typedef LdsmTailColumns<kRowChunks> type; };

// Copy a warp's (kRows x kCols) slice of a swizzled shared tile to global memory with 16 B
// stores; rows >= rows_valid are not written, nor with kClipCols the columns >= cols_valid (a
// multiple of the chunk's elements). Called by one whole warp.
template <int kRows, int kCols, typename T, bool kClipCols = false>
__device__ __forceinline__ void store_tile_warp(const T* smem, T* gmem, index_t row_stride,
                                                int rows_valid, int lane, int cols_valid = kCols) {
    constexpr int kChunkElems = kChunkBytes / sizeof(T);
    constexpr int kRowChunks = kCols / kChunkElems;
    constexpr int kPasses = kRows * kRowChunks / kWarpSize;
    static_assert((kRows * kRowChunks) % kWarpSize == 0, "warp store splits evenly");
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
        const int idx = pass * kWarpSize + lane;
        const int row = idx / kRowChunks;
        const int col = (idx % kRowChunks) * kChunkElems;
        if (row < rows_valid && (!kClipCols || col < cols_valid)) {
            const uint4 v =
                *reinterpret_cast<const uint4*>(smem + swizzle_offset<kCols, kChunkElems>(row, col));
            *reinterpret_cast<uint4*>(gmem + row * row_stride + col) = v;
        }
    }
}

}  // namespace flashkit
