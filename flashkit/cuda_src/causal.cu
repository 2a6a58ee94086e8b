/*---
name: causal
summary: FlashAttention-2 forward specialised for causal attention (diagonal-aware, heaviest blocks first)
entry: flashkit_causal_fwd
arch: {min: "8.0", targets: {"8.6": sm_86}}
dtypes: [float16, bfloat16]
head_dims: {min: 8, max: 256, multiple_of: 8, classes: [32, 64, 96, 128, 160, 192, 256]}
features: {causal: true, block_sparse: false, fp8: false, backward: false, lse: true, gqa: true,
           window: true, chunk: true, softcap: true, alibi: true, varlen: true,
           score_mod: true, mask_mod: true, head_dim_v: true}
requires: {causal: true}
priority: 60
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
// Causal FlashAttention-2 forward: always causal (bottom-right aligned: query i sees key j iff
// j <= i + seqlen_k - seqlen_q), whatever FLASHKIT_CAUSAL says.
// - K/V tiles wholly above the diagonal are never loaded nor computed: query block r visits
//   only tiles [0, ceil((last_row + seqlen_k - seqlen_q + 1) / block_n)).
// - The element mask runs only on the tiles crossing the diagonal (and the ragged tail);
//   they are visited first, the fully visible tiles after them (CausalMask, sm80/fwd_mainloop.cuh).
// - Work per query block grows with its index, so blocks are scheduled heaviest first:
//   blockIdx.x = 0 takes the last query block, which keeps the tail of the grid short.
// - A query block whose rows see no key (seqlen_q > seqlen_k) loads nothing and writes
//   O = 0, LSE = -inf.
#include "flashkit/functor.cuh"
#include "flashkit/sm80/fwd_mainloop.cuh"

using flashkit::KernelTraits;
// With FLASHKIT_WINDOW, the local mask (the runtime passes window_right = 0: causal stays causal).
typedef flashkit::LocalOr<FLASHKIT_WINDOW, KernelTraits::kBlockM, KernelTraits::kBlockN,
                          flashkit::CausalMask<KernelTraits::kBlockM, KernelTraits::kBlockN>>::type BaseMask;
// A drop-in functor's mask_mod on top (functor.cuh).
typedef flashkit::MaskFunctorOr<FLASHKIT_MASK_MOD, KernelTraits::kBlockM, KernelTraits::kBlockN, BaseMask>::type FwdMask;
FLASHKIT_FUNCTOR_ENTRIES(BaseMask, KernelTraits::kBlockM, KernelTraits::kBlockN)

FLASHKIT_EXPORT_SMEM_BYTES(KernelTraits::kSmemBytes);

extern "C" __global__ void __launch_bounds__(KernelTraits::kThreads)
    flashkit_causal_fwd(const flashkit::Params params) {
    const int m_block = gridDim.x - 1 - blockIdx.x;   // heaviest (last) query block first
    const int head = blockIdx.y;
    const int batch = blockIdx.z;
    flashkit::fwd_query_block<KernelTraits, FwdMask, flashkit::KernelScoreMod>(params, m_block, head, batch);
}
