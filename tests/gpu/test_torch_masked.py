"""flashkit.torch.attention with block_mask=, mod= / mod_args= (torch_masked.py): the output and the gradients are
flashkit.attention's and attention_backward's on the same inputs, bit for bit (deterministic backward), for a
ModMask, a functor by name with a torch tensor argument, a block mask (alone, with a window, softcap and ALiBi, with a
score_mod functor) and a score_mod with its derivative; a
score_mod without one runs without a gradient and is refused, before the forward, with one; the call works inside a
torch.compile'd function with fullgraph=True (the custom ops masked_attention_fwd / _bwd), also with a new mask
each call and with a score_mod refused for want of its derivative.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")


def _inputs(seed=0, b=2, s=1000, h=8, hk=2, d=128):
    g = torch.Generator(device="cuda").manual_seed(seed)
    mk = lambda *shape: torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=g)  # noqa: E731
    return mk(b, s, h, d), mk(b, s, hk, d), mk(b, s, hk, d), mk(b, s, h, d)


def _require_backward():
    from flashkit.registry import discover_kernels
    from flashkit.runtime.device import device_info
    if not discover_kernels().specs["fa3_bwd"].runs_on(device_info().cc):
        pytest.skip("the masked backward runs on fa3_bwd (sm_90)")


def _same(a: torch.Tensor, b) -> bool:
    import cupy as cp
    return bool((cp.from_dlpack(a.detach().contiguous()).view(cp.uint16) == b.view(cp.uint16)).all())


def _doc_ids(b, s):
    ids = (torch.arange(s, device="cuda", dtype=torch.int32) * 5 // s)[None].repeat(b, 1)
    ids[-1] = torch.arange(s, device="cuda", dtype=torch.int32) * 3 // s
    return ids.contiguous()


def _torch_and_cupy(call_torch, call_kw: dict, seed: int):
    """(out, dq, dk, dv) through flashkit.torch and through the CuPy API, on the same inputs."""
    import cupy as cp
    import flashkit
    q, k, v, dout = _inputs(seed)
    leaves = tuple(x.clone().requires_grad_() for x in (q, k, v))
    out = call_torch(*leaves)
    out.backward(dout)
    cq, ck, cv, cdout = (cp.from_dlpack(x) for x in (q, k, v, dout))
    ref, lse = flashkit.attention(cq, ck, cv, return_lse=True, **call_kw)
    grads = flashkit.attention_backward(cdout, cq, ck, cv, ref, lse, deterministic=True, **call_kw)
    return (out, *(x.grad for x in leaves)), (ref, *grads)


@pytest.mark.parametrize("how", ["ModMask", "by name", "block mask", "block mask + window, softcap, ALiBi",
                                 "block mask + score_mod"])
def test_masked_gradients_are_the_cupy_apis(how):
    import cupy as cp
    import flashkit
    import flashkit.torch as fkt
    _require_backward()
    ids = _doc_ids(2, 1000)
    if how == "ModMask":
        kw = {"mod": flashkit.ModMask("document", {"doc_ids": ids})}
        cupy_kw = kw
    elif how == "by name":
        kw = {"mod": "document", "mod_args": {"doc_ids": ids}}
        cupy_kw = {"mod": "document", "mod_args": {"doc_ids": cp.from_dlpack(ids)}}
    else:
        blocks = cp.random.RandomState(4).random_sample((2, 1, 8, 8)) < 0.5
        blocks[..., 0] = True   # every query block sees a key block
        kw = cupy_kw = {"block_mask": flashkit.BlockMask(blocks, seqlen_q=1000, seqlen_k=1000)}
        if how == "block mask + window, softcap, ALiBi":   # Gemma-style modifications under a block mask
            slopes = torch.linspace(0.05, 0.5, 8, device="cuda", dtype=torch.float32)
            kw = dict(kw, window_size=(300, 17), softcap=5.0, alibi_slopes=slopes)
            cupy_kw = dict(cupy_kw, window_size=(300, 17), softcap=5.0, alibi_slopes=cp.from_dlpack(slopes))
        elif how == "block mask + score_mod":
            slopes = torch.linspace(0.1, 1.0, 8, device="cuda", dtype=torch.float32)
            kw = dict(kw, mod="relative_bias", mod_args={"slopes": slopes})
            cupy_kw = dict(cupy_kw, mod="relative_bias", mod_args={"slopes": cp.from_dlpack(slopes)})
    for causal in (False, True):
        got, want = _torch_and_cupy(lambda a, b, c: fkt.attention(a, b, c, causal=causal, deterministic=True, **kw),
                                    dict(causal=causal, **cupy_kw), seed=int(causal))
        for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
            assert _same(a, b), f"{how}, causal={causal}: {name} differs from the CuPy API's"


def test_a_score_mod_functor_has_the_cupy_apis_gradients():
    """relative_bias (a score_mod that is a bias) differentiates through attention_backward."""
    import cupy as cp
    import flashkit.torch as fkt
    _require_backward()
    slopes = torch.linspace(0.1, 1.0, 8, device="cuda", dtype=torch.float32)
    got, want = _torch_and_cupy(
        lambda a, b, c: fkt.attention(a, b, c, causal=True, deterministic=True, mod="relative_bias",
                                      mod_args={"slopes": slopes}),
        dict(causal=True, mod="relative_bias", mod_args={"slopes": cp.from_dlpack(slopes)}), seed=3)
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
        assert _same(a, b), name


def test_a_score_mod_without_its_derivative_is_refused_before_the_forward(drop_in_functor):
    import cupy as cp
    import flashkit
    import flashkit.torch as fkt
    from flashkit.errors import UnsupportedError
    drop_in_functor("doubled", score_expr="2.f * s")
    q, k, v, _ = _inputs(3)
    with torch.no_grad():
        out = fkt.attention(q, k, v, causal=True, mod="doubled")
    want = flashkit.attention(*(cp.from_dlpack(x) for x in (q, k, v)), causal=True, mod="doubled")
    assert _same(out, want)
    with pytest.raises(UnsupportedError, match="'doubled' has a score_mod without score_mod_grad"):
        fkt.attention(q.clone().requires_grad_(), k, v, causal=True, mod="doubled")


def _masked_kwargs(how: str) -> dict:
    """flashkit.torch.attention's masked keywords of each kind, on torch tensors (b 2, s 1000, 8 heads)."""
    import cupy as cp
    import flashkit
    if how == "ModMask":
        return {"mod": flashkit.ModMask("document", {"doc_ids": _doc_ids(2, 1000)})}
    if how == "by name":
        return {"mod": "document", "mod_args": {"doc_ids": _doc_ids(2, 1000)}}
    if how == "score_mod":
        return {"mod": "relative_bias", "mod_args": {"slopes": torch.linspace(0.1, 1.0, 8, device="cuda")}}
    blocks = cp.random.RandomState(4).random_sample((2, 1, 8, 8)) < 0.5
    blocks[..., 0] = True
    return {"block_mask": flashkit.BlockMask(blocks, seqlen_q=1000, seqlen_k=1000)}


