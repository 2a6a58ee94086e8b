/*---
name: fa3
summary: FlashAttention-3 forward on Hopper (sm_90a) - TMA producer warp, ping-pong consumer warpgroups on wgmma
entry: flashkit_fa3_fwd
arch: {min: "9.0", max: "9.0", targets: {"9.0": sm_90a}}
dtypes: [float16, bfloat16]
head_dims: {min: 8, max: 256, multiple_of: 8, classes: [64, 96, 128, 192, 256]}
# A head dim below its class (80 at 96, 200 at 256) needs nothing of the kernel: the tensor maps describe the arrays'
# own last dims, so TMA's out-of-bounds fill zeroes the class's extra columns and its O store clips them (a packed
# sequence's last rows, stored by the threads, stop at params.head_dim_v: tma_epilogue.cuh). 1.5-2.6x fa2 at hd40-200
# on the H200 (BENCHMARKS.md); at hd32 0.98-1.08x.
features: {causal: true, block_sparse: false, fp8: false, backward: false, lse: true, gqa: true,
           window: true, chunk: true, softcap: true, alibi: true, varlen: true,
           score_mod: true, mask_mod: true, head_dim_v: true}
priority: 80
launch: {grid: tiles, persistent: 1, defer_pv_wait: 1, block_m: 128, block_n: 128, warps: 12, stages: 2}   # 1 producer + block_m / 64 consumers
# Tile shapes from a measured sweep (BENCHMARKS.md); a score modification at hd64 needs the 240
# registers of two consumers. hd96 runs 192 x 112 tiles on three consumers (6% faster at 8k than 128 x 128), and
# 128 x 128 on two with a window, ALiBi or a functor (three consumers spill). Causal calls of up to 2048 query rows
# (hd96) and 1024 (hd64) run 128 x 128 on two persistent consumers (22% / 30% faster at 1k: short causal rows are
# mostly diagonal tiles, and the persistent loop hides each tile's prologue and epilogue; at hd64 three stages, 1-2%
# faster there), and so do non-causal hd64 calls of up to 1024 rows (192-row tiles leave a third of 1024 rows' last
# tile idle: 12% faster at 512, 2% at 1k). The three-consumer tiles run persistent up to 4096 rows: 2-8% faster at
# 1-4k (hd64 causal 2k 3% faster than on 128 x 128), the same or 1% slower from 8k, but hd96 causal 4% faster
# persistent at 8k (the same at 16k). They fit the persistent loop
# since its epilogue takes a fresh thread index and three consumers a warp-uniform consumer index (ws_forward.cuh).
# hd256 runs one tile a CTA. Drop-in functors run persistent at hd96 and mask_mods at hd128 (4-9% faster, the document
# mask most), one tile a CTA elsewhere: hd128's score_mods measured the same either way, hd192's 1-10% slower
# persistent. A consumer waits for each P V at the top of its next visit (defer_pv_wait, ws_mainloop.cuh): measured
# 3-15% faster at hd96/128/192 on two consumers, 1-3% slower at hd64/256; not for packed sequences at hd128 (ptxas
# spills). On 192-row tiles a causal consumer passes by the key tiles none of its rows sees (pass_unseen,
# ws_mainloop.cuh; compiled where block_m > block_n): 1.1-4.7% faster at hd64 / hd96 from 4k. At hd192 / hd256
# (128 x 64 tiles) the two consumers issue without the ping-pong turns (free_issue): 0.2-3% faster, and hd256's
# pass-by 1.3-1.7% more causal (with the turns it lost 1-2%); drop-in functors keep the turns there (ptxas spills them
# without). hd64's two-consumer tables (short calls, softcap) issue freely too: 2-7% faster. At hd128 free issue
# measured +0.6 to +2.7% causal in one run, -1.3 to +0.6% in another, and 5% slower with ALiBi: the turns stay; three
# consumers (hd64, hd96) lose 2-8% without them. Remeasured on the persistent loop's fresh epilogue index (two A/Bs):
# dense hd128 issues freely, 1.8-2.9% faster causal from 2k, 0.3-0.9% non-causal; its modified builds keep the turns
# (free: softcap 5.5% slower non-causal, a score_mod 3.5% and a mask_mod 2% causal, ALiBi and the window 1%), but
# causal softcap, 2.5% faster free.
# hd64's two-consumer tables of the modifications (softcap, ALiBi, score_mod and mask_mod functors) defer the P V wait
# and issue freely: 5-19% faster with softcap, 2-10% with ALiBi, 1-11% with the shipped functors, at 2k and 8k (the
# thirtieth session's A/B; block_sparse_hopper's hd64 found it first).
# Non-causal softcap at hd64 runs on the three consumers (3-7% faster from 8k, the same at 2-4k); causal softcap keeps
# the two (three lost 3% at 2-4k, gained 2-4% from 8k). At hd256 softcap's and ALiBi's consumers take each row's max
# before the modification (max_first, ws_mainloop.cuh: softcap 5-8% faster, ALiBi 4-14%; slower at the other head
# dims). (The thirty-second session's A/B.)
overrides: {"hd64": {block_m: 192, warps: 16, persistent: 0, defer_pv_wait: 0, pass_unseen: 1}, "hd64/alibi": &hd64_two {block_m: 128, warps: 12, free_issue: 1, defer_pv_wait: 1},
            "hd64/causal/softcap": *hd64_two, "hd64/score_mod": *hd64_two,
            "hd64/mask_mod": *hd64_two,
            "hd64/seqlen_q<=4096": {persistent: 1}, "hd96/seqlen_q<=4096": {persistent: 1},
            "hd64/seqlen_q<=1024": {block_m: 128, warps: 12, persistent: 1, defer_pv_wait: 1, free_issue: 1},
            "hd64/causal/seqlen_q<=1024": {block_m: 128, warps: 12, persistent: 1, defer_pv_wait: 1, stages: 3, free_issue: 1},
            "hd96": {block_m: 192, block_n: 112, warps: 16, persistent: 0, defer_pv_wait: 0, pass_unseen: 1},
            "hd96/causal/seqlen_q<=8192": {persistent: 1},
            "hd96/causal/seqlen_q<=2048": &hd96_narrow {block_m: 128, block_n: 128, warps: 12, persistent: 1, defer_pv_wait: 1},
            "hd96/window": *hd96_narrow, "hd96/alibi": *hd96_narrow,
            "hd96/score_mod": *hd96_narrow, "hd96/mask_mod": *hd96_narrow,
            "hd96/score_mod+window": {persistent: 0}, "hd96/mask_mod+window": {persistent: 0},
            "hd128": {free_issue: 1}, "hd128/window": &hd128_turns {free_issue: 0}, "hd128/softcap": *hd128_turns,
            "hd128/alibi": *hd128_turns, "hd128/mask_mod": *hd128_turns, "hd128/causal/softcap": {free_issue: 1},
            "hd128/varlen": {defer_pv_wait: 0, free_issue: 0}, "hd128/score_mod": {persistent: 0, free_issue: 0},
            "hd192": {block_n: 64, free_issue: 1}, "hd192/score_mod": {persistent: 0, free_issue: 0}, "hd192/mask_mod": {persistent: 0, free_issue: 0},
            "hd256": {block_n: 64, persistent: 0, defer_pv_wait: 0, pass_unseen: 1, free_issue: 1},
            "hd256/score_mod": {free_issue: 0, pass_unseen: 0}, "hd256/mask_mod": {free_issue: 0, pass_unseen: 0},
            "hd256/softcap": &hd256_max_first {max_first: 1}, "hd256/alibi": *hd256_max_first}
tensor_maps: {q: block_m, k: block_n, v: block_n, o: 64}   # box rows; o: one consumer's 64 rows
workspace: none
---*/
// FlashAttention-3's forward (sections 3.1-3.2 of the paper) on the warp-specialized Hopper core
// (include/flashkit/hopper/): a producer warp streams Q, K and V with TMA through mbarrier stage
// rings; consumer warpgroups of 64 query rows run S = Q K^T and O += P V on wgmma, their softmax
// under each other's products (ping-pong) and under their own P V; O leaves by TMA store.
// This file picks the mask (causal or none; with FLASHKIT_WINDOW the local mask of window_size /
// attention_chunk), the score modification (softcap / ALiBi, score_mod.cuh) and the tile order
// (causal: heaviest blocks first); with FLASHKIT_VARLEN each batch entry is a packed sequence (varlen.cuh).
// With `persistent` (FLASHKIT_PERSISTENT) one CTA an SM walks its share of the tiles (tile_scheduler.cuh).
// With FLASHKIT_HEAD_DIM_V (head_dim_v), V and O have a head dim of their own, below Q's and K's (ws_traits.cuh).
#include "flashkit/functor.cuh"
#include "flashkit/hopper/ws_forward.cuh"

