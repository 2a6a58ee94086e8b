/*---
name: fa3_fp8
summary: FP8 (e4m3) FlashAttention-3 forward on the warp-specialized Hopper core (TMA producer, two e4m3 wgmma consumer warpgroups, sm_90a)
entry: [flashkit_fa3_fp8_vt, flashkit_fa3_fp8_fwd]
arch: {min: "9.0", max: "9.0", targets: {"9.0": sm_90a}}
dtypes: [float8_e4m3]
head_dims: [64, 128, 256]
features: {causal: true, block_sparse: false, fp8: true, backward: false, lse: true, gqa: true}
requires: {fp8: true}
priority: 70
launch: {grid: [kv_tiles, tiles], persistent: 1, defer_pv_wait: 1, pass_unseen: 1, block_m: 128, block_n: 128, warps: 12, stages: 2}   # 1 producer + block_m / 64 consumers
overrides: {"hd64": {block_m: 192, warps: 16}, "hd64/causal/seqlen_q<=1024": {block_m: 128, warps: 12, stages: 3},
            "hd128": {block_m: 192, warps: 16, defer_pv_wait: 0, serial_pv: 1},
            "hd128/causal/seqlen_q<=2048": {block_m: 128, warps: 12, serial_pv: 0, defer_pv_wait: 1},
            "hd256": {block_n: 128, defer_pv_wait: 0, serial_pv: 1},
            "hd256/causal/seqlen_q<=2048": {block_n: 64, serial_pv: 0, defer_pv_wait: 1}}   # measured (BENCHMARKS.md)
# serial_pv (ws_mainloop.cuh: each P V waited for before the next S, so that S and P are never live together) frees
# the registers of two wider tables. hd128 on three consumers of 160 registers (192 x 128; with the overlap they
# spilled 604 B): 11-14% faster than two consumers non-causal at 2-16k, causal 1.5% at 4k and 6-9% from 8k: the
# softmax's latency chains (BENCHMARKS.md: the fp8 visit is latency-bound) get a third warp a scheduler to hide them.
# hd256 on 128-key tiles (they spilled 96-152 B), persistent: 3.8-6.4% faster than 64-key tiles non-causal, causal
# -0.3 to +1.5% from 4k: on 64-key tiles S = Q K^T (m64n64k32) reads 4 KB of shared memory every 32 tensor cycles,
# the SM's 128 B a cycle; on 128 keys 6 KB every 64. Causal calls of up to 2048 rows keep the two-consumer /
# 64-key tables (0.7% / 1.4% faster there). At hd64 (three consumers already) the serial order measured 3-4% slower.
# hd64 causal calls of up to 1024 rows run 128 x 128 on two consumers, three stages: 10% faster at 1k (3% slower at
# 2k), the short causal rows being mostly diagonal tiles, as fa3's.
# defer_pv_wait (ws_mainloop.cuh): measured 1-3% faster from 8k keys at every head dim, within 1% at 2k.
# pass_unseen (ws_mainloop.cuh; hd64's 192-row and hd256's 64-key tiles): causal 1.9-3.3% faster from 4k.
tensor_maps: {q: block_m, k: block_n, o: 64, vt: head_dim}   # vt: the workspace's V^T, a box of a tile's keys x every row
workspace: v_transposed
---*/
// FlashAttention-3's FP8 forward (section 3.3 of the paper) on the warp-specialized Hopper core of fa3.cu
// (include/flashkit/hopper/ws_forward.cuh): the same producer, stage rings, consumer warpgroups, persistent
// scheduler and TMA epilogue, with the e4m3 main loop of hopper/fp8_ws_mainloop.cuh (its consumers issue without
// the ping-pong turns: FreeIssue). Inputs as the fp8
// variants: e4m3 q, k, v in the contract's layout with float32 scales per (batch, head, block of rows);
// output float16 or bfloat16 (FLASHKIT_OUT_DTYPE), LSE as every variant. Two entries:
//   flashkit_fa3_fp8_vt    V -> Vt (head-dim rows of keys, per kv head) in the workspace: e4m3 wgmma reads
//                          its B operand K-major only (hopper/v_transpose.cuh, keys in fp8.cuh's PvKeys order)
//   flashkit_fa3_fp8_fwd   the attention; the producer streams Q, K and Vt tiles by TMA
#include "flashkit/hopper/fp8_ws_mainloop.cuh"
#include "flashkit/hopper/v_transpose.cuh"
#include "flashkit/hopper/ws_forward.cuh"

// O of 16-bit OutT: twice an e4m3 row's bytes, staged in a tile of its own.
typedef flashkit::hopper::WsTraits<flashkit::float8_e4m3_t, FLASHKIT_HEAD_DIM, FLASHKIT_BLOCK_M, FLASHKIT_BLOCK_N,
                                   FLASHKIT_STAGES, FLASHKIT_HEAD_DIM, true, flashkit::OutT>
    Traits;
typedef flashkit::DenseMask<FLASHKIT_CAUSAL, Traits::kBlockM, Traits::kBlockN>::type FwdMask;
static_assert(FLASHKIT_WARPS * flashkit::kWarpSize == Traits::kThreads, "warps: a producer and kBlockM / 64 consumers");

FLASHKIT_EXPORT_SMEM_BYTES(Traits::kSmemBytes);
FLASHKIT_EXPORT_ENTRY_SMEM_BYTES(flashkit_fa3_fp8_vt, (flashkit::transpose_v_smem_bytes<flashkit::float8_e4m3_t, Traits::kHeadDim,
                                                                           Traits::kBlockN>()));   // one staged V tile

extern "C" __global__ void __launch_bounds__(Traits::kThreads)
    flashkit_fa3_fp8_vt(const flashkit::Params params) {
    extern __shared__ __align__(16) unsigned char staging[];
    flashkit::transpose_v_block<flashkit::float8_e4m3_t, flashkit::fp8::PvKeys, Traits::kHeadDim, Traits::kBlockN,
                                Traits::kThreads>(params, staging, blockIdx.x, blockIdx.y, blockIdx.z);
}

// Kernel arguments after Params: the tensor maps in the manifest's order (q, k, o, vt).
extern "C" __global__ void __launch_bounds__(Traits::kThreads, 1)
    flashkit_fa3_fp8_fwd(const flashkit::Params params, const __grid_constant__ flashkit::hopper::TensorMap q_map,
                         const __grid_constant__ flashkit::hopper::TensorMap k_map,
                         const __grid_constant__ flashkit::hopper::TensorMap o_map,
                         const __grid_constant__ flashkit::hopper::TensorMap vt_map) {
    typedef flashkit::hopper::ScheduledTiles<FwdMask, Traits::kBlockM, FLASHKIT_CAUSAL != 0, false> Tiles;
    flashkit::hopper::ws_forward_tiles<Traits, flashkit::NoScoreMod, Tiles, flashkit::fp8::WsMainloop>(
        {q_map, k_map, vt_map, o_map}, Tiles{params});
}
