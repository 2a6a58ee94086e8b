"""reference.py: the float64 reference against a naive per-row loop; masks, GQA, the plain implementation."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from flashkit.call.dtypes import BY_NAME
from flashkit.verify.reference import causal_mask, element_mask, plain_attention, reference_attention, rounding_atol


def naive(q, k, v, scale, visible):
    """One query row at a time in Python floats: out (b, sq, h, d) and lse (b, h, sq).

    visible(b, h, i, j) says whether query i of (b, h) sees key j; query head h reads kv head h // (H / Hk).
    """
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    b_, sq, h_, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    out = np.zeros((b_, sq, h_, d))
    lse = np.full((b_, h_, sq), -np.inf)
    for b in range(b_):
        for h in range(h_):
            kvh = h // (h_ // hk)
            for i in range(sq):
                keys = [j for j in range(sk) if visible(b, h, i, j)]
                if not keys:
                    continue
                s = [scale * float(np.dot(q[b, i, h], k[b, j, kvh])) for j in keys]
                m = max(s)
                w = [math.exp(x - m) for x in s]
                total = sum(w)
                lse[b, h, i] = m + math.log(total)
                out[b, i, h] = sum(wj * v[b, j, kvh] for wj, j in zip(w, keys)) / total
    return out, lse


def randn(rng, *shape):
    return rng.standard_normal(shape)


def bottom_right(sq, sk):
    return lambda b, h, i, j: j <= i + sk - sq


SHAPES = [(1, 1, 1, 1, 1, 8), (2, 5, 7, 3, 3, 16), (1, 9, 4, 2, 2, 8), (2, 6, 6, 4, 2, 8), (1, 3, 11, 8, 1, 32)]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("b,sq,sk,h,hk,d", SHAPES, ids=[f"b{s[0]}-sq{s[1]}-sk{s[2]}-h{s[3]}/{s[4]}-d{s[5]}"
                                                     for s in SHAPES])
def test_matches_naive_loop(b, sq, sk, h, hk, d, causal):
    rng = np.random.default_rng(sq * 100 + sk)
    q, k, v = randn(rng, b, sq, h, d), randn(rng, b, sk, hk, d), randn(rng, b, sk, hk, d)
    scale = 0.7 / math.sqrt(d)
    out, lse = reference_attention(q, k, v, scale=scale, causal=causal)
    want_out, want_lse = naive(q, k, v, scale, bottom_right(sq, sk) if causal else (lambda *_: True))
    assert out.dtype == np.float64 and out.shape == (b, sq, h, d)
    assert lse.dtype == np.float64 and lse.shape == (b, h, sq)
    np.testing.assert_allclose(out, want_out, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(want_lse))
    fin = np.isfinite(want_lse)
    np.testing.assert_allclose(lse[fin], want_lse[fin], rtol=1e-12, atol=1e-12)


def test_causal_mask_is_bottom_right_aligned():
    # sq < sk: every row sees the keys up to its diagonal shifted right by sk - sq.
    np.testing.assert_array_equal(causal_mask(2, 4), [[1, 1, 1, 0], [1, 1, 1, 1]])
    # sq > sk: the first sq - sk rows see nothing.
    np.testing.assert_array_equal(causal_mask(4, 2), [[0, 0], [0, 0], [1, 0], [1, 1]])
    np.testing.assert_array_equal(causal_mask(3, 3), np.tril(np.ones((3, 3), dtype=bool)))
    assert causal_mask(1, 5).all()          # one query (decoding) sees every key


@pytest.mark.parametrize("sq,sk", [(3, 8), (8, 3)], ids=["sq<sk", "sq>sk"])
def test_causal_both_ways(sq, sk):
    rng = np.random.default_rng(1)
    q, k, v = randn(rng, 1, sq, 2, 8), randn(rng, 1, sk, 2, 8), randn(rng, 1, sk, 2, 8)
    out, lse = reference_attention(q, k, v, scale=0.3, causal=True)
    for i in range(sq):
        last = i + sk - sq             # the last key row i may see
        if last < 0:
            continue
        kk, vv = k[0, : last + 1], v[0, : last + 1]
        s = 0.3 * np.einsum("hd,khd->hk", q[0, i], kk)
        p = np.exp(s - s.max(-1, keepdims=True))
        want = np.einsum("hk,khd->hd", p / p.sum(-1, keepdims=True), vv)
        np.testing.assert_allclose(out[0, i], want, rtol=1e-12, atol=1e-13)


def test_fully_masked_rows_give_zero_and_minus_inf():
    rng = np.random.default_rng(2)
    sq, sk = 6, 2
    q, k, v = randn(rng, 2, sq, 3, 8), randn(rng, 2, sk, 3, 8), randn(rng, 2, sk, 3, 8)
    out, lse = reference_attention(q, k, v, scale=0.5, causal=True)
    masked = sq - sk                          # rows 0..3 see no key
    assert not np.isnan(out).any() and not np.isnan(lse).any()
    assert (out[:, :masked] == 0).all()
    assert np.isneginf(lse[:, :, :masked]).all()
    assert np.isfinite(lse[:, :, masked:]).all()
    assert (np.abs(out[:, masked:]) > 0).all()


def test_explicit_element_mask():
    rng = np.random.default_rng(3)
    b, sq, sk, h = 2, 5, 7, 2
    mask = rng.random((b, h, sq, sk)) < 0.5
    mask[0, 1, 2] = False                     # one row with nothing visible
    q, k, v = randn(rng, b, sq, h, 8), randn(rng, b, sk, h, 8), randn(rng, b, sk, h, 8)
    out, lse = reference_attention(q, k, v, scale=0.4, mask=mask)
    want_out, want_lse = naive(q, k, v, 0.4, lambda bb, hh, i, j: mask[bb, hh, i, j])
    np.testing.assert_allclose(out, want_out, rtol=1e-12, atol=1e-12)
    assert (out[0, 2, 1] == 0).all() and lse[0, 1, 2] == -np.inf
    # causal and an explicit mask combine (both must allow a key).
    out_c, _ = reference_attention(q, k, v, scale=0.4, causal=True, mask=mask)
    both = mask & causal_mask(sq, sk)[None, None]
    want_c, _ = naive(q, k, v, 0.4, lambda bb, hh, i, j: both[bb, hh, i, j])
    np.testing.assert_allclose(out_c, want_c, rtol=1e-12, atol=1e-12)


def test_element_mask_none_when_nothing_is_masked():
    assert element_mask(4, 4, causal=False) is None
    assert element_mask(4, 6, causal=True).shape == (1, 1, 4, 6)


def test_gqa_head_mapping_is_contiguous_groups():
    """With 8 query heads over 2 kv heads, heads 0-3 read kv head 0 and heads 4-7 read kv head 1."""
    rng = np.random.default_rng(4)
    q = randn(rng, 1, 4, 8, 16)
    k, v = randn(rng, 1, 9, 2, 16), randn(rng, 1, 9, 2, 16)
    out, lse = reference_attention(q, k, v, scale=0.25)
    for h in range(8):
        kvh = h // 4
        one, one_lse = reference_attention(q[:, :, h:h + 1], k[:, :, kvh:kvh + 1], v[:, :, kvh:kvh + 1], scale=0.25)
        np.testing.assert_allclose(out[:, :, h], one[:, :, 0], rtol=1e-13, atol=1e-14)
        np.testing.assert_allclose(lse[:, h], one_lse[:, 0], rtol=1e-13)
    # and not the interleaved mapping h % kv_heads
    wrong, _ = reference_attention(q[:, :, 1:2], k[:, :, 1:2], v[:, :, 1:2], scale=0.25)
    assert not np.allclose(out[:, :, 1], wrong[:, :, 0])


def test_mqa_equals_repeated_heads():
    rng = np.random.default_rng(5)
    q, k, v = randn(rng, 2, 5, 4, 8), randn(rng, 2, 6, 1, 8), randn(rng, 2, 6, 1, 8)
    out, _ = reference_attention(q, k, v, scale=0.3)
    rep, _ = reference_attention(q, np.repeat(k, 4, axis=2), np.repeat(v, 4, axis=2), scale=0.3)
    np.testing.assert_allclose(out, rep, rtol=1e-14)


def test_low_precision_inputs_are_upcast_exactly():
    rng = np.random.default_rng(6)
    q, k, v = (randn(rng, 1, 5, 2, 16).astype(ml_dtypes.bfloat16) for _ in range(3))
    out, _ = reference_attention(q, k, v, scale=0.25)
    want, _ = reference_attention(*(x.astype(np.float64) for x in (q, k, v)), scale=0.25)
    assert out.dtype == np.float64
    np.testing.assert_array_equal(out, want)


def plain_error(dtype_name: str, seed: int = 7, causal: bool = False) -> float:
    dt = BY_NAME[dtype_name]
    rng = np.random.default_rng(seed)
    q, k, v = (randn(rng, 2, s, 4, 64).astype(dt.storage) for s in (33, 65, 65))
    ref, lse_ref = reference_attention(q, k, v, scale=0.125, causal=causal)
    plain, lse_plain = plain_attention(q, k, v, scale=0.125, dtype=dt, causal=causal)
    assert plain.shape == ref.shape
    assert plain.dtype == np.float32 and lse_plain.shape == lse_ref.shape
    assert np.isfinite(plain).all()
    return float(np.abs(plain.astype(np.float64) - ref).max())


@pytest.mark.parametrize("name", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_plain_error_is_positive_and_small(name, causal):
    eps = BY_NAME[name].eps
    err = plain_error(name, causal=causal)
    assert err > 0, "the plain implementation must round like the input dtype"
    assert err < 16 * eps, f"{name}: plain error {err:.3g} is not a few units of {eps:.3g}"


def test_plain_error_orders_by_precision():
    bf16, fp16, fp32 = plain_error("bfloat16"), plain_error("float16"), plain_error("float32")
    assert bf16 > fp16 > fp32 > 0
    assert bf16 < 0.05


def test_plain_outputs_are_representable_in_the_dtype():
    dt = BY_NAME["bfloat16"]
    rng = np.random.default_rng(8)
    q, k, v = (randn(rng, 1, 9, 2, 32).astype(dt.storage) for _ in range(3))
    plain, _ = plain_attention(q, k, v, scale=0.2, dtype=dt)
    np.testing.assert_array_equal(plain, plain.astype(dt.storage).astype(np.float32))


def test_rounding_atol():
    ref = np.array([0.0, 0.1, -0.7, 1.3])
    for name in ("float16", "bfloat16", "float32"):
        dt = BY_NAME[name]
        atol = rounding_atol(ref, dt)
        shifted = (ref + 0.3).astype(dt.compute).astype(np.float64) - 0.3
        assert atol == 2 * np.abs(shifted - ref).max()
        assert 0 < atol <= 2 * 2 * dt.eps * 2    # at most two ulps of values below 2
    assert rounding_atol(np.zeros(0), BY_NAME["float16"]) == 0.0
    assert rounding_atol(ref, BY_NAME["bfloat16"]) > rounding_atol(ref, BY_NAME["float16"])
