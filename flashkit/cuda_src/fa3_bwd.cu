/*---
name: fa3_bwd
summary: FlashAttention-3 backward on Hopper (sm_90a) - TMA producer, two or three consumer warpgroups on wgmma, dQ by bulk reductions
entry: [flashkit_fa3_bwd_prepass, flashkit_fa3_bwd_main, flashkit_fa3_bwd_convert_dq]
arch: {min: "9.0", max: "9.0", targets: {"9.0": sm_90a}}
dtypes: [float16, bfloat16]
head_dims: {min: 8, max: 256, multiple_of: 8, classes: [64, 128, 192, 256]}
features: {causal: true, block_sparse: true, fp8: false, backward: true, lse: false, gqa: true,
           window: true, softcap: true, alibi: true, mask_mod: true, score_mod: true, head_dim_v: true}
requires: {backward: true}
# Verified on the H100 (GPU tier and verify --backward, 2026-11-23). Measured in one run (BENCHMARKS.md):
# 1.6x fa2_bwd's TFLOP/s at hd128 and 1.1x at hd64, so it outranks fa2_bwd on sm_90.
priority: 60
launch: {grid: [q_blocks, kv_tiles, q_blocks], block_m: 64, block_n: 128, warps: 12, stages: 2, heaviest_first: 1}   # 1 producer + 2 consumers
# hd64: key blocks of 192, three consumers of 64 keys (measured 15-23% faster than two at 8k, BENCHMARKS.md);
# hd192 and hd256: key blocks of 64, the consumers split dK, dV and dQ by head-dim columns (bwd_traits.cuh; hd192's
# three panels unevenly, dQ 2 + dK 1 and dQ 1 + dK 2). hd136-192 ran at the 256 class before (75% of its products' work
# useful at 192).
# Causal: key blocks heaviest first in groups of (batch, kv head) pairs the host sizes per call by simulating the
# schedule (hopper/bwd_launch_order.cuh, runtime/bwd_order.py): hd128 GQA b8 s2048 h8/2 0.655x -> 1.00x cuDNN.
# Softcap with ALiBi at hd64 needs the 240 registers of two consumers (three spill 72-96 B); softcap, the window and
# ALiBi alone or the window with ALiBi fit three (ALiBi since each role forms its visits after its setmaxnreg:
# 1.17-1.28x faster than on two; the window with ALiBi 1.04-1.10x), and so does a score_mod functor since its queries
# are clamped only in a ragged call's last block and the visit count is formed at each test (relative_bias: 1.09-1.12x
# faster at 8k, 1.05-1.06x at 2k). Softcap's slopes on dS are taken at the recompute (read back from the 16-bit P they
# are wrong beside caps below the scores): through shared memory on three consumers (hopper/bwd_traits.cuh's
# stashes_slopes), held in registers on two; a score_mod functor with its score_mod_grad takes its slopes there too, on
# two consumers at hd64 (on three a softcap functor spilled 116-180 B). A block mask
# (its blocks are multiples of 128 keys) or a mask_mod: key blocks of 128 on two consumers at hd64. Every
# modification at hd128 runs 128-key blocks: the score indices come from a fresh %tid.x (bwd_consumer_base.cuh),
# without which a score_mod functor and softcap with ALiBi spilled 80-112 B non-causal. A non-causal mask_mod at
# hd128 has its element mask evaluated by the producer warpgroup's other warps (mask_warps, hopper/bwd_keep.cuh):
# evaluated by the consumers it spilled 32-48 B there (it ran the column split of 64-key blocks, 1.45-1.57x slower);
# elsewhere the consumers evaluate it, faster where most visits are partial (a document mask: 1.3-2x).
overrides: {"hd64": {block_n: 192, warps: 16}, "hd192": {block_n: 64}, "hd256": {block_n: 64},
            "hd64/softcap+alibi": {block_n: 128, warps: 12},
            "hd64/block_sparse": {block_n: 128, warps: 12},
            "hd64/mask_mod": {block_n: 128, warps: 12}, "hd64/score_mod_grad": {block_n: 128, warps: 12},
            "hd128/mask_mod": {mask_warps: 1},
            "hd128/causal/mask_mod": {mask_warps: 0}}
tensor_maps: {q: block_m, k: block_n, v: block_n, dout: block_m}   # box rows
workspace: dq_accum
---*/
// FlashAttention-3's backward (Shah et al., 2024, section 3 and appendix) on the warp-specialized Hopper
// core, three stages in launch order, one Params block and the same tensor maps for each:
//   prepass    grid (ceil(seqlen_q / block_m), heads, batch): dsum = rowsum(dO O), lse2 = LSE log2(e),
//              dq_accum and the semaphores zeroed (bwd_passes.cuh, shared with fa2_bwd)
//   main       grid (ceil(seqlen_k / block_n), kv_heads, batch): one CTA per key block; a producer thread
//              streams Q and dO by TMA, the consumer warpgroups keep dK, dV in registers over every query
//              head of the group and every visible query block (64 keys each: three at hd64, two at hd128;
//              at hd192 / hd256 two, the block's 64 keys, a share of the head-dim columns each), dQ added to
//              dq_accum in fragment order (dq_layout.cuh) by one bulk reduction a visit, issued by a writer warp
//              a consumer at hd128 and hd192 (hd192: a consumer's two or one panels; hd256: 16-byte reductions)
//              (hopper/ws_backward.cuh)
//   convert_dq grid (ceil(seqlen_q / block_m), heads, batch): dQ = scale dq_accum in the input dtype
// Causal (FLASHKIT_CAUSAL) skips the query blocks above the diagonal and masks the tiles crossing it; a window
// or chunk (FLASHKIT_WINDOW) the query blocks outside it (bwd_mask.cuh); softcap and ALiBi (FLASHKIT_SOFTCAP,
// FLASHKIT_ALIBI) modify the recomputed scores as the forward did, and softcap's slope scales dS.
// A block mask (FLASHKIT_BLOCK_SPARSE) or a drop-in mask_mod (FLASHKIT_MASK_MOD) walks lists built before the main
// kernel (bwd_lists.cuh: a mask_mod's tiles classified here at the backward's tiles, then compacted per key
// block), the mask_mod's element mask on the visits that cross it.
#include "flashkit/bwd_passes.cuh"
#include "flashkit/functor.cuh"
#include "flashkit/hopper/bwd_launch_order.cuh"
#include "flashkit/hopper/ws_backward.cuh"

