/*---
name: fa2_bwd
summary: FlashAttention-2 backward (K/V-outer, dK dV in registers, dQ by fp32 atomics, mma.sync)
entry: [flashkit_fa2_bwd_prepass, flashkit_fa2_bwd_main, flashkit_fa2_bwd_convert_dq]
arch: {min: "8.0", targets: {"8.6": sm_86}}
dtypes: [float16, bfloat16]
head_dims: {min: 8, max: 256, multiple_of: 8, classes: [64, 128, 192, 256]}
features: {causal: true, block_sparse: true, fp8: false, backward: true, lse: false, gqa: true, varlen: true,
           window: true, chunk: true, softcap: true, alibi: true, score_mod: true, mask_mod: true, head_dim_v: true}
requires: {backward: true}
priority: 50
launch: {grid: [q_blocks, kv_tiles, q_blocks], block_m: 64, block_n: 128, warps: 8}
# hd64: FlashAttention-2's 128-query blocks (133 KB; each warp takes its strip's queries in two 64-query chunks,
# sm80/bwd_traits.cuh's kQueryChunks), 64 on sm_86 / sm_89 / sm_120's 99 KB.
# hd192 and hd256: FlashAttention-2's 64-key blocks (hd192 double-buffered on sm_80 too: 161 KB of its 163 KB; its
# class serves MLA's q / k of 192 under v's 128 at 192 rather than 256). Q and dO are double-buffered where an SM's
# shared memory holds both stages (q_stages, sm80/bwd_traits.cuh): sm_80 (163 KB a block) single-buffers hd256 (145 KB against 209 KB), sm_86
# and sm_89 (99 KB) run hd128 on 64-key blocks (81 KB) and hd192 on 32-key blocks (81 KB, 16-key warp strips), and
# hd256 on 32-key blocks with V's fragments held in registers (v_in_regs: V lands in Q's buffer once; 89 KB); the
# "8.6" keys hold for sm_87 too, which could take sm_80's; sm_120 takes the same tables as sm_86.
overrides: {"hd64": {block_m: 128}, "hd192": {block_n: 64}, "hd256": {block_n: 64}, "8.0": {},
            "8.0/hd256": {q_stages: 1}, "8.6": {}, "8.6/hd64": &hd64_99kb {block_m: 64},
            "8.6/hd128": &hd128_99kb {block_n: 64, q_stages: 1}, "8.6/hd192": &hd192_99kb {block_n: 32, q_stages: 1},
            "8.6/hd256": &hd256_99kb {block_n: 32, q_stages: 1, v_in_regs: 1},
            "12.0": {}, "12.0/hd64": *hd64_99kb, "12.0/hd128": *hd128_99kb, "12.0/hd192": *hd192_99kb,
            "12.0/hd256": *hd256_99kb}
workspace: dq_accum
---*/
// FlashAttention-2 backward (Dao, 2023), three stages in launch order:
//   prepass    grid (ceil(seqlen_q / block_m), heads, batch): dsum = rowsum(dO O), lse2 = LSE log2(e),
//              dq_accum and the semaphores zeroed (bwd_passes.cuh)
//   main       grid (ceil(seqlen_k / block_n), kv_heads, batch): one CTA per key block holds dK, dV in
//              registers while it walks the query blocks of its group's heads, recomputing P from the
//              LSE; dQ through fp32 atomics (sm80/: bwd_walk.cuh, bwd_mainloop.cuh and its members by concern)
//   convert_dq grid (ceil(seqlen_q / block_m), heads, batch): dQ = dq_accum in the input dtype
// A block mask (FLASHKIT_BLOCK_SPARSE) or a mask_mod functor (FLASHKIT_MASK_MOD) visits the query blocks its lists
// name (bwd_lists.cuh, built on the GPU at these tiles by flashkit/features/bwd_lists.py: a block mask's from its
// blocks, a mask_mod's by its classifier; bwd_visits.cuh walks them); a mask_mod's partial visits apply it per
// element (sm80/bwd_mainloop.cuh's keep_bits).
// Causal (FLASHKIT_CAUSAL) skips the query blocks above the diagonal and masks the tiles crossing it; a window
// or chunk (FLASHKIT_WINDOW) the query blocks outside it (bwd_mask.cuh); softcap and ALiBi (FLASHKIT_SOFTCAP,
// FLASHKIT_ALIBI) modify the recomputed scores as the forward did, and softcap's slope scales dS; so does a drop-in
// score_mod functor (FLASHKIT_SCORE_MOD, functor.cuh: its score_mod_grad scales dS).
// Varlen (FLASHKIT_VARLEN, attention_varlen_backward): packed sequences, the grids of the longest (batch = the
// sequences); every CTA sees its own sequence through varlen.cuh (causal bottom-right aligned per sequence),
// blocks past the sequence's last query (prepass, convert_dq) or key (main) return at once.
#include "flashkit/functor.cuh"
#include "flashkit/sm80/bwd_walk.cuh"

