"""head_dim_v on a GPU (v and the output narrower than q and k; DeepSeek's MLA: 192 / 128): fa2, causal and fa3 (sm_90)
against the float64 reference under DESIGN.md's rule (fresh random inputs, NaN-poisoned outputs, the LSE too), fa3 on
every pair of its head dims at tile boundaries and over several tiles a CTA, the default selection (fa3 on sm_90, the
FA2 family elsewhere), column slices neither read nor written past head_dim_v, the cached hot path; and the backward
(fa2_bwd, fa3_bwd) against the float64 gradients, on column slices too, and through flashkit.torch's autograd."""

from __future__ import annotations

import warnings

import pytest

from flashkit.call.dtypes import BY_NAME
from flashkit.registry import discover_kernels
from flashkit.verify.dense import dense_check
from flashkit.verify.harness import Shape, judge, random_qkv
from flashkit.verify.head_dim_v import head_dim_v_checks
from flashkit.verify.reference import output_atol, plain_attention, reference_attention

from .gpu_checks import run_check

pytestmark = pytest.mark.gpu

VARIANTS = ("fa2", "causal", "fa3", "fa2_bwd", "fa3_bwd")
FA3_HEAD_DIMS = (64, 96, 128, 192, 256)
FA3_PAIRS = tuple((d, dv) for d in FA3_HEAD_DIMS for dv in FA3_HEAD_DIMS if dv < d)
# fa3's tiles: 128 query rows; 128 keys (hd96, hd128) or 64 (hd192, hd256). Lengths at those bounds and one past,
# GQA and MQA, seqlen_q != seqlen_k both ways, one query row.
FA3_BOUNDARY_SHAPES = (Shape(1, 127, 129, 4, 2), Shape(2, 128, 64, 4, 4), Shape(1, 129, 65, 8, 1),
                       Shape(1, 255, 127, 2, 2), Shape(1, 257, 128, 4, 1), Shape(1, 64, 63, 2, 2),
                       Shape(3, 1, 257, 4, 2))
# More tiles than an H100 has SMs (132): the persistent scheduler hands each CTA several (Q reloaded, rings carried).
FA3_MANY_TILES = Shape(4, 1000, 1000, 16, 2)


def _params():
    out = []
    for name in VARIANTS:
        spec = discover_kernels().get(name)
        checks = head_dim_v_checks(spec, list(spec.dtypes), list(spec.head_dims.examples()), spec.causal_options(),
                                   False)
        out += [pytest.param(name, c, id=f"{name}: {c.label}") for c in checks]
    return out


PARAMS = _params()


def _on_sm90():
    from flashkit.runtime.device import device_info
    if device_info().cc != (9, 0):
        pytest.skip("fa3 runs on sm_90 only")


def _fa3_params():
    spec = discover_kernels().get("fa3")
    checks = [dense_check(spec, s, d, "bfloat16", c, dv) for d, dv in FA3_PAIRS for c in (False, True)
              for s in FA3_BOUNDARY_SHAPES]
    checks += [dense_check(spec, FA3_MANY_TILES, d, t, c, dv) for d, dv in ((192, 128), (128, 64))
               for t in ("bfloat16", "float16") for c in (False, True)]
    return [pytest.param(c, id=c.label) for c in checks]


@pytest.mark.parametrize("check", _fa3_params())
def test_fa3_every_pair_at_tile_boundaries(check):
    _on_sm90()
    run_check("fa3", check)


@pytest.mark.parametrize("d,dv", FA3_PAIRS)
def test_fa3_is_selected_for_each_pair_on_sm90(d, dv):
    import flashkit
    from flashkit.runtime.device import device_info
    _on_sm90()
    for causal in (False, True):
        sel = flashkit.explain(dtype="bfloat16", head_dim=d, head_dim_v=dv, causal=causal, cc=device_info().cc)
        assert sel.chosen.name == "fa3", (d, dv, causal)


