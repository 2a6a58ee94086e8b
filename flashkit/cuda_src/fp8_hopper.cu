/*---
name: fp8_hopper
summary: FP8 (e4m3) FlashAttention forward on Hopper warpgroup products (wgmma e4m3, sm_90a)
entry: [flashkit_fp8_hopper_vt, flashkit_fp8_hopper_fwd]
arch: {min: "9.0", max: "9.0", targets: {"9.0": sm_90a}}
dtypes: [float8_e4m3]
head_dims: [64, 128, 256]
features: {causal: true, block_sparse: false, fp8: true, backward: false, lse: true, gqa: true}
requires: {fp8: true}
priority: 60
launch: {grid: [kv_tiles, q_blocks], block_m: 64, block_n: 128, warps: 4}   # one warpgroup, 2 CTAs an SM
overrides: {"hd256": {block_n: 64}}   # 128 O registers a thread at hd256: smaller S tiles
workspace: v_transposed
---*/
// FP8 FlashAttention forward for Hopper (after FlashAttention-3 section 3.3): both products on
// e4m3 warpgroup tensor-core instructions (wgmma, 2x the bf16 rate), fp32 accumulation.
// Inputs as the fp8 variant: e4m3 q, k, v in the contract's (batch, seqlen, heads, D) layout with
// float32 scales per (batch, head, block of rows). Two entries:
//   flashkit_fp8_hopper_vt    V -> Vt (D x keys per kv head) in the workspace: e4m3 wgmma takes
//                             K-major operands only (hopper/v_transpose.cuh, keys in fp8.cuh's PvKeys order)
//   flashkit_fp8_hopper_fwd   the attention (hopper/wgmma_attention.cuh's pipeline, hopper/fp8_wgmma_mainloop.cuh)
// Output float16 or bfloat16 (FLASHKIT_OUT_DTYPE); LSE as every variant; causal via mask types.
#include "flashkit/hopper/fp8_wgmma_mainloop.cuh"
#include "flashkit/hopper/v_transpose.cuh"

typedef flashkit::fp8::WgmmaTraits<FLASHKIT_HEAD_DIM, FLASHKIT_BLOCK_M, FLASHKIT_BLOCK_N, FLASHKIT_WARPS,
                                   flashkit::OutT>
    Traits;

typedef flashkit::DenseMask<FLASHKIT_CAUSAL, Traits::kBlockM, Traits::kBlockN>::type FwdMask;

FLASHKIT_EXPORT_SMEM_BYTES(Traits::kSmemBytes);
FLASHKIT_EXPORT_ENTRY_SMEM_BYTES(flashkit_fp8_hopper_vt, (flashkit::transpose_v_smem_bytes<flashkit::float8_e4m3_t, Traits::kHeadDim,
                                                                           Traits::kBlockN>()));   // one staged V tile

extern "C" __global__ void __launch_bounds__(Traits::kThreads)
    flashkit_fp8_hopper_vt(const flashkit::Params params) {
    extern __shared__ __align__(16) unsigned char staging[];
    flashkit::transpose_v_block<flashkit::float8_e4m3_t, flashkit::fp8::PvKeys, Traits::kHeadDim, Traits::kBlockN,
                                Traits::kThreads>(params, staging, blockIdx.x, blockIdx.y, blockIdx.z);
}

extern "C" __global__ void __launch_bounds__(Traits::kThreads, Traits::kCtasPerSm)
    flashkit_fp8_hopper_fwd(const flashkit::Params params) {
    const int m_block = blockIdx.x;
    const int head = blockIdx.y;
    const int batch = blockIdx.z;
    const FwdMask mask(params, m_block);
    flashkit::gmma::fwd_block<Traits, FwdMask, flashkit::fp8::WgmmaMainloop<Traits, FwdMask>>(params, mask, m_block,
                                                                                             head, batch);
}
