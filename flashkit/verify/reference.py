"""The float64 reference with an explicit element mask, and the plain same-precision implementation.

Both work on NumPy or CuPy arrays (the module of the inputs), layout (batch, seqlen, heads, head_dim).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..call.arrays import array_module
from ..call.dtypes import FLOAT32, DType

FLOAT32_EPS = FLOAT32.eps


def causal_mask(seqlen_q: int, seqlen_k: int, xp=np):
    """Bottom-right aligned: query i sees key j iff j <= i + seqlen_k - seqlen_q. Shape (seqlen_q, seqlen_k)."""
    i = xp.arange(seqlen_q)[:, None]
    j = xp.arange(seqlen_k)[None, :]
    return j <= i + (seqlen_k - seqlen_q)


def local_mask(seqlen_q: int, seqlen_k: int, window: tuple[int, int] = (-1, -1), chunk: int = 0, xp=np):
    """window_size / attention_chunk (flash-attn, FA3): i + off - left <= j <= i + off + right, same chunk.

    off = seqlen_k - seqlen_q; -1 leaves a side unbounded; chunks by floor division (a row with
    i + off < 0 lies in no key's chunk). Shape (seqlen_q, seqlen_k).
    """
    diag = xp.arange(seqlen_q)[:, None] + (seqlen_k - seqlen_q)
    j = xp.arange(seqlen_k)[None, :]
    out = xp.ones((seqlen_q, seqlen_k), dtype=bool)
    if window[0] >= 0:
        out &= j >= diag - window[0]
    if window[1] >= 0:
        out &= j <= diag + window[1]
    if chunk > 0:
        out &= xp.floor_divide(diag, chunk) == xp.floor_divide(j, chunk)
    return out


def score_mod(softcap: float = 0.0, alibi_slopes=None):
    """The scaled-score modification s -> c tanh(s / c), then - slope |i + off - j|; None when neither is asked."""
    if not softcap and alibi_slopes is None:
        return None

    def mod(s, xp):
        if softcap:
            s = softcap * xp.tanh(s / softcap)
        if alibi_slopes is not None:
            sq, sk = s.shape[-2], s.shape[-1]
            dist = xp.abs(xp.arange(sq)[:, None] + (sk - sq) - xp.arange(sk)[None, :]).astype(s.dtype)
            slopes = xp.asarray(alibi_slopes).astype(s.dtype)
            slopes = slopes[None] if slopes.ndim == 1 else slopes   # (batch or 1, heads)
            s = s - slopes[:, :, None, None] * dist
        return s

    return mod


def element_mask(seqlen_q: int, seqlen_k: int, causal: bool, mask: Any = None, xp=np):
    """The explicit boolean mask, broadcastable to (batch, heads, seqlen_q, seqlen_k); None means all visible."""
    out = causal_mask(seqlen_q, seqlen_k, xp)[None, None] if causal else None
    if mask is not None:
        out = mask if out is None else (out & mask)
    return out


def expand_kv(x, heads: int, xp):
    """Repeat kv heads so that query head h reads kv head h // (heads // kv_heads)."""
    group = heads // x.shape[2]
    return xp.repeat(x, group, axis=2) if group > 1 else x


def _softmax_attention(q, k, v, scale: float, mask, xp, round_to=None, mod=None):
    """softmax(scale q k^T) v in q's float type; round_to rounds S and P as a same-precision kernel would."""
    heads = q.shape[2]
    if k.shape[1] == 0:   # no keys: every row is a row that sees none (O = 0, LSE = -inf)
        b, sq = q.shape[:2]
        return xp.zeros((b, sq, heads, v.shape[-1]), dtype=q.dtype), xp.full((b, heads, sq), -xp.inf)
    k, v = expand_kv(k, heads, xp), expand_kv(v, heads, xp)
    s = xp.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if round_to is not None:
        s = round_to(s)
    if mod is not None:   # on the scaled scores, before the mask (rounded again as a same-precision kernel would)
        s = mod(s, xp)
        if round_to is not None:
            s = round_to(s)
    if mask is not None:
        s = xp.where(mask, s, -xp.inf)
    m = s.max(axis=-1, keepdims=True)
    m_safe = xp.where(xp.isfinite(m), m, 0)
    p = xp.exp(s - m_safe)
    l = p.sum(axis=-1, keepdims=True)
    lse = xp.where(l > 0, m_safe + xp.log(xp.where(l > 0, l, 1)), -xp.inf)[..., 0]
    p = p / xp.where(l > 0, l, 1)
    if round_to is not None:
        p = round_to(p)
    out = xp.einsum("bhqk,bkhd->bqhd", p, v)
    return out, lse


def with_score_fn(mod, score_fn):
    """The built-in modification (or None), then score_fn(s, xp) (a functor's score_mod), on scaled scores."""
    if score_fn is None:
        return mod
    if mod is None:
        return score_fn
    return lambda s, xp: score_fn(mod(s, xp), xp)


def reference_attention(q, k, v, *, scale: float, causal: bool = False, mask=None, softcap: float = 0.0,
                        alibi_slopes=None, score_fn=None):
    """float64 attention on upcast inputs. Returns (out (b, sq, h, d), lse (b, h, sq)); masked rows give 0, -inf.

    score_fn(s, xp) modifies the scaled scores (b, h, sq, sk) after softcap / ALiBi (a functor's score_mod)."""
    xp = array_module(q)
    q64, k64, v64 = (xp.asarray(x).astype(xp.float64) for x in (q, k, v))
    emask = element_mask(q.shape[1], k.shape[1], causal, mask, xp)
    slopes = None if alibi_slopes is None else xp.asarray(alibi_slopes).astype(xp.float64)
    return _softmax_attention(q64, k64, v64, scale, emask, xp, mod=with_score_fn(score_mod(softcap, slopes), score_fn))


def plain_attention(q, k, v, *, scale: float, dtype: DType, causal: bool = False, mask=None, softcap: float = 0.0,
                    alibi_slopes=None, score_fn=None):
    """The textbook computation in the input precision: fp32 products, S and P rounded to `dtype`."""
    xp = array_module(q)
    compute = np.dtype(dtype.compute)

    def round_to(x):
        return x.astype(compute).astype(xp.float32)

    q32, k32, v32 = (round_to(xp.asarray(x)) if x.dtype != compute else x.astype(xp.float32) for x in (q, k, v))
    emask = element_mask(q.shape[1], k.shape[1], causal, mask, xp)
    slopes = None if alibi_slopes is None else xp.asarray(alibi_slopes).astype(xp.float32)
    out, lse = _softmax_attention(q32, k32, v32, scale, emask, xp, round_to,
                                  with_score_fn(score_mod(softcap, slopes), score_fn))
    return round_to(out), lse


def rounding_atol(ref, dtype: DType) -> float:
    """The input dtype's rounding at the output's scale (FlashAttention-3's 2*max|(ref + 0.3 - 0.3) - ref|)."""
    xp = array_module(ref)
    compute = np.dtype(dtype.compute)
    shifted = (ref + 0.3).astype(compute).astype(xp.float64) - 0.3
    return 2.0 * float(xp.abs(shifted - ref).max()) if ref.size else 0.0


def output_atol(ref, dtype: DType, reduction_len: int) -> float:
    """The rule's absolute term: the input dtype's rounding plus fp32 accumulation over reduction_len terms."""
    return rounding_atol(ref, dtype) + accumulation_atol(ref, reduction_len)


def accumulation_atol(ref, reduction_len: int) -> float:
    """fp32 accumulation's rounding over a length-n sum, eps32 * sqrt(n) * max|ref|.

    Every kernel accumulates in fp32 in its own order, which no plain implementation can mirror; for
    16-bit inputs this term is far below the input rounding, for float32 inputs it is what remains.
    """
    xp = array_module(ref)
    fin = xp.isfinite(ref)
    scale = float(xp.abs(xp.where(fin, ref, 0)).max()) if ref.size else 0.0
    return FLOAT32_EPS * math.sqrt(reduction_len) * max(1.0, scale)
