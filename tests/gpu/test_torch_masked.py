"""flashkit.torch.attention with block_mask=, mod= / mod_args= (torch_masked.py): the output and the gradients are
flashkit.attention's and attention_backward's on the same inputs, bit for bit (deterministic backward), for a
ModMask, a functor by name with a torch tensor argument, a block mask and a score_mod with its derivative; a
score_mod without one runs without a gradient and is refused, before the forward, with one; the call works inside a
torch.compile'd function.
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


@pytest.mark.parametrize("how", ["ModMask", "by name", "block mask"])
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
    for causal in (False, True):
        got, want = _torch_and_cupy(lambda a, b, c: fkt.attention(a, b, c, causal=causal, deterministic=True, **kw),
                                    dict(causal=causal, **cupy_kw), seed=int(causal))
        for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
            assert _same(a, b), f"{how}, causal={causal}: {name} differs from the CuPy API's"


def test_a_score_mod_functor_has_the_cupy_apis_gradients():
    """relative_bias (a score_mod with its score_mod_grad) differentiates through attention_backward."""
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


def test_a_masked_call_inside_a_compiled_function():
    """torch.compile breaks the graph around the masked call (torch.compiler.disable) and gives the eager bits."""
    import flashkit
    import flashkit.torch as fkt
    _require_backward()
    q, k, v, dout = _inputs(5)
    mask = flashkit.ModMask("document", {"doc_ids": _doc_ids(2, 1000)})

    def f(a, b, c):
        return fkt.attention(a * 1.0, b, c, causal=True, deterministic=True, mod=mask) * 2.0

    results = []
    for fn in (f, torch.compile(f)):
        leaves = tuple(x.clone().requires_grad_() for x in (q, k, v))
        out = fn(*leaves)
        out.backward(dout)
        results.append((out.detach(), *(x.grad for x in leaves)))
    for name, a, b in zip(("out", "dq", "dk", "dv"), *results):
        assert torch.equal(a, b), name
