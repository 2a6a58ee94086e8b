"""flashkit.compat.flash_attn on a GPU: flash-attn's functions against the float64 reference (DESIGN's rule),
their gradients, the packed forms, CuPy in / CuPy out, varlen against per-sequence calls, and the paged KV cache."""

from __future__ import annotations

import math

import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

import flashkit  # noqa: E402
from flashkit.call.dtypes import BY_NAME  # noqa: E402
from flashkit.compat import flash_attn as fa  # noqa: E402
from flashkit.verify.harness import judge  # noqa: E402
from flashkit.verify.reference import local_mask, output_atol, plain_attention, reference_attention  # noqa: E402

BF16 = BY_NAME["bfloat16"]


def _cp(x):
    import cupy as cp
    return cp.from_dlpack(x.detach().contiguous())


def _judge(out, q, k, v, *, causal, window=None, softcap=0.0, alibi=None, lse=None, label=""):
    """DESIGN's rule on out (and the LSE) of torch (batch, seqlen, heads, D) inputs."""
    import cupy as cp
    qc, kc, vc = (_cp(x) for x in (q, k, v))
    scale = 1 / math.sqrt(q.shape[-1])
    mask = None if window is None else local_mask(q.shape[1], k.shape[1], window, xp=cp)[None, None]
    slopes = None if alibi is None else _cp(alibi)
    ref, ref_lse = reference_attention(qc, kc, vc, scale=scale, causal=causal, mask=mask, softcap=softcap,
                                       alibi_slopes=slopes)
    plain, plain_lse = plain_attention(qc, kc, vc, scale=scale, dtype=BF16, causal=causal, mask=mask, softcap=softcap,
                                       alibi_slopes=slopes)
    res = judge("compat", label, _cp(out.float()), ref, plain, output_atol(ref, BF16, k.shape[1]),
                None if lse is None else _cp(lse), ref_lse, plain_lse, head_dim=q.shape[-1])
    assert res.passed, f"{label}: err {res.max_error:.3g} > {res.bound:.3g}; lse {res.lse_error} > {res.lse_bound}; " \
                       f"{res.note}"


def _inputs(b=2, sq=300, sk=257, h=8, hk=2, d=64, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    mk = lambda *s: torch.randn(*s, device="cuda", dtype=torch.bfloat16, generator=g)  # noqa: E731
    return mk(b, sq, h, d), mk(b, sk, hk, d), mk(b, sk, hk, d)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mods", ["none", "window", "softcap", "alibi"])
def test_flash_attn_func_against_the_reference(causal, mods):
    q, k, v = _inputs()
    kw, window, alibi = {}, None, None
    if mods == "window":
        window = (48, 0) if causal else (48, 16)
        kw["window_size"] = window
    elif mods == "softcap":
        kw["softcap"] = 2.0
    elif mods == "alibi":
        alibi = torch.rand(q.shape[2], device="cuda", dtype=torch.float32)
        kw["alibi_slopes"] = alibi
    out, lse, s_dmask = fa.flash_attn_func(q, k, v, causal=causal, return_attn_probs=True, **kw)
    assert isinstance(out, torch.Tensor) and out.shape == q.shape and out.dtype == q.dtype and s_dmask is None
    assert lse.shape == (q.shape[0], q.shape[2], q.shape[1]) and lse.dtype == torch.float32
    _judge(out, q, k, v, causal=causal, window=window, softcap=kw.get("softcap", 0.0), alibi=alibi, lse=lse,
           label=f"flash_attn_func causal={causal} {mods}")


def test_gradients_match_the_reference_and_deterministic_is_bitwise():
    import cupy as cp
    from flashkit.verify.reference import output_atol as atol_of
    from flashkit.verify.reference_backward import plain_backward, reference_backward
    q, k, v = _inputs(seed=3)
    dout = torch.randn_like(q)

    def grads(deterministic):
        xs = [x.clone().requires_grad_() for x in (q, k, v)]
        fa.flash_attn_func(*xs, causal=True, deterministic=deterministic).backward(dout)
        return [x.grad for x in xs]

    got = grads(True)
    assert all(torch.equal(a, b) for a, b in zip(got, grads(True)))
    ins = tuple(_cp(x) for x in (q, k, v, dout))
    scale = 1 / math.sqrt(q.shape[-1])
    refs = reference_backward(*ins, scale=scale, causal=True)
    plains = plain_backward(*ins, scale=scale, dtype=BF16, causal=True)
    for name, g, ref, plain in zip(("dq", "dk", "dv"), got, refs, plains):
        g64 = _cp(g.float()).astype(cp.float64)
        err = float(cp.abs(g64 - ref).max())
        bound = 2 * float(cp.abs(plain.astype(cp.float64) - ref).max()) + atol_of(ref, BF16, k.shape[1])
        assert bool(cp.isfinite(g64).all()) and err <= bound, f"{name}: err {err:.3g} > bound {bound:.3g}"


def test_packed_forms_equal_the_unpacked_call_and_carry_gradients():
    q, k, v = _inputs(sq=200, sk=200, hk=8, seed=4)
    qkv = torch.stack([q, k, v], dim=2).requires_grad_()
    out = fa.flash_attn_qkvpacked_func(qkv, causal=True)
    assert torch.equal(out, fa.flash_attn_func(q, k, v, causal=True))
    out.float().sum().backward()
    assert qkv.grad is not None and qkv.grad.shape == qkv.shape and bool(qkv.grad.isfinite().all())
    kv = torch.stack([k, v], dim=2)
    assert torch.equal(fa.flash_attn_kvpacked_func(q, kv), fa.flash_attn_func(q, k, v))


def test_cupy_in_cupy_out():
    import cupy as cp
    q, k, v = _inputs(seed=5)
    qc, kc, vc = (_cp(x) for x in (q, k, v))
    out = fa.flash_attn_func(qc, kc, vc, causal=True)
    assert isinstance(out, cp.ndarray)
    assert bool((out == _cp(fa.flash_attn_func(q, k, v, causal=True))).all())


LENS_Q = [1, 17, 128, 129, 300, 0, 64]
LENS_K = [5, 17, 200, 129, 300, 0, 80]


def _packed(lens_q, lens_k, h=8, hk=2, d=64, seed=6):
    g = torch.Generator(device="cuda").manual_seed(seed)
    mk = lambda *s: torch.randn(*s, device="cuda", dtype=torch.bfloat16, generator=g)  # noqa: E731
    cu = lambda lens: torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32, device="cuda")  # noqa
    return mk(sum(lens_q), h, d), mk(sum(lens_k), hk, d), mk(sum(lens_k), hk, d), cu(lens_q), cu(lens_k)