def _eager_and_compiled(f, inputs, dout) -> list:
    """(out, dq, dk, dv) of f eager, then of f compiled with fullgraph=True (a graph break raises)."""
    results = []
    for fn in (f, torch.compile(f, fullgraph=True)):
        leaves = tuple(x.clone().requires_grad_() for x in inputs)
        out = fn(*leaves)
        out.backward(dout)
        results.append((out.detach(), *(x.grad for x in leaves)))
    return results


@pytest.mark.parametrize("how", ["ModMask", "by name", "block mask", "score_mod"])
def test_a_masked_call_compiles_without_a_graph_break(how):
    """fullgraph=True: the masked ops trace (no torch.compiler.disable); out and the gradients are eager's bits."""
    import flashkit.torch as fkt
    _require_backward()
    torch._dynamo.reset()
    q, k, v, dout = _inputs(5)
    kw = _masked_kwargs(how)

    def f(a, b, c):
        return fkt.attention(a * 1.0, b, c, causal=True, deterministic=True, **kw) * 2.0

    eager, compiled = _eager_and_compiled(f, (q, k, v), dout)
    for name, a, b in zip(("out", "dq", "dk", "dv"), eager, compiled):
        assert torch.equal(a, b), f"{how}: {name}"


def test_a_new_mask_each_call_of_a_compiled_function_is_its_own():
    """Each ModMask of a compiled function's calls is looked up by its handle: every call's output is eager's for its
    own mask; the handle is an int input, so new masks cost at most one recompilation (automatic dynamic)."""
    import flashkit
    import flashkit.torch as fkt
    _require_backward()
    torch._dynamo.reset()
    compiles = []

    def backend(gm, example_inputs):
        compiles.append(gm)
        return gm.forward

    q, k, v, _ = _inputs(6)

    def f(a, b, c, mask):
        return fkt.attention(a, b, c, causal=True, mod=mask)

    compiled = torch.compile(f, backend=backend, fullgraph=True)
    with torch.no_grad():
        for split in (2, 3, 5, 7):
            ids = (torch.arange(1000, device="cuda", dtype=torch.int32) * split // 1000)[None].repeat(2, 1)
            mask = flashkit.ModMask("document", {"doc_ids": ids.contiguous()})
            assert torch.equal(compiled(q, k, v, mask), f(q, k, v, mask)), f"{split} documents"
    assert len(compiles) <= 2, f"{len(compiles)} compilations for 4 masks"


def test_a_score_mod_without_its_derivative_is_refused_in_a_compiled_function(drop_in_functor):
    import flashkit.torch as fkt
    from flashkit.errors import UnsupportedError
    drop_in_functor("doubled", score_expr="2.f * s")
    torch._dynamo.reset()
    q, k, v, _ = _inputs(3)
    f = torch.compile(lambda a, b, c: fkt.attention(a, b, c, causal=True, mod="doubled"), fullgraph=True)
    with torch.no_grad():
        f(q, k, v)
    with pytest.raises(UnsupportedError, match="'doubled' has a score_mod without score_mod_grad"):
        f(q.clone().requires_grad_(), k, v)
