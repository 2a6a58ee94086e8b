"""The per-signature call cache on a real device: a repeated call gives the same bits as the first (full-path)
call, the cached path stays correct on fresh data and on neighbouring signatures, and workspaces are per stream."""

from __future__ import annotations

import pytest

import flashkit
from flashkit.registry import discover_kernels
from flashkit.runtime import call_cache
from flashkit.verify.decode import DecodeCase, decode_check
from flashkit.verify.dense import dense_check
from flashkit.verify.harness import Shape

pytestmark = pytest.mark.gpu


@pytest.fixture
def cp():
    import cupy
    call_cache.invalidate()
    yield cupy
    call_cache.invalidate()


def _qkv(cp, shape, kv_shape=None, seed=0):
    import ml_dtypes
    rng = cp.random.default_rng(seed)
    kv_shape = kv_shape or shape
    return tuple(rng.standard_normal(s, dtype=cp.float32).astype(ml_dtypes.bfloat16) for s in (shape, kv_shape, kv_shape))


def _bits(x):
    return x.view(x.dtype.itemsize == 2 and "uint16" or "uint32").get()


@pytest.mark.parametrize("shape,kv_shape,kw", [
    ((1, 1, 1, 64), None, {}),                                            # a tiny call: decode
    ((1, 1, 8, 128), (1, 1024, 8, 128), {"return_lse": True}),            # decode, split over the keys
    ((2, 300, 4, 64), (2, 300, 2, 64), {"causal": True}),                 # fa3 (sm_90) / fa2, GQA
    ((1, 129, 2, 128), None, {"window_size": (16, 0), "return_lse": True}),
], ids=["tiny", "decode-split", "prefill-causal-gqa", "window"])
def test_repeated_call_is_bit_identical_to_the_first(cp, shape, kv_shape, kw):
    import numpy as np
    q, k, v = _qkv(cp, shape, kv_shape)
    first = flashkit.attention(q, k, v, **kw)
    assert len(call_cache.CALLS) == 1
    repeats = [flashkit.attention(q, k, v, **kw) for _ in range(3)]
    cp.cuda.Device().synchronize()
    for r in repeats:
        for a, b in zip(first if isinstance(first, tuple) else (first,), r if isinstance(r, tuple) else (r,)):
            np.testing.assert_array_equal(_bits(a), _bits(b))


def test_alibi_cached_calls_read_each_calls_slopes(cp):
    """ALiBi through the cache: a later call with other slopes (same signature) gives the bits of a full-path call
    with those slopes, not the first call's."""
    import numpy as np
    q, k, v = _qkv(cp, (2, 300, 4, 64), (2, 300, 2, 64), seed=5)
    slopes = [cp.asarray(np.linspace(0.05, 0.5, 4) * (i + 1), dtype=cp.float32) for i in range(2)]
    flashkit.attention(q, k, v, causal=True, alibi_slopes=slopes[0])
    cached = flashkit.attention(q, k, v, causal=True, alibi_slopes=slopes[1])
    assert len(call_cache.CALLS) == 1
    call_cache.invalidate()
    call_cache.CALLS.max_entries = 0
    try:
        full = flashkit.attention(q, k, v, causal=True, alibi_slopes=slopes[1])
        first = flashkit.attention(q, k, v, causal=True, alibi_slopes=slopes[0])
    finally:
        call_cache.CALLS.max_entries = call_cache.MAX_ENTRIES
    np.testing.assert_array_equal(_bits(cached), _bits(full))
    assert not np.array_equal(_bits(cached), _bits(first))


def test_cached_path_on_fresh_data_and_neighbouring_signatures(cp):
    """dense_check twice per shape (the second run takes the cached path, with new inputs and a new poisoned out)."""
    specs = discover_kernels().specs
    from flashkit.runtime.device import device_info
    chosen = flashkit.explain(dtype="bfloat16", head_dim=64, seqlen_q=200, seqlen_k=333, heads=4,
                              kv_heads=2, cc=device_info().cc).chosen
    for shape, causal in ((Shape(2, 200, 333, 4, 2), False), (Shape(2, 201, 333, 4, 2), True),
                          (Shape(1, 17, 1000, 8, 1), False), (Shape(1, 200, 333, 4, 4), False)):
        check = dense_check(specs[chosen.name], shape, 64, "bfloat16", causal)
        for seed in (0, 1):
            res = check.run(seed)
            assert res.passed, f"{res.label} seed {seed}: err {res.max_error:.3g} > bound {res.bound:.3g}; {res.note}"
    assert len(call_cache.CALLS) == 4


