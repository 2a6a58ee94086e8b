"""The float64 reference backward and the plain same-precision backward (NumPy or CuPy, like reference.py).

Layout (batch, seqlen, heads, head_dim); dk and dv summed over each kv head's group of query heads.
"""

from __future__ import annotations

import numpy as np

from ..call.arrays import array_module
from ..call.dtypes import DType
from .reference import element_mask, expand_kv, score_mod


def _attention_grads(q, k, v, dout, scale: float, mask, xp, round_to=None, softcap: float = 0.0, alibi_slopes=None,
                     score_fn=None, score_grad_fn=None):
    """(dq, dk, dv) of softmax(mod(scale q k^T)) v in q's float type; round_to rounds P and dS as a 16-bit kernel
    does. mod: softcap c tanh(s / c) (slope 1 - tanh^2), then ALiBi's bias (slope 1), as reference.score_mod, then
    score_fn(s, xp) (a functor's score_mod), whose slope score_grad_fn(modified score, xp) gives."""
    heads, kv_heads = q.shape[2], k.shape[2]
    r = round_to or (lambda x: x)
    ke, ve = expand_kv(k, heads, xp), expand_kv(v, heads, xp)
    s = xp.einsum("bqhd,bkhd->bhqk", q, ke) * scale
    tanh = None
    if softcap:
        tanh = xp.tanh(s / softcap)
        s = softcap * tanh
    if alibi_slopes is not None:
        s = score_mod(alibi_slopes=alibi_slopes)(s, xp)
    functor_slope = None
    if score_fn is not None:
        s = score_fn(s, xp)
        functor_slope = None if score_grad_fn is None else score_grad_fn(s, xp)   # None: a bias's, 1
    if mask is not None:
        s = xp.where(mask, s, -xp.inf)
    m = s.max(axis=-1, keepdims=True)
    m = xp.where(xp.isfinite(m), m, 0)
    p = xp.exp(s - m)
    l = p.sum(axis=-1, keepdims=True)
    p = r(p / xp.where(l > 0, l, 1))                                   # P (0 on rows that see no key)
    out = r(xp.einsum("bhqk,bkhd->bqhd", p, ve))
    dv = xp.einsum("bhqk,bqhd->bkhd", p, dout)                         # dV = P^T dO
    dp = xp.einsum("bqhd,bkhd->bhqk", dout, ve)                        # dP = dO V^T
    dsum = xp.einsum("bqhd,bqhd->bhq", dout, out)[..., None]           # D = rowsum(dO O)
    ds = p * (dp - dsum)                                               # dS = P (dP - D)
    if functor_slope is not None:                                      # chain rule: the functor's slope, then
        ds = xp.where(p > 0, ds * functor_slope, 0)                    # softcap's (none where P is 0)
    ds = r(ds if tanh is None else ds * (1 - tanh * tanh))             # of the unmodified score
    dq = xp.einsum("bhqk,bkhd->bqhd", ds, ke) * scale
    dk = xp.einsum("bhqk,bqhd->bkhd", ds, q) * scale
    group = heads // kv_heads
    b, sk = dk.shape[:2]
    dk = dk.reshape(b, sk, kv_heads, group, dk.shape[-1]).sum(axis=3)
    dv = dv.reshape(b, sk, kv_heads, group, dv.shape[-1]).sum(axis=3)   # (v's head dim: head_dim_v)
    return r(dq), r(dk), r(dv)


def reference_backward(q, k, v, dout, *, scale: float, causal: bool = False, mask=None, softcap: float = 0.0,
                       alibi_slopes=None, score_fn=None, score_grad_fn=None):
    """float64 (dq, dk, dv) on upcast inputs, the element mask explicit (causal and `mask`, e.g. a window's), the
    modifications (softcap, alibi_slopes (heads,) or (batch, heads)) applied as the forward's reference does."""
    xp = array_module(q)
    q64, k64, v64, do64 = (xp.asarray(x).astype(xp.float64) for x in (q, k, v, dout))
    emask = element_mask(q.shape[1], k.shape[1], causal, mask, xp)
    slopes = None if alibi_slopes is None else xp.asarray(alibi_slopes).astype(xp.float64)
    return _attention_grads(q64, k64, v64, do64, scale, emask, xp, softcap=softcap, alibi_slopes=slopes,
                            score_fn=score_fn, score_grad_fn=score_grad_fn)


def plain_backward(q, k, v, dout, *, scale: float, dtype: DType, causal: bool = False, mask=None,
                   softcap: float = 0.0, alibi_slopes=None, score_fn=None, score_grad_fn=None):
    """The textbook backward in the input precision: fp32 products, P, O, dS and the gradients rounded to `dtype`."""
    xp = array_module(q)
    compute = np.dtype(dtype.compute)

    def round_to(x):
        return x.astype(compute).astype(xp.float32)

    q32, k32, v32, do32 = (round_to(xp.asarray(x).astype(xp.float32)) for x in (q, k, v, dout))
    emask = element_mask(q.shape[1], k.shape[1], causal, mask, xp)
    slopes = None if alibi_slopes is None else xp.asarray(alibi_slopes).astype(xp.float32)
    return _attention_grads(q32, k32, v32, do32, scale, emask, xp, round_to, softcap, slopes, score_fn, score_grad_fn)
