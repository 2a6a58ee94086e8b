// The parameter block every flashkit kernel entry takes by value.
// Mirrored field for field by flashkit/runtime/params.py (PARAMS_DTYPE); keep the two in step.
#pragma once

// Logical element types, selected per compile with -DFLASHKIT_DTYPE=<code>.
#define FLASHKIT_FLOAT16 1
#define FLASHKIT_BFLOAT16 2
#define FLASHKIT_FLOAT32 3
#define FLASHKIT_FLOAT8_E4M3 4

namespace flashkit {

typedef long long index_t;

// The backward pass (attention_backward): dO in, dQ / dK / dV out, all (batch, seqlen, heads, head_dim)
// with strides in elements; q, k, v, o (the forward's output) and lse (its log-sum-exp) are Params' own.
struct BwdParams {
    const void* dout;
    void* dq;
    void* dk;
    void* dv;
    index_t do_batch_stride, do_row_stride, do_head_stride;
    index_t dq_batch_stride, dq_row_stride, dq_head_stride;
    index_t dk_batch_stride, dk_row_stride, dk_head_stride;
    index_t dv_batch_stride, dv_row_stride, dv_head_stride;
    int deterministic;           // 1: dQ's per-key-block adds run in key-block order (bit-identical)
    int order_pairs;             // causal key blocks heaviest first in groups of this many (batch, kv head) pairs
                                 // (hopper/bwd_launch_order.cuh; 1 or less: launch order)
};

// KV caches (decode, attention_with_kvcache): per-sequence lengths, a paged layout, and the split-KV
// geometry. Paged: k / v are (num_pages, page_size, kv_heads, head_dim) and their batch strides step
// one page; sequence b's key j lives in page block_table[b * table_batch_stride + j / page_size].
struct KvCacheParams {
    const int* block_table;      // (batch, max_pages) int32, or nullptr: k / v are (batch, seqlen_k, ...)
    const int* seqlens;          // (batch,) int32 keys of each sequence, or nullptr: all have seqlen_k
    index_t table_batch_stride;  // elements between two sequences' rows of block_table
    int page_size;               // keys per page (a multiple of the K/V tile), 0 when not paged
    int splits;                  // key chunks per (row block, kv head, batch); 1: no combine pass
    int row_blocks;              // blocks of packed (query row, group head) rows per kv head
};

// Built-in attention modifications (score_mod.cuh, mask.cuh's LocalMask), read only by kernels built
// with FLASHKIT_WINDOW / FLASHKIT_SOFTCAP / FLASHKIT_ALIBI. Windows arrive with -1 (unbounded) already
// replaced by seqlen_q + seqlen_k, so a kernel needs no branch for an open side.
// The extra arguments of a drop-in functor (mods/*.cu, docs/functors.md), filled from attention(...,
// mod_args={...}) in the manifest's declaration order per kind: pointers, ints, floats.
struct ModArgs {
    const void* ptr[2];          // CUDA arrays (contiguous), cast by the functor to their declared dtype
    int ints[4];
    float floats[4];
    int seqlen_q, seqlen_k;      // the call's lengths (bottom-right alignment: offset seqlen_k - seqlen_q)
};

struct ModParams {
    const float* alibi_slopes;   // (batch, heads) or (heads,) float32, or nullptr
    index_t alibi_batch_stride;  // elements; 0 when the slopes broadcast over the batch
    index_t alibi_head_stride;
    int window_left;             // query i sees keys [i + off - left, i + off + right], off = seqlen_k - seqlen_q
    int window_right;
    int chunk;                   // attention_chunk: floor((i + off) / chunk) == floor(j / chunk); 0: none
    float softcap;               // c: scaled scores become c tanh(s / c); 0: none
    float softcap_in;            // softmax_scale / c: the tanh argument per raw score q.k
    float softcap_out;           // c / softmax_scale: back to raw-score units
    float inv_softmax_scale;     // 1 / softmax_scale: ALiBi's bias in raw-score units
    // Drop-in functors (functor.cuh), read only by kernels built with FLASHKIT_SCORE_MOD / FLASHKIT_MASK_MOD.
    ModArgs args;
    // mask_mod's tile lists, one row per (tile batch, tile head, query tile), filled on the GPU before the launch:
    // tile_count[2 row] full tiles, then tile_count[2 row + 1] partial ones, listed in tile_list[row * k_tiles ..].
    int* tile_count;
    int* tile_list;
    unsigned char* tile_state;   // (rows, k_tiles) scratch of the classifier: 0 empty, 1 partial, 2 full
    int tile_batch, tile_heads;  // 1 (mask_mod does not read batch / head) or batch / heads
    int q_tiles, k_tiles;        // query tiles of block_m rows, key tiles of block_n keys
};

// Variable-length batches (varlen.cuh): packed q / o (total_q, heads, D) and k / v (total_k, kv_heads, D);
// sequence b owns rows [cu_seqlens_q[b], cu_seqlens_q[b + 1]) of q, o and [cu_seqlens_k[b], cu_seqlens_k[b + 1])
// of k, v. Read only by kernels built with FLASHKIT_VARLEN.
struct VarlenParams {
    const int* cu_seqlens_q;     // (batch + 1,) int32, non-decreasing from 0
    const int* cu_seqlens_k;
};

// The backward's visit lists (bwd_mask.cuh's BwdListed), for a block mask or a mask_mod: per (list batch,
// list head, key tile) the query tiles that see a key of it, those that need an element mask first; read only by
// backward kernels built with FLASHKIT_BLOCK_SPARSE or FLASHKIT_MASK_MOD (tiles of the build's block_m x block_n).
struct BwdListParams {
    const int* count;            // [row][2], row = (list batch, list head, key tile): partial visits, all visits
    const int* list;             // [row][q_tiles]: the visited query tiles, the partial ones first, each part ascending
    const int* rank;             // [(list batch, list head, query tile)][k_tiles]: how many visiting key tiles come
                                 // before key tile n in query tile m's row (deterministic dQ order)
    int batch, heads;            // 1 (the lists broadcast) or the call's batch / heads
    int q_tiles, k_tiles;
};

struct Params {
    // Layout (batch, seqlen, heads, head_dim); the last dimension is contiguous.
    const void* q;
    const void* k;
    const void* v;
    void* o;
    float* lse;                  // (batch, heads, seqlen_q) float32, or nullptr when not asked for
    void* workspace;             // variant scratch sized by the manifest's `workspace` kind, or nullptr
    const int* kv_block_count;   // block sparse: kept K/V blocks per query block, or nullptr
    const int* kv_block_index;   // block sparse: their indices, [.., q_blocks, k_blocks]
    const float* q_scale;        // fp8: one scale per (batch, head, block of rows), or nullptr
    const float* k_scale;
    const float* v_scale;