@pytest.mark.parametrize("causal", [False, True])
def test_varlen_against_per_sequence_calls(causal):
    q, k, v, cu_q, cu_k = _packed(LENS_Q, LENS_K)
    with torch.no_grad():
        out, lse, none = fa.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(LENS_Q), max(LENS_K), causal=causal,
                                                   return_attn_probs=True)
    assert none is None and out.shape == q.shape and lse.shape == (q.shape[1], q.shape[0])
    for b, (nq, nk) in enumerate(zip(LENS_Q, LENS_K)):
        if nq == 0:
            continue
        rows = slice(int(cu_q[b]), int(cu_q[b + 1]))
        keys = slice(int(cu_k[b]), int(cu_k[b + 1]))
        if nk == 0:
            assert bool((out[rows] == 0).all())
            continue
        qb, kb, vb = q[None, rows], k[None, keys], v[None, keys]
        _judge(out[None, rows], qb, kb, vb, causal=causal, lse=lse[None, :, rows], label=f"varlen seq {b}")
        dense = fa.flash_attn_func(qb, kb, vb, causal=causal)
        bound = 8 * BF16.eps * max(1.0, float(dense.float().abs().max()))   # a few bf16 ulps: two kernels
        assert float((out[None, rows].float() - dense.float()).abs().max()) <= bound, f"seq {b}"


@pytest.mark.parametrize("page", [16, 64])
def test_kvcache_paged_and_contiguous_against_the_reference(page):
    """Three sequences with 5, 40 and 100 cached keys and one new token each, written through a shuffled block table."""
    g = torch.Generator(device="cuda").manual_seed(7)
    mk = lambda *s: torch.randn(*s, device="cuda", dtype=torch.bfloat16, generator=g)  # noqa: E731
    b, h, hk, d, capacity = 3, 8, 2, 128, 128
    seqlens = torch.tensor([5, 40, 100], dtype=torch.int32, device="cuda")
    k_cache, v_cache = mk(b, capacity, hk, d), mk(b, capacity, hk, d)
    q, k_new, v_new = mk(b, 1, h, d), mk(b, 1, hk, d), mk(b, 1, hk, d)
    pages_per_seq = capacity // page
    perm = torch.randperm(b * pages_per_seq, generator=torch.Generator().manual_seed(0)).to("cuda")
    table = perm.view(b, pages_per_seq).to(torch.int32)
    k_pages = torch.empty(b * pages_per_seq, page, hk, d, device="cuda", dtype=torch.bfloat16)
    v_pages = torch.empty_like(k_pages)
    k_pages[table.flatten().long()] = k_cache.reshape(-1, page, hk, d)
    v_pages[table.flatten().long()] = v_cache.reshape(-1, page, hk, d)

    out_c, lse_c = fa.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=seqlens, causal=True,
                                              return_softmax_lse=True)
    out_p = fa.flash_attn_with_kvcache(q, k_pages, v_pages, k_new, v_new, cache_seqlens=seqlens, block_table=table,
                                       causal=True)
    for s in range(b):
        n = int(seqlens[s])
        assert torch.equal(k_cache[s, n], k_new[s, 0]) and torch.equal(v_cache[s, n], v_new[s, 0])   # written in place
        page_idx, row = int(table[s, n // page]), n % page
        assert torch.equal(k_pages[page_idx, row], k_new[s, 0])
        ks, vs = k_cache[s:s + 1, :n + 1], v_cache[s:s + 1, :n + 1]
        _judge(out_c[s:s + 1], q[s:s + 1], ks, vs, causal=True, lse=lse_c[s:s + 1], label=f"kvcache seq {s}")
        _judge(out_p[s:s + 1], q[s:s + 1], ks, vs, causal=True, label=f"paged {page} seq {s}")