using flashkit::BwdKernelTraits;
// A block mask's or a mask_mod's backward walks the visit lists (bwd_lists.cuh); the inner mask cuts the causal
// diagonal, the window.
typedef flashkit::BwdListedOr<FLASHKIT_BLOCK_SPARSE != 0 || FLASHKIT_MASK_MOD != 0,
                              flashkit::BwdMaskOf<FLASHKIT_WINDOW != 0, FLASHKIT_CAUSAL != 0>::type>::type BwdMask;
// A mask_mod's classifier at the backward's tiles, over the forward's mask of the same call (functor.cuh).
typedef flashkit::LocalOr<FLASHKIT_WINDOW, BwdKernelTraits::kBlockM, BwdKernelTraits::kBlockN,
                          flashkit::DenseMask<FLASHKIT_CAUSAL, BwdKernelTraits::kBlockM,
                                              BwdKernelTraits::kBlockN>::type>::type ClassifyMask;
FLASHKIT_FUNCTOR_ENTRIES(ClassifyMask, BwdKernelTraits::kBlockM, BwdKernelTraits::kBlockN)

FLASHKIT_EXPORT_SMEM_BYTES(BwdKernelTraits::kSmemBytes);
// The pre-pass and the dQ conversion use no shared memory: launched with the main kernel's, they ran one CTA an SM
// (0.25 + 0.15 ms at b2 s8192 h16 hd128, four times their bytes' time at the HBM rate).
FLASHKIT_EXPORT_ENTRY_SMEM_BYTES(flashkit_fa2_bwd_prepass, 0);
FLASHKIT_EXPORT_ENTRY_SMEM_BYTES(flashkit_fa2_bwd_convert_dq, 0);

extern "C" __global__ void __launch_bounds__(BwdKernelTraits::kThreads)
    flashkit_fa2_bwd_prepass(const flashkit::Params params) {
    flashkit::bwd_prepass<BwdKernelTraits>(params, blockIdx.x, blockIdx.y, blockIdx.z);
}

extern "C" __global__ void __launch_bounds__(BwdKernelTraits::kThreads, 1)
    flashkit_fa2_bwd_main(const flashkit::Params params) {
    flashkit::bwd_block<BwdKernelTraits, BwdMask, flashkit::KernelScoreMod>(params, blockIdx.x, blockIdx.y, blockIdx.z);
}

#if FLASHKIT_BLOCK_SPARSE || FLASHKIT_MASK_MOD
FLASHKIT_BWD_LIST_ENTRIES
#endif

extern "C" __global__ void __launch_bounds__(BwdKernelTraits::kThreads)
    flashkit_fa2_bwd_convert_dq(const flashkit::Params params) {
    flashkit::bwd_convert_dq<BwdKernelTraits, BwdKernelTraits::DqLayout>(params, blockIdx.x, blockIdx.y, blockIdx.z);
}