def test_cached_kvcache_path_stays_correct(cp):
    spec = discover_kernels().get("decode")
    for case in (DecodeCase(4, 1, 1000, 8, 2, cache=True), DecodeCase(2, 1, 700, 8, 8, page_size=64, cache=True),
                 DecodeCase(2, 1, 300, 4, 1, cache=True, seqlen_new=1)):
        check = decode_check(spec, case, 128, "bfloat16", False)
        for seed in (0, 1, 2):
            res = check.run(seed)
            assert res.passed, f"{res.label} seed {seed}: err {res.max_error:.3g} > bound {res.bound:.3g}; {res.note}"


def test_kvcache_repeat_is_bit_identical_with_new_lengths(cp):
    import numpy as np
    q, kc, vc = _qkv(cp, (3, 1, 8, 128), (3, 2048, 2, 128))
    outs = []
    for n in (100, 2000, 100):
        lens = cp.full((3,), n, dtype=cp.int32)
        outs.append(flashkit.attention_with_kvcache(q, kc, vc, cache_seqlens=lens))
    call_cache.invalidate()
    fresh = flashkit.attention_with_kvcache(q, kc, vc, cache_seqlens=cp.full((3,), 100, dtype=cp.int32))
    np.testing.assert_array_equal(_bits(outs[0]), _bits(outs[2]))
    np.testing.assert_array_equal(_bits(outs[0]), _bits(fresh))
    assert not np.array_equal(_bits(outs[0]), _bits(outs[1]))


def test_workspaces_on_two_streams_are_apart(cp):
    """Split-KV partials in a cached workspace: calls on two streams at once must not share it."""
    import numpy as np
    q1, kc, vc = _qkv(cp, (1, 1, 8, 128), (1, 4096, 8, 128), seed=1)
    q2 = _qkv(cp, (1, 1, 8, 128), seed=2)[0]
    lens = cp.full((1,), 4096, dtype=cp.int32)
    want1 = flashkit.attention_with_kvcache(q1, kc, vc, cache_seqlens=lens)
    want2 = flashkit.attention_with_kvcache(q2, kc, vc, cache_seqlens=lens)
    s1, s2 = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    cp.cuda.Device().synchronize()
    got = []
    for _ in range(20):
        with s1:
            a = flashkit.attention_with_kvcache(q1, kc, vc, cache_seqlens=lens)
        with s2:
            b = flashkit.attention_with_kvcache(q2, kc, vc, cache_seqlens=lens)
        got.append((a, b))
    cp.cuda.Device().synchronize()
    for a, b in got:
        np.testing.assert_array_equal(_bits(a), _bits(want1))
        np.testing.assert_array_equal(_bits(b), _bits(want2))


@pytest.mark.parametrize("causal", [False, True])
def test_varlen_repeat_is_bit_identical_with_new_offsets(cp, causal):
    """attention_varlen and its backward on the cached path with other offsets of the same signature: the same bits
    as the full path given those offsets (the cache emptied), and other bits than the first offsets gave; a
    bad offset beside a cached signature is still refused (check_indices)."""
    import numpy as np
    from flashkit.errors import InputError
    total, seq = 1200, 600
    q, k, v = (x[0] for x in _qkv(cp, (1, total, 8, 128), (1, total, 2, 128)))
    dout = _qkv(cp, (1, total, 8, 128), seed=1)[0][0]
    offsets = [cp.asarray(o, dtype=cp.int32) for o in ([0, 600, 1200], [0, 100, 1200], [0, 600, 1200])]

    def run(cu):
        out, lse = flashkit.attention_varlen(q, k, v, cu, cu, seq + 500, seq + 500, causal=causal, return_lse=True)
        grads = flashkit.attention_varlen_backward(dout, q, k, v, out, lse, cu, cu, seq + 500, seq + 500,
                                                   causal=causal, deterministic=True)
        return [_bits(x) for x in (out, lse, *grads)]
    runs = [run(cu) for cu in offsets]
    call_cache.invalidate()
    fresh = run(offsets[1])
    for a, b in zip(runs[1], fresh):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(runs[0], runs[2]):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(runs[0][0], runs[1][0])
    with pytest.raises(InputError, match="cu_seqlens_q: expected non-decreasing offsets"):
        flashkit.attention_varlen(q, k, v, cp.asarray([0, 1250, 1200], dtype=cp.int32), offsets[0], seq + 500,
                                  seq + 500, causal=causal, return_lse=True)
