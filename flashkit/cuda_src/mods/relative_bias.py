"""Python reference of relative_bias.cu (array code; xp is NumPy or CuPy)."""


def score_mod(score, batch, head, q_idx, kv_idx, args):
    """score - slopes[h] |i + seqlen_k - seqlen_q - j| on the scaled score."""
    xp = args.xp
    dist = xp.abs(q_idx + (args.seqlen_k - args.seqlen_q) - kv_idx).astype(score.dtype)
    return score - args.slopes[head].astype(score.dtype) * dist


def sample_args(batch, heads, seqlen_q, seqlen_k, xp, rng):
    """The ALiBi paper's slopes 2^(-8 (h + 1) / heads), jittered."""
    import numpy as np
    slopes = 2.0 ** (-8.0 * (np.arange(heads) + 1) / heads) * (0.5 + rng.random(heads))
    return {"slopes": xp.asarray(slopes.astype(np.float32))}
