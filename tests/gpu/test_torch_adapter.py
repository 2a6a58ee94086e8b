"""flashkit.torch.attention: the gradients against the float64 reference (DESIGN's rule), eager (the Function)
and under torch.compile(fullgraph=True) (the custom ops), and on a side stream."""

from __future__ import annotations

import math

import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")


def _grads(fn, q, k, v, dout):
    qs, ks, vs = (x.detach().clone().requires_grad_() for x in (q, k, v))
    out = fn(qs, ks, vs)
    out.backward(dout)
    return out.detach(), qs.grad, ks.grad, vs.grad


def _check(grads, q, k, v, dout, causal):
    import cupy as cp
    from flashkit.call.dtypes import BY_NAME
    from flashkit.verify.reference import output_atol
    from flashkit.verify.reference_backward import plain_backward, reference_backward
    ins = tuple(cp.from_dlpack(x.contiguous()) for x in (q, k, v, dout))
    scale = 1 / math.sqrt(q.shape[-1])
    refs = reference_backward(*ins, scale=scale, causal=causal)
    plains = plain_backward(*ins, scale=scale, dtype=BY_NAME["bfloat16"], causal=causal)
    for name, g, ref, plain in zip(("dq", "dk", "dv"), grads, refs, plains):
        g64 = cp.from_dlpack(g.float().contiguous()).astype(cp.float64)
        err = float(cp.abs(g64 - ref).max())
        bound = 2 * float(cp.abs(plain.astype(cp.float64) - ref).max()) + output_atol(ref, BY_NAME["bfloat16"], k.shape[1])
        assert bool(cp.isfinite(g64).all()) and err <= bound, f"{name}: err {err:.3g} > bound {bound:.3g}"


def _inputs(seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    mk = lambda *s: torch.randn(*s, device="cuda", dtype=torch.bfloat16, generator=g)  # noqa: E731
    return mk(2, 300, 8, 64), mk(2, 257, 2, 64), mk(2, 257, 2, 64), mk(2, 300, 8, 64)


@pytest.mark.parametrize("causal", [False, True])
def test_autograd_matches_reference(causal):
    import flashkit.torch as fkt
    q, k, v, dout = _inputs()
    _, *grads = _grads(lambda a, b, c: fkt.attention(a, b, c, causal=causal), q, k, v, dout)
    _check(grads, q, k, v, dout, causal)


def test_torch_compile_fullgraph():
    import flashkit.torch as fkt
    q, k, v, dout = _inputs(1)

    def f(a, b, c):   # deterministic: bit equality of two backward runs needs dQ's adds in a fixed order
        return fkt.attention(a * 1.0, b, c, causal=True, deterministic=True) * 2.0

    compiled = torch.compile(f, fullgraph=True)
    out_c, *grads_c = _grads(compiled, q, k, v, dout)
    out_e, *grads_e = _grads(f, q, k, v, dout)
    assert torch.equal(out_c, out_e)
    for a, b in zip(grads_c, grads_e):
        assert torch.equal(a, b)
    _check([g / 2 for g in grads_c], q, k, v, dout, True)   # f = 2 attention: the gradients of dout, doubled (exact)


def test_runs_on_the_callers_stream():
    import flashkit.torch as fkt
    q, k, v, dout = _inputs(2)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        _, *grads = _grads(lambda a, b, c: fkt.attention(a, b, c), q, k, v, dout)
    torch.cuda.current_stream().wait_stream(side)
    _check(grads, q, k, v, dout, False)


def test_repeated_torch_calls_take_the_call_cache_on_the_callers_stream():
    """Torch tensors are viewed as CuPy arrays before the call (flashkit.torch.cupy_views): the second call of a
    signature is a cache hit, gives the first call's bits on fresh data of the same signature, and runs on the
    caller's current stream."""
    from flashkit.runtime import call_cache
    import flashkit.torch as fkt
    call_cache.invalidate()
    q, k, v, _ = _inputs(3)
    first = fkt.attention(q, k, v, causal=True)
    entries = len(call_cache.CALLS)   # the views' entry, and the same filed for the tensors (torch_direct.py)
    assert entries == 2
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        again = fkt.attention(q, k, v, causal=True)
        fresh_q = torch.randn_like(q)
        fresh = fkt.attention(fresh_q, k, v, causal=True)
    torch.cuda.current_stream().wait_stream(side)
    assert len(call_cache.CALLS) == entries                     # hits, no new entry
    assert torch.equal(first.view(torch.int16), again.view(torch.int16))
    call_cache.invalidate()
    call_cache.CALLS.max_entries = 0
    try:
        full = fkt.attention(fresh_q, k, v, causal=True)          # the full path on the same data
    finally:
        call_cache.CALLS.max_entries = call_cache.MAX_ENTRIES
    assert torch.equal(fresh.view(torch.int16), full.view(torch.int16))


def test_eager_calls_take_the_function_and_match_the_custom_ops_bit_for_bit():
    """Eager calls run _EagerAttention (the ops' implementations without the custom-op dispatch, about 1 ms of host
    time a training call); the custom ops, which torch.compile traces, give the same bits (deterministic dQ)."""
    import flashkit.torch as fkt
    q, k, v, dout = _inputs(4)

    def eager(a, b, c):
        return fkt.attention(a, b, c, causal=True, deterministic=True)

    def op(a, b, c):
        return torch.ops.flashkit.attention_fwd(a, b, c, True, None, True)[0]

    assert type(eager(q.clone().requires_grad_(), k, v).grad_fn).__name__ == "_EagerAttentionBackward"
    for a, b in zip(_grads(eager, q, k, v, dout), _grads(op, q, k, v, dout)):
        assert torch.equal(a, b)


def test_eager_varlen_calls_match_the_custom_ops_bit_for_bit():
    import flashkit.torch as fkt
    g = torch.Generator(device="cuda").manual_seed(5)
    mk = lambda *s: torch.randn(*s, device="cuda", dtype=torch.bfloat16, generator=g)  # noqa: E731
    q, k, v, dout = mk(300, 8, 64), mk(300, 2, 64), mk(300, 2, 64), mk(300, 8, 64)
    cu = torch.tensor([0, 100, 300], device="cuda", dtype=torch.int32)

    def eager(a, b, c):
        return fkt.attention_varlen(a, b, c, cu, cu, 200, 200, causal=True, deterministic=True)

    def op(a, b, c):
        return torch.ops.flashkit.attention_varlen_fwd(a, b, c, cu, cu, 200, 200, True, None, True)[0]

    assert type(eager(q.clone().requires_grad_(), k, v).grad_fn).__name__ == "_EagerVarlenAttentionBackward"
    for a, b in zip(_grads(eager, q, k, v, dout), _grads(op, q, k, v, dout)):
        assert torch.equal(a, b)


def test_eager_backward_runs_twice_on_a_retained_graph():
    """The eager Function keeps the forward's views for the backward as long as the graph: a retained graph's
    second backward adds the same gradients again (deterministic dQ: exactly twice the first)."""
    import flashkit.torch as fkt
    q, k, v, dout = _inputs(6)
    qs, ks, vs = (x.detach().clone().requires_grad_() for x in (q, k, v))
    out = fkt.attention(qs, ks, vs, causal=True, deterministic=True)
    out.backward(dout, retain_graph=True)
    first = [x.grad.clone() for x in (qs, ks, vs)]
    out.backward(dout)
    for g, x in zip(first, (qs, ks, vs)):
        assert torch.equal(x.grad, g * 2)
