"""flashkit.torch's direct path (flashkit/torch_direct.py): a repeated torch signature runs the launch its first call
prepared, with the full path's bits, on the caller's stream, inside a captured CUDA graph too; a neighbouring
signature (strides, alignment, dtype, flags) takes its own path, and invalidating the call cache drops the entries."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")


@pytest.fixture
def fkt():
    import flashkit.torch
    from flashkit.runtime import call_cache
    call_cache.invalidate()
    yield flashkit.torch
    call_cache.invalidate()
    call_cache.CALLS.max_entries = call_cache.MAX_ENTRIES


def _inputs(seed, dtype=torch.bfloat16, q_shape=(2, 300, 8, 64), kv_shape=(2, 257, 2, 64)):
    g = torch.Generator(device="cuda").manual_seed(seed)
    mk = lambda *s: torch.randn(*s, device="cuda", dtype=dtype, generator=g)  # noqa: E731
    return mk(*q_shape), mk(*kv_shape), mk(*kv_shape), mk(*q_shape)


def _run(fkt, q, k, v, dout, **kw):
    """out and (dq, dk, dv) of fkt.attention on fresh leaves over q, k, v's memory (their addresses and strides)."""
    qs, ks, vs = (x.detach().requires_grad_() for x in (q, k, v))
    out = fkt.attention(qs, ks, vs, **kw)
    out.backward(dout)
    return out.detach(), qs.grad, ks.grad, vs.grad


def _full_path(fkt, *args, **kw):
    """_run with nothing cached (every call validates, selects and views its tensors)."""
    from flashkit.runtime import call_cache
    call_cache.invalidate()
    call_cache.CALLS.max_entries = 0
    try:
        return _run(fkt, *args, **kw)
    finally:
        call_cache.CALLS.max_entries = call_cache.MAX_ENTRIES


def _direct_entries():
    from flashkit import torch_direct
    from flashkit.runtime import call_cache
    return [key[0] for key in call_cache.CALLS._entries if key[0] in (torch_direct.FORWARD, torch_direct.BACKWARD)]


def _assert_equal(got, want):
    for a, b in zip(got, want):
        assert torch.equal(a, b)


def _refuse_full_path(fkt, monkeypatch):
    """Make the full path raise: a call that still takes it fails the test."""
    def refuse(*args, **kw):
        raise AssertionError("the full path ran for a signature filed for the direct path")
    monkeypatch.setattr(fkt, "_attention", refuse)
    monkeypatch.setattr(fkt, "_attention_backward", refuse)


def test_a_repeated_signature_runs_directly_with_the_full_paths_bits(fkt, monkeypatch):
    kw = dict(causal=True, deterministic=True)
    _run(fkt, *_inputs(0), **kw)   # the full path, which files the direct entries
    assert sorted(_direct_entries()) == ["torch.attention", "torch.attention_backward"]
    fresh = _inputs(1)
    with monkeypatch.context() as m:
        _refuse_full_path(fkt, m)
        direct = _run(fkt, *fresh, **kw)
    _assert_equal(direct, _full_path(fkt, *fresh, **kw))


def test_direct_calls_run_on_the_callers_stream(fkt):
    """The direct launches queue on torch's current stream: a side stream's result is complete once that stream
    is waited for, with the bits of the same call on the default stream."""
    kw = dict(causal=False, deterministic=True)
    q, k, v, dout = _inputs(2)
    _run(fkt, q, k, v, dout, **kw)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(10_000_000)   # the side stream busy: a launch on another stream would overtake it
        got = _run(fkt, q, k, v, dout, **kw)
    torch.cuda.current_stream().wait_stream(side)
    _assert_equal(got, _run(fkt, q, k, v, dout, **kw))


@pytest.mark.parametrize("change", ["k transposed view", "q misaligned", "float16", "causal", "softmax_scale"])
def test_neighbouring_signatures_take_their_own_path(fkt, change):
    """A call that differs from a filed one in anything the full path reads gives the full path's bits."""
    base = dict(causal=True, deterministic=True)
    q, k, v, dout = _inputs(3)
    _run(fkt, q, k, v, dout, **base)
    _run(fkt, q, k, v, dout, **base)
    kw = dict(base)
    if change == "k transposed view":   # same shape, other strides: (batch, heads, seqlen, d) storage
        k = k.transpose(1, 2).contiguous().transpose(1, 2)
    elif change == "q misaligned":      # 8 bytes past a 16-byte boundary: the full path copies q
        q = torch.empty(q.numel() + 4, device="cuda", dtype=q.dtype)[4:].view(q.shape).copy_(q)
    elif change == "float16":
        q, k, v, dout = (x.half() for x in (q, k, v, dout))
    elif change == "causal":
        kw["causal"] = False
    else:
        kw["softmax_scale"] = 0.3
    got = _run(fkt, q, k, v, dout, **kw)
    _run(fkt, q, k, v, dout, **kw)
    again = _run(fkt, q, k, v, dout, **kw)   # a repeat: direct where the full path left an entry
    want = _full_path(fkt, q, k, v, dout, **kw)
    _assert_equal(got, want)
    _assert_equal(again, want)


