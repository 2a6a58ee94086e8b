"""A sequence of flashkit calls with caller-provided outputs captured in a CUDA graph and replayed: ten decode
steps (split-KV over a paged cache, each step its own query, lengths and output) and a prefill call, replayed
bit-identical to the same calls run eagerly, and replayed again on fresh inputs written into the same buffers."""

from __future__ import annotations

import pytest

import flashkit

pytestmark = pytest.mark.gpu
STEPS = 10


def _bf16(cp, rng, *shape):
    import ml_dtypes
    return rng.standard_normal(shape, dtype=cp.float32).astype(ml_dtypes.bfloat16)


def _bits(x):
    return x.view("uint16").get()


def test_ten_decode_steps_replay_like_eager_calls():
    import cupy as cp
    rng = cp.random.default_rng(0)
    batch, heads, kv_heads, d, page, pages = 4, 16, 2, 128, 64, 40
    k_cache, v_cache = (_bf16(cp, rng, batch * pages, page, kv_heads, d) for _ in range(2))
    table = cp.argsort(rng.random(batch * pages)).astype(cp.int32).reshape(batch, pages)
    qs = [_bf16(cp, rng, batch, 1, heads, d) for _ in range(STEPS)]
    lens = [cp.asarray([1000 + 37 * i, 2500 - 11 * i, 17 + i, 2559], dtype=cp.int32) for i in range(STEPS)]
    q_pre, k_pre, v_pre = _bf16(cp, rng, 2, 300, heads, d), _bf16(cp, rng, 2, 300, kv_heads, d), _bf16(cp, rng, 2, 300, kv_heads, d)

    def step(i, outs):
        flashkit.attention_with_kvcache(qs[i], k_cache, v_cache, cache_seqlens=lens[i], block_table=table,
                                        causal=True, out=outs[i], check_indices=False)

    def prefill(out):
        flashkit.attention(q_pre, k_pre, v_pre, causal=True, out=out)

    stream = cp.cuda.Stream(non_blocking=True)
    eager = [cp.empty_like(q) for q in qs]
    graphed = [cp.full_like(q, cp.nan) for q in qs]
    eager_pre, graphed_pre = cp.empty_like(q_pre), cp.full_like(q_pre, cp.nan)
    cp.cuda.Device().synchronize()   # the inputs were written on the legacy stream, which `stream` does not wait for
    with stream:
        for i in range(STEPS):   # eager, and the warm-up that builds, loads and caches every signature
            step(i, eager)
        prefill(eager_pre)
        stream.synchronize()
        stream.begin_capture()
        for i in range(STEPS):
            step(i, graphed)
        prefill(graphed_pre)
        graph = stream.end_capture()
    assert all(bool(cp.isnan(g.astype(cp.float32)).all()) for g in graphed), "capture must not run the kernels"
    graph.launch(stream)
    stream.synchronize()
    for i in range(STEPS):
        assert (_bits(graphed[i]) == _bits(eager[i])).all(), f"decode step {i}"
    assert (_bits(graphed_pre) == _bits(eager_pre)).all(), "prefill"

    # A replay reads whatever the captured buffers hold now: new queries and lengths, same addresses, written on
    # `stream` itself (a non-blocking stream does not wait for the legacy stream's writes: seen racing under load).
    with stream:
        for i in range(STEPS):
            qs[i][...] = _bf16(cp, rng, batch, 1, heads, d)
            lens[i][...] = cp.asarray([5, 2559, 700 + i, 64], dtype=cp.int32)
        graph.launch(stream)
        stream.synchronize()
        for i in range(STEPS):
            step(i, eager)
        stream.synchronize()
    for i in range(STEPS):
        assert (_bits(graphed[i]) == _bits(eager[i])).all(), f"decode step {i} after new inputs"
