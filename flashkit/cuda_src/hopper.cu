/*---
name: hopper
summary: FlashAttention forward on Hopper warpgroup products (wgmma bf16 / f16, sm_90a), softmax overlapped with P V
entry: flashkit_hopper_fwd
arch: {min: "9.0", max: "9.0", targets: {"9.0": sm_90a}}
dtypes: [float16, bfloat16]
head_dims: [64, 128]
features: {causal: true, block_sparse: false, fp8: false, backward: false, lse: true, gqa: true}
priority: 70
launch: {grid: q_blocks, block_m: 64, block_n: 64, warps: 4}   # one warpgroup; 3 stages: 113 KB at hd128, 2 CTAs an SM
workspace: none
---*/
// FlashAttention forward for Hopper (after FlashAttention-3, sections 3.1-3.2, without the
// producer warpgroup): both products on bf16 / f16 warpgroup tensor-core instructions (wgmma),
// fp32 accumulation, and the softmax of tile j + 1 computed while P_j V_j runs on the tensor cores.
// Inputs in the contract's (batch, seqlen, heads, D) layout, read as they are: K and V tiles share
// one swizzled layout, S = Q K^T reads K K-major and O += P V reads V MN-major (16-bit wgmma's
// transposed B), so there is no V pre-pass. Pipeline: hopper/wgmma_attention.cuh; main loop: hopper/wgmma_mainloop.cuh.
// Output in the input dtype; LSE as every variant; causal via mask types; GQA / MQA.
#include "flashkit/hopper/wgmma_mainloop.cuh"

typedef flashkit::gmma::AttentionTraits<flashkit::Element, FLASHKIT_HEAD_DIM, FLASHKIT_BLOCK_M, FLASHKIT_BLOCK_N,
                                        FLASHKIT_WARPS, flashkit::OutT>
    Traits;

typedef flashkit::DenseMask<FLASHKIT_CAUSAL, Traits::kBlockM, Traits::kBlockN>::type FwdMask;

FLASHKIT_EXPORT_SMEM_BYTES(Traits::kSmemBytes);

extern "C" __global__ void __launch_bounds__(Traits::kThreads, Traits::kCtasPerSm)
    flashkit_hopper_fwd(const flashkit::Params params) {
    const int m_block = blockIdx.x;
    const int head = blockIdx.y;
    const int batch = blockIdx.z;
    const FwdMask mask(params, m_block);
    flashkit::gmma::fwd_block<Traits, FwdMask, flashkit::HopperMainloop<Traits, FwdMask>>(params, mask, m_block,
                                                                                         head, batch);
}
