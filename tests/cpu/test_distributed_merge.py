"""The exact (O, LSE) merge: partials over disjoint key sets combine to attention over their union."""

from __future__ import annotations

import numpy as np
import pytest

from flashkit.distributed.merge import merge_all, merge_pair, merge_weights
from flashkit.verify.reference import reference_attention


def _split_keys(rng, causal, splits, b=2, n=24, h=4, hk=2, d=16):
    q = rng.standard_normal((b, n, h, d))
    k = rng.standard_normal((b, n, hk, d))
    v = rng.standard_normal((b, n, hk, d))
    scale = 0.37
    full, full_lse = reference_attention(q, k, v, scale=scale, causal=causal)
    parts = []
    bounds = [0, *splits, n]
    for k0, k1 in zip(bounds[:-1], bounds[1:]):
        mask = None
        if causal:   # the full causal mask restricted to keys [k0, k1)
            mask = (np.arange(k0, k1)[None, :] <= np.arange(n)[:, None])[None, None]
        parts.append(reference_attention(q, k[:, k0:k1], v[:, k0:k1], scale=scale, mask=mask))
    return full, full_lse, parts


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("splits", [(12,), (5, 11, 20), (1, 2, 3, 23)])
def test_merge_equals_attention_over_the_union(causal, splits):
    full, full_lse, parts = _split_keys(np.random.default_rng(len(splits)), causal, splits)
    out, lse = merge_all(parts)
    np.testing.assert_allclose(out, full, rtol=0, atol=1e-12)
    np.testing.assert_allclose(lse, full_lse, rtol=0, atol=1e-12)


def test_merge_order_does_not_matter():
    _, _, parts = _split_keys(np.random.default_rng(3), True, (6, 13, 19))
    a, la = merge_all(parts)
    b, lb = merge_all(parts[::-1])
    np.testing.assert_allclose(a, b, atol=1e-12)
    np.testing.assert_allclose(la, lb, atol=1e-12)


def test_rows_that_saw_no_key():
    """-inf on both sides: O stays 0, LSE stays -inf, and no NaN appears; one side -inf takes the other."""
    o_a = np.zeros((1, 3, 1, 4))
    o_b = np.ones((1, 3, 1, 4))
    l_a = np.array([[[-np.inf, -np.inf, 0.5]]])
    l_b = np.array([[[-np.inf, 2.0, -np.inf]]])
    out, lse = merge_pair(o_a, l_a, o_b, l_b)
    assert not np.isnan(out).any() and not np.isnan(lse).any()
    np.testing.assert_array_equal(out[0, :, 0, 0], [0.0, 1.0, 0.0])
    np.testing.assert_array_equal(lse[0, 0], [-np.inf, 2.0, 0.5])
    w_a, w_b, _ = merge_weights(l_a, l_b)
    np.testing.assert_array_equal(w_a + w_b, [[[0.0, 1.0, 1.0]]])


def test_merge_is_fp32_for_16_bit_partials():
    import ml_dtypes
    o = np.random.default_rng(0).standard_normal((1, 4, 2, 8)).astype(ml_dtypes.bfloat16)
    l = np.zeros((1, 2, 4), dtype=np.float32)
    out, lse = merge_pair(o, l, o, l)
    assert out.dtype == np.float32 and lse.dtype == np.float32
    np.testing.assert_array_equal(out, o.astype(np.float32))
    np.testing.assert_allclose(lse, np.log(2.0), rtol=1e-6)


def test_torch_merge_matches_numpy():
    torch = pytest.importorskip("torch", reason="torch is an optional extra: the torch merge path needs it")
    from flashkit.distributed.merge import merge_into
    _, _, parts = _split_keys(np.random.default_rng(7), True, (9, 17))
    want, want_lse = merge_all(parts)
    (o0, l0), *rest = parts
    acc_o, acc_lse = torch.tensor(o0, dtype=torch.float32), torch.tensor(l0, dtype=torch.float32)
    for o, l in rest:   # row subsets too: merge the second half of the rows only, then the first
        n = o.shape[1]
        for r0, r1 in ((n // 2, n), (0, n // 2)):
            path = merge_into(acc_o, acc_lse, torch.tensor(o[:, r0:r1]).to(torch.bfloat16),
                              torch.tensor(l[:, :, r0:r1], dtype=torch.float32), row0=r0)
            assert path == "torch"   # CPU tensors: the fused kernel is for CUDA tensors
    assert acc_o.dtype == torch.float32
    np.testing.assert_allclose(acc_o.numpy(), want, atol=2e-2)   # partials rounded to bf16
    np.testing.assert_allclose(acc_lse.numpy(), want_lse, atol=1e-5)
