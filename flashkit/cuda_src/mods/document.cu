/*---
name: document
kind: modification
summary: document (packed-sequence) mask - a query sees only the keys of its own document
functions: [mask_mod]
mask_varies: [batch]          # the ids differ per sequence of the batch, not per head
args:
  doc_ids: {kind: pointer, dtype: int32, shape: [batch, seqlen_k]}   # args.ptr[0]: each key's document id
---*/
// Packed sequences: several documents share one row of the batch, and attention must not cross them.
// doc_ids[b, j] is the document of key j; query i sits at key position i + seqlen_k - seqlen_q (the
// bottom-right alignment of causal), so it sees key j iff doc_ids[b, i + off] == doc_ids[b, j].
// Combine with causal=True for packed causal LM training. Tiles spanning no document boundary run
// unmasked; tiles between two documents are never loaded.
__device__ __forceinline__ bool mask_mod(int batch, int head, int q_idx, int kv_idx, const flashkit::ModArgs& args) {
    const int* doc = static_cast<const int*>(args.ptr[0]) + static_cast<long long>(batch) * args.seqlen_k;
    const int q_pos = q_idx + args.seqlen_k - args.seqlen_q;   // the query's position among the keys
    return q_pos >= 0 && doc[q_pos] == doc[kv_idx];
}
