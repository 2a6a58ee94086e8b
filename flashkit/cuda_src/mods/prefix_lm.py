"""Python reference of prefix_lm.cu (array code; xp is NumPy or CuPy)."""


def mask_mod(batch, head, q_idx, kv_idx, args):
    """Key j is visible to query i iff j < prefix or j <= i + seqlen_k - seqlen_q."""
    return (kv_idx < args.prefix) | (kv_idx <= q_idx + (args.seqlen_k - args.seqlen_q))


def sample_args(batch, heads, seqlen_q, seqlen_k, xp, rng):
    """A prefix somewhere inside the keys (odd, so that it cuts tiles)."""
    return {"prefix": int(rng.integers(0, seqlen_k + 1)) | 1}
