"""features/mod_mask.py on the GPU: a ModMask gives the functor-by-name call's bits (forward on fa3 and causal, the
backward's deterministic gradients) while classifying once per geometry; it is a snapshot until refresh(); a call
on another stream than the classifying one waits for the classification.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


def _inputs(b, s, h, hk, hd, seed):
    import cupy as cp
    rs = cp.random.RandomState(seed)
    return tuple(rs.standard_normal((b, s, n, hd), dtype=cp.float32).astype(cp.float16) for n in (h, hk, hk, h))


def _same_bits(a, b) -> bool:
    import cupy as cp
    return bool((a.view(cp.uint16) == b.view(cp.uint16)).all())


@pytest.fixture
def classified(monkeypatch):
    """How many times a mask_mod classifier was launched (forward tiles and backward lists)."""
    from flashkit.features import bwd_lists, functors
    counts = []
    real = functors.launch_classifier

    def counting(*a, **k):
        counts.append(1)
        return real(*a, **k)
    monkeypatch.setattr(functors, "launch_classifier", counting)
    monkeypatch.setattr(bwd_lists, "launch_classifier", counting)
    return counts


@pytest.mark.parametrize("variant", ["fa3", "causal"])
def test_a_mask_gives_the_functor_calls_bits_and_classifies_once(variant, classified):
    import cupy as cp
    import flashkit
    from flashkit.runtime.device import device_info
    from flashkit.registry import discover_kernels
    if not discover_kernels().specs[variant].runs_on(device_info().cc):
        pytest.skip(f"{variant} does not run on this GPU")
    b, s, h, hk, hd = 2, 1100, 8, 2, 128
    q, k, v, dout = _inputs(b, s, h, hk, hd, 3)
    ids = (cp.arange(s, dtype=cp.int32) * 5 // s)[None].repeat(b, 0)
    ids[1] = (cp.arange(s, dtype=cp.int32) * 3 // s)
    by_name = {"mod": "document", "mod_args": {"doc_ids": ids}}
    mask = flashkit.ModMask("document", {"doc_ids": ids})
    want = flashkit.attention(q, k, v, causal=True, variant=variant, **by_name)
    before = len(classified)
    for _ in range(3):   # the full path, then the cached one twice
        got = flashkit.attention(q, k, v, causal=True, variant=variant, mod=mask)
        assert _same_bits(got, want)
    assert len(classified) - before == 1 and len(mask) == 1
    if variant != "fa3" or not discover_kernels().specs["fa3_bwd"].runs_on(device_info().cc):
        return
    out, lse = flashkit.attention(q, k, v, causal=True, return_lse=True, mod=mask)
    want_grads = flashkit.attention_backward(dout, q, k, v, out, lse, causal=True, deterministic=True, **by_name)
    before = len(classified)
    for _ in range(2):
        grads = flashkit.attention_backward(dout, q, k, v, out, lse, causal=True, deterministic=True, mod=mask)
        for name, a, w in zip(("dq", "dk", "dv"), grads, want_grads):
            assert _same_bits(a, w), name
    assert len(classified) - before == 1   # the backward's lists: built once, on the first call


def test_a_mask_is_a_snapshot_until_refresh():
    """Ids rewritten in place: the mask keeps its tiles (one document: the keys of the other half are still
    visited, and masked by the element test only where the tile is partial), refresh() classifies them anew."""
    import cupy as cp
    import flashkit
    b, s, h, hd = 1, 1024, 4, 64
    q, k, v, _ = _inputs(b, s, h, h, hd, 5)
    ids = cp.zeros((b, s), dtype=cp.int32)
    mask = flashkit.ModMask("document", {"doc_ids": ids})
    flashkit.attention(q, k, v, causal=True, mod=mask)
    ids[:, s // 2:] = 1
    two = flashkit.attention(q, k, v, causal=True, mod="document", mod_args={"doc_ids": ids})
    stale = flashkit.attention(q, k, v, causal=True, mod=mask)
    assert not _same_bits(stale, two)   # full tiles across the documents: no element mask was applied there
    mask.refresh()
    assert _same_bits(flashkit.attention(q, k, v, causal=True, mod=mask), two)


def test_a_call_on_another_stream_waits_for_the_classification():
    """The first call classifies on a stream kept busy by matrix products; the next, on another stream, reads the
    kept tiles after the classification (features/mod_mask.order_after), and gives the first call's bits."""
    import cupy as cp
    import flashkit
    b, s, h, hd = 2, 4096, 8, 128
    q, k, v, _ = _inputs(b, s, h, h, hd, 7)
    ids = (cp.arange(s, dtype=cp.int32) * 7 // s)[None].repeat(b, 0)
    want = flashkit.attention(q, k, v, causal=True, mod="document", mod_args={"doc_ids": ids})
    x = cp.random.RandomState(1).standard_normal((4096, 4096), dtype=cp.float32)
    busy, other = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    for trial in range(3):
        mask = flashkit.ModMask("document", {"doc_ids": ids})
        cp.cuda.Device().synchronize()
        with busy:
            for _ in range(8):
                x = x @ x * (1.0 / 64)
            flashkit.attention(q, k, v, causal=True, mod=mask)
        with other:
            got = flashkit.attention(q, k, v, causal=True, mod=mask)
        other.synchronize()
        assert _same_bits(got, want), f"trial {trial}"


def test_a_scalar_mask_by_name_classifies_once_and_follows_its_arguments(classified):
    """prefix_lm by name keeps its tiles under the call's signature: a repeat classifies nothing and gives the same
    bits as a ModMask; another prefix classifies anew and masks by its own prefix (the float64 reference)."""
    import cupy as cp
    import numpy as np
    import flashkit
    from flashkit.verify.reference import reference_attention
    b, s, h, hd = 1, 700, 4, 64
    q, k, v, _ = _inputs(b, s, h, h, hd, 5)
    for prefix in (200, 333):
        call = {"mod": "prefix_lm", "mod_args": {"prefix": prefix}}
        before = len(classified)
        outs = [flashkit.attention(q, k, v, **call) for _ in range(3)]
        assert len(classified) - before == 1
        assert all(_same_bits(o, outs[0]) for o in outs)
        assert _same_bits(flashkit.attention(q, k, v, mod=flashkit.ModMask("prefix_lm", {"prefix": prefix})), outs[0])
        rows, cols = np.arange(s)[:, None], np.arange(s)[None, :]
        mask = cp.asarray((cols < prefix) | (cols <= rows))
        ref, _ = reference_attention(q, k, v, scale=hd ** -0.5, mask=mask)
        assert float(cp.abs(outs[0].astype(cp.float64) - cp.asarray(ref)).max()) < 2e-3
