/*---
name: prefix_lm
kind: modification
summary: prefix-LM mask - bidirectional over the first `prefix` keys, causal after them
functions: [mask_mod]
mask_varies: []               # the same mask for every sequence and head
args:
  prefix: {kind: int}         # args.ints[0]: keys [0, prefix) are visible to every query
---*/
// A prefix LM (T5's and UL2's): the prompt attends bidirectionally, the continuation causally. Query i
// (at key position i + seqlen_k - seqlen_q) sees key j iff j < prefix or j <= i + off. Call it with
// causal=False: the mask holds the causal part, and the tiles above the diagonal past the prefix are
// never loaded.
__device__ __forceinline__ bool mask_mod(int batch, int head, int q_idx, int kv_idx, const flashkit::ModArgs& args) {
    return kv_idx < args.ints[0] || kv_idx <= q_idx + args.seqlen_k - args.seqlen_q;
}
