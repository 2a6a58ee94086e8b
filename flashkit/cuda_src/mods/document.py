"""Python reference of document.cu (array code; xp is NumPy or CuPy): same-document mask."""


def mask_mod(batch, head, q_idx, kv_idx, args):
    """Query i sees key j iff doc_ids[b, i + seqlen_k - seqlen_q] == doc_ids[b, j]."""
    xp, doc = args.xp, args.doc_ids
    q_pos = q_idx + (args.seqlen_k - args.seqlen_q)
    same = doc[batch, xp.clip(q_pos, 0, args.seqlen_k - 1)] == doc[batch, kv_idx]
    return (q_pos >= 0) & same


def sample_args(batch, heads, seqlen_q, seqlen_k, xp, rng):
    """Random document boundaries per sequence (1 to 6 documents of random lengths)."""
    import numpy as np
    ids = np.zeros((batch, seqlen_k), dtype=np.int32)
    for b in range(batch):
        cuts = np.sort(rng.choice(np.arange(1, max(seqlen_k, 2)), size=min(rng.integers(0, 6), seqlen_k - 1),
                                  replace=False)) if seqlen_k > 1 else []
        for c in cuts:
            ids[b, c:] += 1
    return {"doc_ids": xp.asarray(ids)}
