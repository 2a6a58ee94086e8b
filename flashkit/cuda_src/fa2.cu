/*---
name: fa2
summary: FlashAttention-2 forward (Q-outer loop, deferred normalization, split-Q warps, mma.sync)
entry: flashkit_fa2_fwd
arch: {min: "8.0", targets: {"8.6": sm_86}}
dtypes: [float16, bfloat16]
head_dims: {min: 8, max: 256, multiple_of: 8, classes: [32, 64, 96, 128, 160, 192, 256]}
features: {causal: true, block_sparse: false, fp8: false, backward: false, lse: true, gqa: true,
           window: true, chunk: true, softcap: true, alibi: true, varlen: true,
           score_mod: true, mask_mod: true, head_dim_v: true}
priority: 50
launch: {grid: q_blocks, block_m: 128, block_n: 64, warps: 4}
overrides: {"hd32": {block_n: 128}, "hd96": {block_m: 128, block_n: 128, warps: 8},
            "hd128": {block_m: 128, block_n: 128, warps: 8}, "hd160": {warps: 8},
            "hd192": {block_m: 128, block_n: 128, warps: 8}, "hd256": {warps: 8},
            "hd192/window": {block_n: 64}, "hd192/softcap": {block_n: 64}, "hd192/alibi": {block_n: 64},
            "hd192/varlen": {block_n: 64}, "8.6": {}, "8.6/hd192": &hd192_99kb {block_n: 64},
            "8.6/hd256": &hd256_99kb {block_n: 32}, "12.0": {}, "12.0/hd192": *hd192_99kb, "12.0/hd256": *hd256_99kb}
# sm_86 / sm_89 and sm_120 (99 KB of shared memory a block) take smaller tiles where these do not fit: hd192 on 64-key tiles (96 KB against 144 KB), hd256 on
# 32-key ones (96 KB against 128 KB).
workspace: none
---*/
// FlashAttention-2 forward (Dao, 2023), tensor cores through mma.sync.m16n8k16.
// Grid (ceil(seqlen_q / block_m), heads, batch): one CTA per (query block, head, batch).
// Each warp owns block_m / warps query rows; Q stays resident (registers when the register
// budget allows, else shared memory) while K/V tiles stream through shared memory with
// cp.async; S = Q K^T, the online softmax and O += P V all stay in registers, with P reused
// in registers as the A operand of the second product. Normalization by l is deferred to the
// epilogue, which also writes LSE = m * scale + ln(l).
// With FLASHKIT_CAUSAL the tiles wholly above the (bottom-right aligned) diagonal are skipped
// and only the tiles crossing it are masked element-wise (sm80/fwd_mainloop.cuh, mask.cuh).
#include "flashkit/functor.cuh"
#include "flashkit/sm80/fwd_mainloop.cuh"

using flashkit::KernelTraits;

// With FLASHKIT_WINDOW, the local mask (window_size / attention_chunk; mask.cuh); softcap / ALiBi
// by FLASHKIT_SOFTCAP / FLASHKIT_ALIBI (score_mod.cuh); a drop-in functor's score_mod / mask_mod (functor.cuh).
typedef flashkit::LocalOr<FLASHKIT_WINDOW, KernelTraits::kBlockM, KernelTraits::kBlockN,
                          flashkit::DenseMask<FLASHKIT_CAUSAL, KernelTraits::kBlockM, KernelTraits::kBlockN>::type>::type BaseMask;
typedef flashkit::MaskFunctorOr<FLASHKIT_MASK_MOD, KernelTraits::kBlockM, KernelTraits::kBlockN, BaseMask>::type FwdMask;
FLASHKIT_FUNCTOR_ENTRIES(BaseMask, KernelTraits::kBlockM, KernelTraits::kBlockN)

FLASHKIT_EXPORT_SMEM_BYTES(KernelTraits::kSmemBytes);

extern "C" __global__ void __launch_bounds__(KernelTraits::kThreads)
    flashkit_fa2_fwd(const flashkit::Params params) {
    const int m_block = blockIdx.x;
    const int head = blockIdx.y;
    const int batch = blockIdx.z;
    flashkit::fwd_query_block<KernelTraits, FwdMask, flashkit::KernelScoreMod>(params, m_block, head, batch);
}
