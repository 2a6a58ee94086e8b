/*---
name: decode
summary: split-KV decode forward (flash-decoding, GQA rows packed in one tile, paged KV caches, mma.sync)
entry: [flashkit_decode_fwd, flashkit_decode_combine]
arch: {min: "8.0", targets: {"8.6": sm_86}}
dtypes: [float16, bfloat16]
head_dims: {min: 8, max: 256, multiple_of: 8, classes: [32, 64, 96, 128, 160, 192, 256]}
features: {causal: true, block_sparse: false, fp8: false, backward: false, lse: true, gqa: true, kv_cache: true,
           window: true, softcap: true}
limits: {seqlen_q: 16, packed_rows: 64}
priority: 90
launch: {grid: [kv_splits, split_combine], block_m: 16, block_n: 16, warps: 4, stages: 3}
overrides: {"hd64": {stages: 4}, "hd256": {stages: 2},
            "8.6": {}, "8.6/hd128": &hd128_99kb {stages: 2}, "8.6/hd160": &hd160_99kb {stages: 2},
            "8.6/hd192": &hd192_99kb {warps: 2}, "8.6/hd256": &hd256_99kb {warps: 2},
            "12.0": {}, "12.0/hd128": *hd128_99kb, "12.0/hd160": *hd160_99kb, "12.0/hd192": *hd192_99kb,
            "12.0/hd256": *hd256_99kb}
# Shared memory: the Q tile and each warp's ring, 32 hd (1 + 2 warps stages) bytes. hd256 takes two stages (136 KB;
# three, 200 KB, pass sm_80's 163 KB). sm_86 / sm_89 and sm_120 (99 KB a block) take smaller rings where these do not
# fit: hd128 and hd160 with two stages (68 / 85 KB), hd192 and hd256 with two warps (78 / 72 KB).
workspace: split_partials
---*/
// Decode / speculative decode: a few query rows per sequence against a long KV cache.
// Stage 1, grid (splits, row_blocks * kv_heads, batch): one CTA per key chunk of a (block of 16 packed
// (query row, group head) rows, kv head, sequence); each warp streams its own tiles through a cp.async ring
// (sm80/decode_mainloop.cuh), the warps merge in shared memory, and the CTA writes O and LSE (one split)
// or its fp32 partial (split_kv.cuh). Stage 2, grid split_combine (skipped with one split): one warp per
// output row merges the partials, LSE = logsumexp_s LSE_s, O = sum_s exp(LSE_s - LSE) O_s.
// K / V are contiguous (batch, seqlen_k, kv_heads, D) or paged through block_table (paged_kv.cuh);
// per-sequence lengths come from cache.seqlens. Causal is bottom-right aligned per sequence, and so is a window
// (FLASHKIT_WINDOW: window_size, whose tiles outside every row's window are never loaded); FLASHKIT_SOFTCAP caps
// the scores. (ALiBi's slope differs across the packed heads of a row block: not built here.)
#include "flashkit/sm80/decode_mainloop.cuh"

static_assert(FLASHKIT_BLOCK_M == 16 && FLASHKIT_BLOCK_N == 16, "decode tiles: 16 packed rows x 16 keys");
static_assert(FLASHKIT_ALIBI == 0, "decode: no ALiBi (its manifest declares none)");
typedef flashkit::DecodeTraits<FLASHKIT_HEAD_DIM, FLASHKIT_WARPS, FLASHKIT_STAGES, flashkit::Element,
                               flashkit::OutT>
    Kt;

FLASHKIT_EXPORT_SMEM_BYTES(Kt::kSmemBytes);

extern "C" __global__ void __launch_bounds__(Kt::kThreads) flashkit_decode_fwd(const flashkit::Params params) {
    const int kv_head = blockIdx.y / params.cache.row_blocks;
    const int row_block = blockIdx.y % params.cache.row_blocks;
    flashkit::decode_block<Kt, FLASHKIT_CAUSAL != 0, FLASHKIT_WINDOW != 0, flashkit::BuildScoreMod>(
        params, blockIdx.x, kv_head, row_block, blockIdx.z);
}

// One warp per output row (batch, head, query row), in the LSE's order.
extern "C" __global__ void __launch_bounds__(Kt::kThreads) flashkit_decode_combine(const flashkit::Params params) {
    const flashkit::index_t row =
        static_cast<flashkit::index_t>(blockIdx.x) * Kt::kWarps + threadIdx.x / flashkit::kWarpSize;
    if (row >= static_cast<flashkit::index_t>(params.batch) * params.heads * params.seqlen_q) return;
    flashkit::combine_row<Kt::kHeadDim, flashkit::OutT>(params, row, threadIdx.x % flashkit::kWarpSize,
                                                        Kt::kHeadDimPadded ? params.head_dim : Kt::kHeadDim);
}