// V, dO and dV of v's head-dim class (FLASHKIT_HEAD_DIM_V: FLASHKIT_HEAD_DIM unless v is narrower; bwd_traits.cuh).
typedef flashkit::hopper::BwdWsTraits<flashkit::Element, FLASHKIT_HEAD_DIM, FLASHKIT_BLOCK_M, FLASHKIT_BLOCK_N,
                                      FLASHKIT_STAGES, FLASHKIT_HEAD_DIM_V>
    Traits;
// The passes run on the main kernel's block of threads (the runtime launches every entry with one block).
typedef flashkit::BwdPassTraits<flashkit::Element, FLASHKIT_HEAD_DIM, FLASHKIT_BLOCK_M, FLASHKIT_WARPS,
                                FLASHKIT_HEAD_DIM_V>
    PassTraits;
static_assert(FLASHKIT_WARPS * flashkit::kWarpSize == Traits::kThreads, "warps: a producer and the consumers");
typedef flashkit::BwdListedOr<FLASHKIT_BLOCK_SPARSE != 0 || FLASHKIT_MASK_MOD != 0,
                              flashkit::BwdMaskOf<FLASHKIT_WINDOW != 0, FLASHKIT_CAUSAL != 0, false>::type>::type BwdMask;
// A mask_mod's classifier at the backward's tiles, over the forward's mask of the same call (functor.cuh).
typedef flashkit::LocalOr<FLASHKIT_WINDOW, Traits::kBlockM, Traits::kBlockN,
                          flashkit::DenseMask<FLASHKIT_CAUSAL, Traits::kBlockM, Traits::kBlockN>::type>::type ClassifyMask;
FLASHKIT_FUNCTOR_ENTRIES(ClassifyMask, Traits::kBlockM, Traits::kBlockN)

FLASHKIT_EXPORT_SMEM_BYTES(Traits::kSmemBytes);
// The pre-pass and the dQ conversion use no shared memory: launched with the main kernel's, they ran one CTA an SM
// (0.25 + 0.15 ms at b2 s8192 h16 hd128, four times their bytes' time at the HBM rate).
FLASHKIT_EXPORT_ENTRY_SMEM_BYTES(flashkit_fa3_bwd_prepass, 0);
FLASHKIT_EXPORT_ENTRY_SMEM_BYTES(flashkit_fa3_bwd_convert_dq, 0);

// Every entry takes the maps (the runtime passes the same arguments to each); only main reads them.
#define FLASHKIT_FA3_BWD_ARGS                                                                                 \
    const flashkit::Params params, const __grid_constant__ flashkit::hopper::TensorMap q_map,                 \
        const __grid_constant__ flashkit::hopper::TensorMap k_map,                                            \
        const __grid_constant__ flashkit::hopper::TensorMap v_map,                                            \
        const __grid_constant__ flashkit::hopper::TensorMap do_map

extern "C" __global__ void __launch_bounds__(Traits::kThreads) flashkit_fa3_bwd_prepass(FLASHKIT_FA3_BWD_ARGS) {
    flashkit::bwd_prepass<PassTraits>(params, blockIdx.x, blockIdx.y, blockIdx.z);
}

extern "C" __global__ void __launch_bounds__(Traits::kThreads, 1) flashkit_fa3_bwd_main(FLASHKIT_FA3_BWD_ARGS) {
    const flashkit::hopper::BwdTile tile = flashkit::hopper::bwd_launch_order<FLASHKIT_HEAVIEST_FIRST && FLASHKIT_CAUSAL>(
        params.bwd.order_pairs);
    flashkit::hopper::ws_backward<Traits, BwdMask, flashkit::KernelScoreMod>(params, {q_map, k_map, v_map, do_map},
                                                                           tile.n_block, tile.kv_head, tile.batch);
}

#if FLASHKIT_BLOCK_SPARSE || FLASHKIT_MASK_MOD
// The visit lists from the tile states (bwd_lists.cuh), launched by flashkit/features/bwd_lists.py before the passes.
FLASHKIT_BWD_LIST_ENTRIES
#endif

extern "C" __global__ void __launch_bounds__(Traits::kThreads) flashkit_fa3_bwd_convert_dq(FLASHKIT_FA3_BWD_ARGS) {
    flashkit::bwd_convert_dq<PassTraits, Traits::DqLayout>(params, blockIdx.x, blockIdx.y, blockIdx.z);
}