def test_alibi_direct_calls_read_each_calls_slopes(fkt, monkeypatch):
    kw = dict(causal=True, deterministic=True)
    q, k, v, dout = _inputs(4)
    slopes = [torch.linspace(0.05, 0.5, 8, device="cuda") * (i + 1) for i in range(2)]
    _run(fkt, q, k, v, dout, alibi_slopes=slopes[0], **kw)
    with monkeypatch.context() as m:
        _refuse_full_path(fkt, m)
        direct = _run(fkt, q, k, v, dout, alibi_slopes=slopes[1], **kw)
    _assert_equal(direct, _full_path(fkt, q, k, v, dout, alibi_slopes=slopes[1], **kw))
    assert not torch.equal(direct[0], _full_path(fkt, q, k, v, dout, alibi_slopes=slopes[0], **kw)[0])


def test_invalidating_the_call_cache_drops_the_direct_entries(fkt):
    from flashkit.runtime import call_cache
    _run(fkt, *_inputs(5), causal=True)
    assert _direct_entries()
    call_cache.invalidate()
    assert not _direct_entries() and len(call_cache.CALLS) == 0


@pytest.mark.parametrize("entry", ["eager", "custom op"])
def test_forward_and_backward_captured_in_a_cuda_graph_replay_like_eager_calls(fkt, entry):
    """Whole-step capture (torch.cuda.graph): the forward and the backward, captured after a warm-up on a side
    stream, replay on new data written into the static inputs with the bits of eager calls on that data."""
    kw = dict(causal=True, deterministic=True)

    def forward(a, b, c):
        if entry == "eager":
            return fkt.attention(a, b, c, **kw)
        return torch.ops.flashkit.attention_fwd(a, b, c, True, None, True)[0]

    q, k, v, dout = _inputs(6)
    qs, ks, vs = (x.clone().requires_grad_() for x in (q, k, v))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):   # warm-up: build, cache and file every signature before the capture
        for _ in range(2):
            forward(qs, ks, vs).backward(dout)
            qs.grad = ks.grad = vs.grad = None
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = forward(qs, ks, vs)
        out.backward(dout)
    fresh = _inputs(7)
    with torch.no_grad():
        for static, new in zip((qs, ks, vs, dout), fresh):
            static.copy_(new)
    graph.replay()
    torch.cuda.synchronize()
    qs2, ks2, vs2 = (x.clone().requires_grad_() for x in fresh[:3])
    want_out = forward(qs2, ks2, vs2)
    want_out.backward(fresh[3])
    _assert_equal((out, qs.grad, ks.grad, vs.grad), (want_out.detach(), qs2.grad, ks2.grad, vs2.grad))


def test_packed_calls_read_a_checked_pair_of_offsets_once(fkt, monkeypatch):
    """transformers hands one cu_seqlens pair to every layer: the first call reads and checks its values, later
    calls with the same unmodified tensors skip the synchronizing read; a pair written in place is read again, and
    a bad value there is refused."""
    import flashkit.varlen
    from flashkit.errors import InputError
    reads = []
    real = flashkit.varlen.check_values
    monkeypatch.setattr(flashkit.varlen, "check_values", lambda *a: (reads.append(1), real(*a)))
    g = torch.Generator(device="cuda").manual_seed(8)
    mk = lambda *s: torch.randn(*s, device="cuda", dtype=torch.bfloat16, generator=g)  # noqa: E731
    q, k, v = mk(300, 8, 64), mk(300, 2, 64), mk(300, 2, 64)
    cu = torch.tensor([0, 100, 300], device="cuda", dtype=torch.int32)
    first = fkt.attention_varlen(q, k, v, cu, cu, 200, 200, causal=True)
    again = fkt.attention_varlen(q, k, v, cu, cu, 200, 200, causal=True)
    assert len(reads) == 1 and torch.equal(first, again)
    fkt.attention_varlen(q, k, v, cu, cu, 250, 250, causal=True)   # other lengths: checked again
    assert len(reads) == 2
    cu[1] = 250   # in place: a sequence of 250 > max_seqlen 200
    with pytest.raises(InputError, match="max_seqlen"):
        fkt.attention_varlen(q, k, v, cu, cu, 200, 200, causal=True)
    assert len(reads) == 3
