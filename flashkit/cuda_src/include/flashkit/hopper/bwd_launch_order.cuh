// Which key block a CTA of the Hopper backward's main kernel takes: its launch index, reordered for causal calls.
// The main kernel runs one CTA an SM, and a causal key block's work falls with its index (key block n is seen by the
// queries at and below its diagonal: the first is the heaviest). In launch order (key blocks fastest) the last wave
// holds heavy blocks that start late and run alone, the tail that costs most where the grid is a few waves (short
// sequences, GQA's kv heads). Heaviest first over the whole grid measured slower at 2-4k (the CTAs running together
// then belong to different heads, and share no Q, dO or dq_accum lines in L2), so the order is heaviest first
// within groups of (batch, kv head) pairs about one wave wide: a group's key blocks 0 of every pair, then 1, ...
#pragma once

namespace flashkit {
namespace hopper {

struct BwdTile {
    int n_block, kv_head, batch;
};

// The CTAs a group spans: about one wave of the one-CTA-an-SM main kernel (132 SMs on the H100 and H200).
constexpr int kBwdOrderWaveCtas = 132;

// kHeaviestFirst: reorder (a causal build whose launch asks for it); otherwise the launch order.
template <bool kHeaviestFirst, int kWaveCtas = kBwdOrderWaveCtas>
__device__ __forceinline__ BwdTile bwd_launch_order() {
    if constexpr (!kHeaviestFirst) {
        return {int(blockIdx.x), int(blockIdx.y), int(blockIdx.z)};
    } else {
        const int blocks = gridDim.x, heads = gridDim.y, pairs = gridDim.y * gridDim.z;
        const int linear = blockIdx.x + blocks * (blockIdx.y + heads * blockIdx.z);
        const int group_pairs = max(1, kWaveCtas / blocks);
        const int first = linear / (group_pairs * blocks) * group_pairs;   // the group's first (batch, kv head) pair
        const int size = min(group_pairs, pairs - first);                  // the last group may be smaller
        const int index = linear - first * blocks;                          // in [0, size x blocks)
        const int pair = first + index % size;
        return {index / size, pair % heads, pair / heads};
    }
}

}  // namespace hopper
}  // namespace flashkit
