/*---
name: block_sparse_hopper
summary: block-sparse forward on the warp-specialized Hopper core (TMA producer, ping-pong wgmma consumers, sm_90a)
entry: flashkit_block_sparse_hopper_fwd
arch: {min: "9.0", max: "9.0", targets: {"9.0": sm_90a}}
dtypes: [float16, bfloat16]
head_dims: {min: 8, max: 256, multiple_of: 8, classes: [64, 96, 128, 192, 256]}
features: {causal: true, block_sparse: true, fp8: false, backward: false, lse: true, gqa: true,
           window: true, chunk: true, softcap: true, alibi: true, score_mod: true}
requires: {block_sparse: true}
priority: 60
launch: {grid: q_blocks, block_m: 128, block_n: 128, warps: 12, stages: 2}   # tiles nest in 128-key mask blocks
overrides: {"hd64": {defer_pv_wait: 1, free_issue: 1}, "hd64/alibi": {stages: 3},
            "hd96": {defer_pv_wait: 1, free_issue: 1}, "hd96/alibi": {free_issue: 0}, "hd96/window": {free_issue: 0},
            "hd96/causal/alibi": {free_issue: 1},
            "hd128": {defer_pv_wait: 1}, "hd128/softcap": {free_issue: 1},
            "hd192": {block_n: 64, defer_pv_wait: 1},
            "hd256": {block_n: 64, free_issue: 1}, "hd256/softcap": {free_issue: 0, max_first: 1}, "hd256/alibi": {max_first: 1}, "hd256/window": {free_issue: 0}}
# defer_pv_wait (ws_mainloop.cuh): measured 2-4% faster at hd128, 2.6-6.0% at hd96 and 0.8-3.7% at hd192 (8k,
# densities 1.0 / 0.5); at hd64 with free_issue 4-12% faster, every modification (softcap, ALiBi, a causal window).
# free_issue (the consumers issue without ping-pong turns), per modification from one A/B at 8k, densities 1.0 / 0.5:
# hd64 (ALiBi on three stages: 8-11%), hd96 but for non-causal ALiBi and the window (1-4%), hd128 softcap (1-2.6%),
# hd256 but for softcap and the window (1-3%); hd192 keeps the turns (1-3.5% slower without). At hd256 softcap's and ALiBi's
# row maxima come before the modification (max_first, ws_mainloop.cuh): softcap 5.8-9.0% faster at 2k and 8k,
# densities 1.0 / 0.5, ALiBi 3.9-10.9% at 8k (the thirty-second session's A/B; ALiBi 2.5-5.9% slower at hd128).
# hd96 and hd192 (fa3's exact head dims; hd192 on 128 x 64 tiles, which nest in the 128-key mask blocks as hd256's
# do) ran on the mma.sync block_sparse before: 1.08-2.31x faster here (BENCHMARKS.md). The other head dims run at
# their class, as fa3's (TMA's out-of-bounds fill, clipped stores): 1.30-2.06x block_sparse at 40-160.
tensor_maps: {q: block_m, k: block_n, v: block_n, o: 64}
workspace: none
---*/
// Block-sparse attention on the Hopper core of fa3.cu (include/flashkit/hopper/ws_forward.cuh):
// the same producer, stage rings, ping-pong consumers and TMA epilogue, driven by the
// BlockSparseMask type (block_sparse.cuh): the producer loads only the K/V tiles of the blocks a
// flashkit.BlockMask keeps for this query block and the call's element mask (FLASHKIT_CAUSAL, FLASHKIT_WINDOW)
// does not hide wholly, and the consumers mask only the tiles that cross a ragged tail, the diagonal or a
// window's edge. softcap / ALiBi (score_mod.cuh) and a drop-in score_mod (functor.cuh) modify the scores as in fa3.cu.
#include "flashkit/block_sparse.cuh"
#include "flashkit/functor.cuh"
#include "flashkit/hopper/ws_forward.cuh"

typedef flashkit::hopper::WsTraits<flashkit::Element, FLASHKIT_HEAD_DIM, FLASHKIT_BLOCK_M, FLASHKIT_BLOCK_N,
                                   FLASHKIT_STAGES>
    Traits;
typedef flashkit::LocalOr<FLASHKIT_WINDOW, Traits::kBlockM, Traits::kBlockN,
                          flashkit::DenseMask<FLASHKIT_CAUSAL, Traits::kBlockM, Traits::kBlockN>::type>::type
    ElementMask;
typedef flashkit::BlockSparseMask<Traits::kBlockM, Traits::kBlockN, ElementMask> FwdMask;
static_assert(FLASHKIT_WARPS * flashkit::kWarpSize == Traits::kThreads, "warps: a producer and kBlockM / 64 consumers");

FLASHKIT_EXPORT_SMEM_BYTES(Traits::kSmemBytes);

extern "C" __global__ void __launch_bounds__(Traits::kThreads, 1)
    flashkit_block_sparse_hopper_fwd(const flashkit::Params params,
                                     const __grid_constant__ flashkit::hopper::TensorMap q_map,
                                     const __grid_constant__ flashkit::hopper::TensorMap k_map,
                                     const __grid_constant__ flashkit::hopper::TensorMap v_map,
                                     const __grid_constant__ flashkit::hopper::TensorMap o_map) {
    const FwdMask mask(params, blockIdx.x, blockIdx.y, blockIdx.z);
    flashkit::hopper::ws_forward<Traits, flashkit::KernelScoreMod>(
        params, {q_map, k_map, v_map, o_map}, mask, blockIdx.x, blockIdx.y, blockIdx.z,
        flashkit::SeqOrigin{0, 0, static_cast<int>(blockIdx.z)});
}
