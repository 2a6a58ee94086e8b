// A swizzled shared tile's rows out to global memory in whole 16 B chunks: the backward's dK / dV epilogues
// (sm80/bwd_epilogue.cuh, hopper/bwd_epilogue.cuh) and the forward's O rows that TMA cannot store
// (hopper/tma_epilogue.cuh's store_rows).
#pragma once

#include "flashkit/tile.cuh"   // ld_shared_v4, kChunkBytes

namespace flashkit {

// Rows row0 .. row0 + rows - 1 of a shared tile laid out as Tile::chunk_offset (16 B chunks, swizzled), chunks
// [chunk0, chunk0 + kChunks) of each row clipped to chunks_valid (counted from the row's start), to dst's rows
// 0 .. rows - 1 at the same chunks (dst 16 B aligned, row_stride in elements T). The kThreads threads (tid: 0 ..
// kThreads - 1) take consecutive chunks, so a warp writes whole runs of its rows: 512 B over two 256 B rows where a
// row is 16 chunks. Called after a barrier that orders the tile's stores before these loads.
template <class Tile, int kChunks, int kThreads, typename T>
__device__ __forceinline__ void store_tile_rows(u32 tile, int row0, int rows, int chunk0, int chunks_valid, T* dst,
                                                index_t row_stride, int tid) {
    constexpr int kChunkElems = kChunkBytes / static_cast<int>(sizeof(T));
#pragma unroll 4
    for (int c = tid; c < rows * kChunks; c += kThreads) {
        const int r = c / kChunks;
        const int chunk = chunk0 + c % kChunks;
        if (chunk >= chunks_valid) continue;
        u32 v[4];
        ld_shared_v4(tile + Tile::chunk_offset(row0 + r, chunk), v);
        *reinterpret_cast<uint4*>(dst + r * row_stride + chunk * kChunkElems) = make_uint4(v[0], v[1], v[2], v[3]);
    }
}

}  // namespace flashkit
