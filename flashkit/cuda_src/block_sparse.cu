/*---
name: block_sparse
summary: block-sparse FlashAttention-2 forward (visits only the K/V blocks a flashkit.BlockMask keeps; optional causal)
entry: flashkit_block_sparse_fwd
arch: {min: "8.0", targets: {"8.6": sm_86}}
dtypes: [float16, bfloat16]
head_dims: {min: 8, max: 256, multiple_of: 8, classes: [32, 64, 96, 128, 160, 192, 256]}
features: {causal: true, block_sparse: true, fp8: false, backward: false, lse: true, gqa: true,
           window: true, chunk: true, softcap: true, alibi: true, score_mod: true}
requires: {block_sparse: true}
priority: 50
launch: {grid: q_blocks, block_m: 128, block_n: 64, warps: 4}
overrides: {"hd96": {block_m: 128, block_n: 128, warps: 8}, "hd128": {block_m: 128, block_n: 128, warps: 8},
            "hd160": {warps: 8}, "hd192": {warps: 8}, "hd256": {warps: 8},   # 128x128 spills at hd32 and hd192 (sm_90)
            "8.6": {}, "8.6/hd256": &hd256_99kb {block_n: 32}, "12.0": {}, "12.0/hd256": *hd256_99kb}
# sm_86 / sm_89 and sm_120 (99 KB of shared memory a block) take smaller tiles where these do not fit: hd256 on 32-key tiles (96 KB against 128 KB).
workspace: none
---*/
// Block-sparse FlashAttention: the FlashAttention-2 forward of fa2.cu (sm80/fwd_mainloop.cuh) with
// the BlockSparseMask type (block_sparse.cuh) choosing which K/V tiles each query block visits.
// Work scales with the mask's density: a query block reads only its kept K/V blocks, listed in
// the compressed form of flashkit.BlockMask (kv_block_count, kv_block_index).
// Grid (ceil(seqlen_q / block_m), heads, batch); block_m and block_n divide the mask's blocks
// (multiples of 128). The element mask of the call (FLASHKIT_CAUSAL: bottom-right aligned; FLASHKIT_WINDOW:
// window_size / attention_chunk) applies on top of the block mask, and kept blocks it hides wholly are not
// visited; softcap / ALiBi (score_mod.cuh) and a drop-in score_mod (functor.cuh) modify the scores as in fa2.cu.
#include "flashkit/block_sparse.cuh"
#include "flashkit/functor.cuh"
#include "flashkit/sm80/fwd_mainloop.cuh"

using flashkit::KernelTraits;

typedef flashkit::LocalOr<FLASHKIT_WINDOW, KernelTraits::kBlockM, KernelTraits::kBlockN,
                          flashkit::DenseMask<FLASHKIT_CAUSAL, KernelTraits::kBlockM, KernelTraits::kBlockN>::type>::type
    ElementMask;
typedef flashkit::BlockSparseMask<KernelTraits::kBlockM, KernelTraits::kBlockN, ElementMask> FwdMask;

FLASHKIT_EXPORT_SMEM_BYTES(KernelTraits::kSmemBytes);

extern "C" __global__ void __launch_bounds__(KernelTraits::kThreads)
    flashkit_block_sparse_fwd(const flashkit::Params params) {
    const int m_block = blockIdx.x;
    const int head = blockIdx.y;
    const int batch = blockIdx.z;
    const FwdMask mask(params, m_block, head, batch);
    flashkit::fwd_block<KernelTraits, FwdMask, flashkit::KernelScoreMod>(params, mask, m_block, head, batch,
                                                                          flashkit::SeqOrigin{0, 0, batch});
}
