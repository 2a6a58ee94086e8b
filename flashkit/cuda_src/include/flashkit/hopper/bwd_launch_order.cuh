// Which key block a CTA of the Hopper backward's main kernel takes: its launch index, reordered for causal calls.
// The main kernel runs one CTA an SM, and a causal key block's work falls with its index (key block n is seen by the
// queries at and below its diagonal: the first is the heaviest). In launch order (key blocks fastest) the last wave
// holds heavy blocks that start late and run alone, the tail that costs most where the grid is a few waves (short
// sequences, GQA's kv heads). The order is heaviest first within groups of Params.bwd.order_pairs (batch, kv head)
// pairs: a group's key blocks 0 of every pair, then 1, ... The host picks the group size per call by simulating the
// schedule (flashkit/runtime/bwd_order.py): larger groups balance better, smaller ones keep the CTAs that run
// together on a few heads, sharing Q, dO and dq_accum lines in L2.
#pragma once

namespace flashkit {
namespace hopper {

struct BwdTile {
    int n_block, kv_head, batch;
};

// kHeaviestFirst: reorder (a causal build whose launch asks for it) in groups of order_pairs pairs (1 or less: the
// launch order, key blocks fastest); otherwise the launch order.
template <bool kHeaviestFirst>
__device__ __forceinline__ BwdTile bwd_launch_order(int order_pairs) {
    if constexpr (!kHeaviestFirst) {
        return {int(blockIdx.x), int(blockIdx.y), int(blockIdx.z)};
    } else {
        const int blocks = gridDim.x, heads = gridDim.y, pairs = gridDim.y * gridDim.z;
        const int linear = blockIdx.x + blocks * (blockIdx.y + heads * blockIdx.z);
        const int group_pairs = max(1, order_pairs);
        const int first = linear / (group_pairs * blocks) * group_pairs;   // the group's first (batch, kv head) pair
        const int size = min(group_pairs, pairs - first);                  // the last group may be smaller
        const int index = linear - first * blocks;                          // in [0, size x blocks)
        const int pair = first + index % size;
        return {index / size, pair % heads, pair / heads};
    }
}

}  // namespace hopper
}  // namespace flashkit
