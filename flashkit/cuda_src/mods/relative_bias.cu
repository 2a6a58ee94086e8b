/*---
name: relative_bias
kind: modification
summary: relative-position bias - score - slope[head] |i + seqlen_k - seqlen_q - j| (ALiBi's, as a functor)
functions: [score_mod]
bias: true   # the term does not read the score: d score_mod / d score = 1, the backward's dS passes unchanged
args:
  slopes: {kind: pointer, dtype: float32, shape: [heads]}   # args.ptr[0]: one slope per query head
---*/
// A linear relative-position bias per head on the scaled score: ALiBi (Press et al.) with flash-attn's
// bottom-right alignment, the same function as the built-in alibi_slopes, written as a drop-in.
// The distance goes to float through flashkit::index_float (exact below 2^22 keys; an integer add and a
// float add, where a conversion instruction would run at a quarter of their rate).
__device__ __forceinline__ float score_mod(float score, int batch, int head, int q_idx, int kv_idx,
                                           const flashkit::ModArgs& args) {
    const float slope = static_cast<const float*>(args.ptr[0])[head];
    const int dist = q_idx + args.seqlen_k - args.seqlen_q - kv_idx;
    return score - slope * fabsf(flashkit::index_float(dist));
}