// V and O of FLASHKIT_HEAD_DIM_V (traits.cuh: FLASHKIT_HEAD_DIM unless the call's head_dim_v differs).
// Persistent: O staged in a tile of its own, so that the next tile's Q loads under this tile's last P V.
typedef flashkit::hopper::WsTraits<flashkit::Element, FLASHKIT_HEAD_DIM, FLASHKIT_BLOCK_M, FLASHKIT_BLOCK_N,
                                   FLASHKIT_STAGES, FLASHKIT_HEAD_DIM_V, FLASHKIT_PERSISTENT != 0>
    Traits;
typedef flashkit::LocalOr<FLASHKIT_WINDOW, Traits::kBlockM, Traits::kBlockN,
                          flashkit::DenseMask<FLASHKIT_CAUSAL, Traits::kBlockM, Traits::kBlockN>::type>::type BaseMask;
// A drop-in functor's mask_mod on top (functor.cuh).
typedef flashkit::MaskFunctorOr<FLASHKIT_MASK_MOD, Traits::kBlockM, Traits::kBlockN, BaseMask>::type FwdMask;
FLASHKIT_FUNCTOR_ENTRIES(BaseMask, Traits::kBlockM, Traits::kBlockN)
static_assert(FLASHKIT_WARPS * flashkit::kWarpSize == Traits::kThreads, "warps: a producer and kBlockM / 64 consumers");

FLASHKIT_EXPORT_SMEM_BYTES(Traits::kSmemBytes);

extern "C" __global__ void __launch_bounds__(Traits::kThreads, 1)
    flashkit_fa3_fwd(const flashkit::Params params, const __grid_constant__ flashkit::hopper::TensorMap q_map,
                     const __grid_constant__ flashkit::hopper::TensorMap k_map,
                     const __grid_constant__ flashkit::hopper::TensorMap v_map,
                     const __grid_constant__ flashkit::hopper::TensorMap o_map) {
    typedef flashkit::hopper::ScheduledTiles<FwdMask, Traits::kBlockM, FLASHKIT_CAUSAL != 0, FLASHKIT_VARLEN != 0> Tiles;
    flashkit::hopper::ws_forward_tiles<Traits, flashkit::KernelScoreMod>({q_map, k_map, v_map, o_map}, Tiles{params});
}