    // Strides in elements.
    index_t q_batch_stride, q_row_stride, q_head_stride;
    index_t k_batch_stride, k_row_stride, k_head_stride;
    index_t v_batch_stride, v_row_stride, v_head_stride;
    index_t o_batch_stride, o_row_stride, o_head_stride;

    int batch, heads, kv_heads;
    int seqlen_q, seqlen_k, head_dim;

    // Block mask geometry: mask_batch / mask_heads are 1 (broadcast) or batch / heads.
    int mask_batch, mask_heads, mask_q_blocks, mask_k_blocks;
    int mask_block_q, mask_block_k;

    // FP8 scale geometry: rows per scale block and scale blocks per (batch, head).
    int scale_block_rows, q_scale_blocks, k_scale_blocks;

    float softmax_scale;         // S = softmax_scale * Q K^T
    float softmax_scale_log2;    // softmax_scale * log2(e), for exp2-based softmax

    BwdParams bwd;               // the backward's gradients (zero in forward calls)
    KvCacheParams cache;         // decode and KV caches (zero elsewhere)
    ModParams mods;              // window, chunk, softcap, ALiBi (zero when a kernel is built without them)
    VarlenParams varlen;         // packed variable-length batches (zero elsewhere)
    // The LSE of (batch, head, row) is lse[batch * lse_batch_stride + head * lse_head_stride + row]:
    // (batch, heads, seqlen_q) dense, (heads, total_q) varlen.
    index_t lse_batch_stride, lse_head_stride;
    // The head dim of v and o (MLA: 128 under q / k's 192); head_dim where they are the same. Read by
    // the FA2 family (traits.cuh's kHeadDimV; fa3 reads it only for a packed sequence's last rows), appended last so
    // every earlier offset is unchanged.
    int head_dim_v;
    BwdListParams bwd_lists;     // the backward's visit lists (zero elsewhere), after every earlier field
};

}  // namespace flashkit

// Every variant exports the dynamic shared memory its launch needs, read by the runtime
// after loading the module: FLASHKIT_EXPORT_SMEM_BYTES(bytes);
#define FLASHKIT_EXPORT_SMEM_BYTES(bytes) \
    extern "C" __constant__ int flashkit_smem_bytes = (bytes)
// An entry that needs other than the module's (a pre-pass beside a big main kernel) exports its own:
// FLASHKIT_EXPORT_ENTRY_SMEM_BYTES(entry, bytes);
#define FLASHKIT_EXPORT_ENTRY_SMEM_BYTES(entry, bytes) \
    extern "C" __constant__ int flashkit_smem_bytes_##entry = (bytes)
