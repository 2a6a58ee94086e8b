/*---
name: fp8
summary: FP8 (e4m3) FlashAttention forward with block scales (mma.sync m16n8k32 e4m3, sm_89+)
entry: flashkit_fp8_fwd
arch: {min: "8.9"}
dtypes: [float8_e4m3]
head_dims: [64, 128, 256]
features: {causal: true, block_sparse: false, fp8: true, backward: false, lse: true, gqa: true}
requires: {fp8: true}
priority: 50
launch: {grid: q_blocks, block_m: 128, block_n: 64, warps: 8}
overrides: {"hd256": {block_n: 32}}   # 128 O registers a thread at hd256: smaller S tiles
workspace: none
---*/
// FP8 FlashAttention forward (after FlashAttention-3 section 3.3, on mma.sync for sm_89+).
// Inputs: q, k, v as e4m3 bit patterns in the contract's (batch, seqlen, heads, D) layout, with
// float32 scales per (batch, head, block of scale_block_rows rows): real value = e4m3 * scale
// (flashkit/features/fp8.py quantize_fp8 makes them, with optional Hadamard incoherent processing).
// Both products run on e4m3 tensor cores with fp32 accumulation:
//   S = Q K^T, descaled per (row, K tile) by q_scale * k_scale, folded into the softmax scale;
//   P = 448 exp(S - m) quantized to e4m3 (the factor 448 cancels in O / l);
//   O += P V with O kept in units of the current tile's V scale, applied in the epilogue.
// V is transposed to K-major in shared memory (no 8-bit ldmatrix.trans), see fp8.cuh.
// Output float16 or bfloat16 (FLASHKIT_OUT_DTYPE); LSE as every variant; causal via mask types.
#include "flashkit/sm80/fp8_mainloop.cuh"

typedef flashkit::fp8::Fp8Traits<FLASHKIT_HEAD_DIM, FLASHKIT_BLOCK_M, FLASHKIT_BLOCK_N, FLASHKIT_WARPS,
                                 flashkit::OutT>
    Traits;

typedef flashkit::DenseMask<FLASHKIT_CAUSAL, Traits::kBlockM, Traits::kBlockN>::type FwdMask;

FLASHKIT_EXPORT_SMEM_BYTES(Traits::kSmemBytes);

extern "C" __global__ void __launch_bounds__(Traits::kThreads, 1)
    flashkit_fp8_fwd(const flashkit::Params params) {
    const int m_block = blockIdx.x;
    const int head = blockIdx.y;
    const int batch = blockIdx.z;
    const FwdMask mask(params, m_block);
    flashkit::fp8::fwd_block<Traits, FwdMask>(params, mask, m_block, head, batch);
}
