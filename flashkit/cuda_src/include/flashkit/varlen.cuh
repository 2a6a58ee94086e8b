// Variable-length batches (flash-attn's varlen layout): q and o packed as (total_q, heads, D), k and v
// as (total_k, kv_heads, D); sequence b owns rows [cu_seqlens_q[b], cu_seqlens_q[b + 1]) of q, o and
// [cu_seqlens_k[b], cu_seqlens_k[b + 1]) of k, v; the LSE is (heads, total_q) (Params::varlen, params.cuh).
//
// A kernel built with FLASHKIT_VARLEN runs the grid of the longest sequence, (ceil(max_seqlen_q /
// block_m), heads, batch), and sees its own sequence as a dense problem: sequence_view() puts the
// sequence's lengths in seqlen_q and seqlen_k, so masks (bottom-right aligned per sequence) and score
// modifications run unchanged, and SeqOrigin says where the sequence's row 0 lies, which tile loads and
// epilogues add to their rows:
//   row r of the sequence = row origin.q_row + r (k, v: origin.k_row + r) of batch origin.batch
// (dense: row r of batch b; varlen: row cu_seqlens[b] + r of the packed tensors' single batch). The LSE's
// rows follow q's: lse[origin.batch * lse_batch_stride + head * lse_head_stride + origin.q_row + r].
// Blocks past a sequence's last row return at once. The offsets stay in registers (one int each) rather
// than as moved base pointers: the FA2 main loop runs at the 255-register limit.
#pragma once

#include "flashkit/params.cuh"

#ifndef FLASHKIT_VARLEN
#define FLASHKIT_VARLEN 0
#endif

namespace flashkit {

// The coordinates of a sequence's row 0 in the tensors a kernel reads: dense (row 0 of batch b),
// or varlen (row cu_seqlens[b] of the single packed batch).
struct SeqOrigin {
    int q_row;
    int k_row;
    int batch;
};

// Sequence b of a varlen batch: its lengths in the parameter block's seqlen_q / seqlen_k, and where its row 0
// lies (row cu_seqlens[b] of the packed tensors' single batch).
__device__ __forceinline__ Params sequence_view(const Params& p, int b, SeqOrigin& origin) {
    Params s = p;
    const int q0 = p.varlen.cu_seqlens_q[b];
    const int k0 = p.varlen.cu_seqlens_k[b];
    s.seqlen_q = p.varlen.cu_seqlens_q[b + 1] - q0;
    s.seqlen_k = p.varlen.cu_seqlens_k[b + 1] - k0;
    origin = SeqOrigin{q0, k0, 0};
    return s;
}

// Which rows of a sequence a CTA's block counts: its queries (the forward and the backward's passes, grid
// (ceil(max_seqlen_q / block_m), heads, batch)) or its keys (the backward's K/V-outer grid, (ceil(max_seqlen_k /
// block_n), kv_heads, batch): a sequence with keys but no queries still runs its key blocks, which write
// dK = dV = 0).
enum class SeqRows { kQueries, kKeys };

// body(params, origin) for block `block` (of kBlock rows) of sequence b: with kVarlen through the sequence's
// view, and only when the block holds rows of the sequence; without, on the parameter block as it is.
template <bool kVarlen, int kBlock, SeqRows kRows = SeqRows::kQueries, class Body>
__device__ __forceinline__ void for_sequence(const Params& p, int b, int block, Body&& body) {
    if constexpr (kVarlen) {
        SeqOrigin origin;
        const Params view = sequence_view(p, b, origin);
        if (block * kBlock < (kRows == SeqRows::kKeys ? view.seqlen_k : view.seqlen_q)) body(view, origin);
    } else {
        body(p, SeqOrigin{0, 0, b});
    }
}

// Sequence b's first row and length, read again from cu_seqlens (cu_seqlens_q or cu_seqlens_k): the loads are
// volatile so that a kernel at the register limit re-reads them where it needs them (a tile load inside its
// main loop, an epilogue) instead of holding the view's values live across the loop.
__device__ __forceinline__ void reload_range(const int* cu_seqlens, int b, int& row0, int& len) {
    int r0, r1;
    asm volatile("ld.global.s32 %0, [%1];\n" : "=r"(r0) : "l"(cu_seqlens + b));
    asm volatile("ld.global.s32 %0, [%1];\n" : "=r"(r1) : "l"(cu_seqlens + b + 1));
    row0 = r0;
    len = r1 - r0;
}

}  // namespace flashkit
