// Where a K/V tile of one (sequence, kv head) lives: a contiguous (batch, seqlen_k, kv_heads, D) cache, or
// a paged (num_pages, page_size, kv_heads, D) cache indexed through block_table (vLLM / FlashInfer layout).
//
// Paged: key j of sequence b is row j % page_size of page block_table[b][j / page_size]. page_size is a
// multiple of the tile's keys, so a tile [n0, n0 + kTileKeys) never spans two pages: its rows are
// contiguous (row stride apart) inside one page.
// A warp walks its tiles in order; it caches the page ids of its next 32 tiles in a register, one per
// lane (one coalesced read of block_table per 32 tiles), and takes each with a shuffle.
#pragma once

#include "flashkit/tile.cuh"

namespace flashkit {

template <int kTileKeys>
struct KvTileSource {
    const u8* k_base;       // k at (sequence or page 0, key 0, kv head)
    const u8* v_base;
    index_t k_page_bytes;   // paged: bytes between pages (the cache's first stride)
    index_t v_page_bytes;
    index_t k_row_bytes;
    index_t v_row_bytes;
    const int* table;       // this sequence's block_table row, or nullptr (contiguous)
    int page_size;
    int page_reg;           // lane l: page of the warp's tile (page_first + l)
    int page_first;         // first tile index the cached pages cover, or a large value

    __device__ __forceinline__ KvTileSource(const Params& p, int batch, int kv_head, int elem_bytes) {
        const u8* k = static_cast<const u8*>(p.k);
        const u8* v = static_cast<const u8*>(p.v);
        table = p.cache.block_table == nullptr ? nullptr : p.cache.block_table + batch * p.cache.table_batch_stride;
        const index_t kb = table == nullptr ? batch : 0;   // paged: the page picks the block
        k_base = k + (kb * p.k_batch_stride + kv_head * p.k_head_stride) * elem_bytes;
        v_base = v + (kb * p.v_batch_stride + kv_head * p.v_head_stride) * elem_bytes;
        k_page_bytes = p.k_batch_stride * elem_bytes;
        v_page_bytes = p.v_batch_stride * elem_bytes;
        k_row_bytes = p.k_row_stride * elem_bytes;
        v_row_bytes = p.v_row_stride * elem_bytes;
        page_size = p.cache.page_size;
        page_reg = 0;
        page_first = -kWarpSize;   // nothing cached yet
    }

    // The page of tile `tile`, where the warp's i-th tile is first + i * step and i only grows.
    // Warp-uniform arguments; every lane of the warp calls it.
    __device__ __forceinline__ int page_of(int i, int first, int step, int n_tiles, int lane) {
        if (i >= page_first + kWarpSize) {   // refill: pages of tiles i .. i + 31
            page_first = i;
            const int tile = first + (i + lane) * step;
            page_reg = tile < n_tiles ? table[tile * kTileKeys / page_size] : 0;
        }
        return __shfl_sync(0xffffffffu, page_reg, i - page_first);
    }

    // Global addresses of the K and V rows of the tile starting at key n0 (page: its page id).
    __device__ __forceinline__ void tile_rows(int n0, int page, const u8*& k_rows, const u8*& v_rows) const {
        if (table == nullptr) {
            k_rows = k_base + n0 * k_row_bytes;
            v_rows = v_base + n0 * v_row_bytes;
        } else {
            const int in_page = n0 % page_size;
            k_rows = k_base + page * k_page_bytes + in_page * k_row_bytes;
            v_rows = v_base + page * v_page_bytes + in_page * v_row_bytes;
        }
    }
};

}  // namespace flashkit