def test_every_variant_has_mla_checks():
    for name in VARIANTS:
        labels = [c.label for n, c in (p.values for p in PARAMS) if n == name]
        assert any("d192/v128" in lbl for lbl in labels), name


@pytest.mark.parametrize("name,check", PARAMS)
def test_head_dim_v_against_the_reference(name, check):
    run_check(name, check)


def _compare(out, lse, q, k, v, causal, dtype, label):
    d = q.shape[-1]
    ref, lse_ref = reference_attention(q, k, v, scale=d ** -0.5, causal=causal)
    plain, lse_plain = plain_attention(q, k, v, scale=d ** -0.5, dtype=BY_NAME[dtype], causal=causal)
    atol = output_atol(ref, BY_NAME[dtype], max(k.shape[1], d))
    res = judge("default", label, out, ref, plain, atol, lse, lse_ref, lse_plain, head_dim=d)
    assert res.passed, (f"{label}: err {res.max_error:.3g} > bound {res.bound:.3g}; lse err {res.lse_error} > "
                        f"{res.lse_bound}; {res.note}")


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_default_selection_runs_mla_on_fa3_or_the_fa2_family(causal, dtype):
    """No variant named: the call selects fa3 on sm_90, fa2 / causal elsewhere, with no fallback warning, an output of
    v's head dim, and the reference's values."""
    import cupy as cp

    import flashkit
    from flashkit.runtime.device import device_info
    shape = Shape(2, 300, 257, 16, 2)
    q, k, v = random_qkv(shape, 192, dtype, 7 + causal, head_dim_v=128)
    sel = flashkit.explain(dtype=dtype, head_dim=192, head_dim_v=128, seqlen_q=300, seqlen_k=257, heads=16,
                           kv_heads=2, batch=2, causal=causal, lse=True, cc=device_info().cc)
    on_hopper = device_info().cc == (9, 0)
    assert sel.chosen.name == ("fa3" if on_hopper else "causal" if causal else "fa2")
    out = cp.full((2, 300, 16, 128), cp.nan, dtype=q.dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res, lse = flashkit.attention(q, k, v, causal=causal, return_lse=True, out=out)
    assert res is out and res.shape == (2, 300, 16, 128)
    _compare(res, lse, q, k, v, causal, dtype, f"default {dtype} causal={causal}")
    again, lse2 = flashkit.attention(q, k, v, causal=causal, return_lse=True)   # the cached signature's path
    assert again.shape == (2, 300, 16, 128)
    _compare(again, lse2, q, k, v, causal, dtype, f"cached {dtype} causal={causal}")


@pytest.mark.parametrize("d,dv,width", [(192, 128, 192), (192, 120, 136), (200, 136, 200), (64, 40, 64),
                                        (128, 64, 96), (256, 192, 256)])   # 192/128, 128/64, 256/192: fa3 on sm_90
@pytest.mark.parametrize("causal", [False, True])
def test_columns_past_head_dim_v_are_neither_read_nor_written(d, dv, width, causal):
    """v and out are column slices of NaN-filled wider buffers: the kernel must zero-fill (not load) v's columns past
    head_dim_v, and leave out's untouched."""
    import cupy as cp
    import ml_dtypes

    import flashkit
    rng = cp.random.default_rng(d + dv)
    q = rng.standard_normal((2, 130, 4, d), dtype=cp.float32).astype(ml_dtypes.bfloat16)
    k = rng.standard_normal((2, 201, 2, d), dtype=cp.float32).astype(ml_dtypes.bfloat16)
    v_buf = cp.full((2, 201, 2, width), cp.nan, dtype=cp.float32)
    v_buf[..., :dv] = rng.standard_normal((2, 201, 2, dv), dtype=cp.float32)
    v = v_buf.astype(ml_dtypes.bfloat16)[..., :dv]
    out_buf = cp.full((2, 130, 4, width), cp.nan, dtype=cp.float32).astype(ml_dtypes.bfloat16)
    out = out_buf[..., :dv]
    res, lse = flashkit.attention(q, k, v, causal=causal, out=out, return_lse=True)
    assert res is out
    if width > dv:
        assert bool(cp.isnan(out_buf[..., dv:].astype(cp.float32)).all()), "columns past head_dim_v were written"
    _compare(res, lse, q, k, cp.ascontiguousarray(v), causal, "bfloat16", f"slices d{d}/v{dv} causal={causal}")


@pytest.mark.parametrize("variant", ["fa2_bwd", "fa3_bwd"])
@pytest.mark.parametrize("d,dv,width", [(192, 128, 192), (200, 136, 200), (64, 40, 64), (128, 64, 96),
                                        (256, 64, 128), (136, 128, 136)])
@pytest.mark.parametrize("causal", [False, True])
def test_backward_reads_no_column_past_head_dim_v(variant, d, dv, width, causal):
    """v, out and dout are column slices of NaN-filled wider buffers: the backward must zero-fill (not load) their
    columns past head_dim_v; dq, dk, dv against the float64 gradients (NaN-poisoned pool)."""
    import cupy as cp

    import flashkit
    from flashkit.verify.backward import judge_gradients, poison_pool
    rng = cp.random.default_rng(d + dv + causal)
    storage = BY_NAME["bfloat16"].storage

    def sliced(shape):   # the first dv columns of a NaN-filled (..., width) buffer, random
        buf = cp.full(shape[:-1] + (width,), cp.nan, dtype=cp.float32).astype(storage)
        buf[..., :dv] = rng.standard_normal(shape, dtype=cp.float32).astype(storage)
        return buf[..., :dv]
    q = rng.standard_normal((2, 130, 4, d), dtype=cp.float32).astype(storage)
    k = rng.standard_normal((2, 201, 2, d), dtype=cp.float32).astype(storage)
    v, dout = sliced((2, 201, 2, dv)), sliced((2, 130, 4, dv))
    out = sliced((2, 130, 4, dv))
    res, lse = flashkit.attention(q, k, v, causal=causal, out=out, return_lse=True)
    assert res is out
    poison_pool((q, k, v))
    grads = flashkit.attention_backward(dout, q, k, v, out, lse, causal=causal, variant=variant)
    assert [g.shape for g in grads] == [q.shape, k.shape, (2, 201, 2, dv)]
    label = f"slices d{d}/v{dv} causal={causal}"
    res = judge_gradients(variant, label, (q, k, cp.ascontiguousarray(v), cp.ascontiguousarray(dout)), grads, d,
                          causal, "bfloat16")
    assert res.passed, f"{label}: {res.note}"


def test_torch_adapter_differentiates_a_narrower_v():
    """flashkit.torch.attention with v of 128 under q / k's 192: the output has v's head dim, and autograd's dq, dk,
    dv pass the rule against the float64 gradients."""
    torch = pytest.importorskip("torch")
    import flashkit.torch as fk_torch
    from flashkit.call.arrays import to_cupy
    from flashkit.verify.backward import judge_gradients
    g = torch.Generator(device="cuda").manual_seed(5)
    q = torch.randn(2, 100, 8, 192, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
    k = torch.randn(2, 90, 2, 192, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
    v = torch.randn(2, 90, 2, 128, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
    dout = torch.randn(2, 100, 8, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    out = fk_torch.attention(q, k, v, causal=True)
    assert out.shape == (2, 100, 8, 128)
    out.backward(dout)
    views = [to_cupy(x.detach(), "x") for x in (q, k, v, dout)]
    grads = [to_cupy(x.grad, "grad") for x in (q, k, v)]
    res = judge_gradients("default", "torch d192/v128 causal", views, grads, 192, True, "bfloat16")
    assert res.passed, res.note
