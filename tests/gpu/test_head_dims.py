"""Every head dim the sm80 forward kernels take (multiples of 8 from 8 to 256, compiled per head-dim class) on a GPU:
fa2, causal and block_sparse against the float64 reference (verify's rule), the columns beyond a padded head dim
neither read nor written, and no call of them selecting the `standard` baseline."""

from __future__ import annotations

import warnings

import pytest

from flashkit.registry import discover_kernels
from flashkit.verify.block_sparse import block_sparse_check
from flashkit.verify.dense import dense_check
from flashkit.verify.harness import Shape

pytestmark = pytest.mark.gpu

VARIANTS = ("fa2", "causal", "block_sparse")
HEAD_DIMS = tuple(range(8, 257, 8))
# Ragged lengths, seqlen_q != seqlen_k, GQA 2:1, batch 2: tails in every tile dimension.
SHAPE = Shape(2, 127, 300, 4, 2)


def _checks():
    out = []
    for name in VARIANTS:
        spec = discover_kernels().get(name)
        for d in HEAD_DIMS:
            for causal in spec.causal_options():
                dtype = "bfloat16" if d % 16 else "float16"   # both dtypes, over the head dims
                if spec.requires.get("block_sparse"):
                    out.append(block_sparse_check(spec, SHAPE, d, dtype, causal, "random(0.5)"))
                else:
                    out.append(dense_check(spec, SHAPE, d, dtype, causal))
    return out


CHECKS = _checks()


def _device_ok(name: str) -> None:
    from flashkit.runtime.device import device_info
    spec = discover_kernels().get(name)
    if not spec.runs_on(device_info().cc):
        pytest.skip(f"{name} needs compute capability {spec.arch_requirement()}")


def test_every_head_dim_and_variant_is_checked():
    assert {(c.variant, int(c.label.split(" d")[1].split()[0])) for c in CHECKS} == \
        {(v, d) for v in VARIANTS for d in HEAD_DIMS}


@pytest.mark.parametrize("check", CHECKS, ids=[f"{c.variant}: {c.label}" for c in CHECKS])
def test_head_dim_against_the_reference(check):
    _device_ok(check.variant)
    res = check.run(0)
    assert res.passed, (f"{res.label}: err {res.max_error:.3g} > bound {res.bound:.3g}; lse err {res.lse_error} "
                        f"> {res.lse_bound}; {res.note}")


@pytest.mark.parametrize("head_dim,width", [(8, 32), (80, 96), (136, 160), (248, 256), (96, 128)])
@pytest.mark.parametrize("causal", [False, True])
def test_padded_columns_are_neither_read_nor_written(head_dim, width, causal):
    """q, k, v and out are column slices of NaN-filled wider buffers: the kernel must zero-fill (not load) the
    columns beyond head_dim and leave those of out untouched."""
    _device_ok("fa2")
    import cupy as cp
    import ml_dtypes

    import flashkit
    from flashkit.verify.reference import reference_attention
    rng = cp.random.default_rng(head_dim)
    bufs = [cp.full((2, 200, 4, width), cp.nan, dtype=cp.float32) for _ in range(4)]
    for b in bufs[:3]:
        b[..., :head_dim] = rng.standard_normal((2, 200, 4, head_dim), dtype=cp.float32)
    q, k, v, out = (b.astype(ml_dtypes.bfloat16)[..., :head_dim] for b in bufs)
    assert q.strides[1] == 4 * width * 2   # a true view: rows are `width` wide
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # no FallbackWarning: a flash kernel serves the call
        res = flashkit.attention(q, k, v, causal=causal, out=out)
    assert res.data.ptr == out.data.ptr
    full = out.base
    assert full is not None and full.shape[-1] == width
    assert bool(cp.isnan(full[..., head_dim:].astype(cp.float32)).all()), "columns beyond head_dim were written"
    ref, _ = reference_attention(q, k, v, scale=head_dim ** -0.5, causal=causal)
    got = out.astype(cp.float64)
    assert bool(cp.isfinite(got).all())
    assert float(cp.abs(got - ref).max()) < 2e-2


@pytest.mark.parametrize("head_dim", [32, 80, 96, 192])
def test_selection_never_falls_back_to_standard(head_dim):
    _device_ok("fa2")
    from flashkit.runtime.device import device_info
    import flashkit
    for causal in (False, True):
        sel = flashkit.api.explain(dtype="bfloat16", head_dim=head_dim, causal=causal, cc=device_info().cc)
        assert sel.chosen.name != "standard" and sel.warning is None, sel.report()
