"""The float64 reference's modifications (local_mask, score_mod), on NumPy, against direct loops."""

from __future__ import annotations

import math

import numpy as np
import pytest

from flashkit.call.dtypes import BY_NAME
from flashkit.verify.reference import local_mask, plain_attention, reference_attention, score_mod


def visible(i, j, sq, sk, left, right, chunk):
    d = i + sk - sq
    ok = (left < 0 or j >= d - left) and (right < 0 or j <= d + right)
    return ok and (chunk == 0 or math.floor(d / chunk) == math.floor(j / chunk))


@pytest.mark.parametrize("sq,sk", [(7, 7), (5, 13), (13, 5), (1, 9)])
@pytest.mark.parametrize("window,chunk", [((-1, -1), 0), ((2, 0), 0), ((0, 3), 0), ((-1, 1), 0), ((-1, -1), 4),
                                          ((3, 0), 4), ((1, 1), 3)])
def test_local_mask_matches_the_definition(sq, sk, window, chunk):
    got = local_mask(sq, sk, window, chunk)
    want = np.array([[visible(i, j, sq, sk, *window, chunk) for j in range(sk)] for i in range(sq)])
    assert got.shape == (sq, sk) and (got == want).all()


def test_causal_is_window_minus_one_zero():
    from flashkit.verify.reference import causal_mask
    for sq, sk in ((5, 9), (9, 5), (6, 6)):
        assert (local_mask(sq, sk, (-1, 0)) == causal_mask(sq, sk)).all()


def test_chunk_before_the_first_key_sees_nothing():
    m = local_mask(6, 2, (-1, -1), 2)   # rows 0-3 have i + off < 0
    assert not m[:4].any() and m[4:].all()


def test_score_mod_softcap_then_alibi():
    s = np.array([[[[0.5, -40.0, 3.0], [1.0, 2.0, 100.0]]]])   # (1, 1, 2, 3)
    slopes = np.array([0.25])
    got = score_mod(2.0, slopes)(s, np)
    dist = np.abs(np.arange(2)[:, None] + 1 - np.arange(3)[None, :])
    want = 2.0 * np.tanh(s / 2.0) - 0.25 * dist
    assert np.allclose(got, want) and np.abs(got[..., :] + 0.25 * dist).max() <= 2.0
    assert score_mod(0.0, None) is None


def naive(q, k, v, scale, cap, slopes, mask):
    b, sq, h, d = q.shape
    sk = k.shape[1]
    out = np.zeros_like(q)
    lse = np.full((b, h, sq), -np.inf)
    for bi in range(b):
        for hi in range(h):
            for i in range(sq):
                s = np.array([scale * q[bi, i, hi] @ k[bi, j, hi] for j in range(sk)])
                if cap:
                    s = cap * np.tanh(s / cap)
                if slopes is not None:
                    sl = slopes[hi] if slopes.ndim == 1 else slopes[bi, hi]
                    s = s - sl * np.abs(i + sk - sq - np.arange(sk))
                s = np.where(mask[i], s, -np.inf)
                if not mask[i].any():
                    continue
                p = np.exp(s - s.max())
                out[bi, i, hi] = p @ v[bi, :, hi] / p.sum()
                lse[bi, hi, i] = s.max() + np.log(p.sum())
    return out, lse


@pytest.mark.parametrize("sq,sk", [(6, 9), (9, 6)])
@pytest.mark.parametrize("per_batch", [False, True])
def test_reference_with_mods_matches_a_loop(sq, sk, per_batch):
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, n, 3, 8)) for n in (sq, sk, sk))
    slopes = rng.uniform(0.1, 1.0, (2, 3) if per_batch else (3,))
    mask = local_mask(sq, sk, (2, 1), 4)
    out, lse = reference_attention(q, k, v, scale=0.3, mask=mask, softcap=1.5, alibi_slopes=slopes)
    want, want_lse = naive(q, k, v, 0.3, 1.5, slopes, mask)
    assert np.allclose(out, want) and np.allclose(lse, want_lse)   # both have -inf rows where nothing is visible
    plain, plain_lse = plain_attention(q.astype(np.float16), k.astype(np.float16), v.astype(np.float16), scale=0.3,
                                       dtype=BY_NAME["float16"], mask=mask, softcap=1.5, alibi_slopes=slopes)
    assert np.nanmax(np.abs(plain - want)) < 0.05 and np.isfinite(plain).all()
