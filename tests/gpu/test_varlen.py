"""attention_varlen on the flash kernels: the verify matrix (zero-length and one-token sequences, tile
boundaries +- 1, 4097, cross lengths, MQA, window + ALiBi) against the float64 reference, and the packed
launch bit-identical to running each sequence alone on the same kernel."""

from __future__ import annotations

import zlib

import pytest

from flashkit.registry import discover_kernels
from flashkit.verify.varlen import varlen_checks

pytestmark = pytest.mark.gpu
VARIANTS = ("fa2", "causal", "fa3")


def _params():
    specs = discover_kernels().specs
    out = []
    for name in VARIANTS:
        spec = specs[name]
        checks = varlen_checks(spec, ["bfloat16", "float16"], [64, 128, 256], spec.causal_options(), quick=True)
        assert checks, name
        out += [pytest.param(name, c, id=f"{name}: {c.label}") for c in checks]
    return out


def _runs_here(variant: str) -> None:
    from flashkit.runtime.device import device_info
    spec = discover_kernels().get(variant)
    if not spec.runs_on(device_info().cc):
        pytest.skip(f"{variant} needs compute capability {spec.arch_requirement()}")


@pytest.mark.parametrize("variant,check", _params())
def test_varlen_matrix(variant, check):
    from flashkit.cli.verify_cmd import format_result
    _runs_here(variant)
    result = check.run(zlib.crc32(check.label.encode()))
    assert result.variant == variant and result.passed, format_result(result)


def _packed(lens_q, lens_k, heads=4, kv_heads=2, d=128, seed=0):
    import cupy
    import ml_dtypes
    rng = cupy.random.default_rng(seed)
    draw = lambda *s: rng.standard_normal(s, dtype=cupy.float32).astype(ml_dtypes.bfloat16)  # noqa: E731
    cu = lambda lens: cupy.asarray([0] + list(__import__("itertools").accumulate(lens)), dtype=cupy.int32)  # noqa: E731
    return (draw(sum(lens_q), heads, d), draw(sum(lens_k), kv_heads, d), draw(sum(lens_k), kv_heads, d),
            cu(lens_q), cu(lens_k))


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("causal", [False, True])
def test_packed_launch_equals_each_sequence_alone(variant, causal):
    """Same kernel, same tiles, same order: the packed result is the per-sequence result bit for bit
    (keys read past a sequence's end are masked to exactly zero weight)."""
    import cupy

    import flashkit
    _runs_here(variant)
    if variant == "causal" and not causal:
        pytest.skip("the causal variant runs causal calls only")
    lens_q, lens_k = [130, 1, 257, 64], [200, 70, 257, 1]
    q, k, v, cu_q, cu_k = _packed(lens_q, lens_k)
    out, lse = flashkit.attention_varlen(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal,
                                         return_lse=True, variant=variant)
    assert lse.shape == (4, sum(lens_q))
    for b, (nq, nk) in enumerate(zip(lens_q, lens_k)):
        q0, k0 = int(cu_q[b]), int(cu_k[b])
        ref, ref_lse = flashkit.attention(q[None, q0:q0 + nq], k[None, k0:k0 + nk], v[None, k0:k0 + nk],
                                          causal=causal, return_lse=True, variant=variant)
        assert bool((out[q0:q0 + nq].view(cupy.uint16) == ref[0].view(cupy.uint16)).all()), f"sequence {b}"
        assert bool(cupy.allclose(lse[:, q0:q0 + nq], ref_lse[0], rtol=0, atol=0, equal_nan=True)), f"lse {b}"


def test_no_tokens_and_no_keys():
    import cupy

    import flashkit
    q, k, v, cu_q, cu_k = _packed([0, 0], [3, 5])
    out = flashkit.attention_varlen(q, k, v, cu_q, cu_k, 0, 5)
    assert out.shape == (0, 4, 128)
    q, k, v, cu_q, cu_k = _packed([3, 2], [0, 0])
    out, lse = flashkit.attention_varlen(q, k, v, cu_q, cu_k, 3, 0, return_lse=True)
    assert bool((out.astype(cupy.float32) == 0).all()) and bool((lse == -cupy.inf).all())


def test_bad_offsets_raise_before_any_launch():
    import cupy

    import flashkit
    q, k, v, cu_q, cu_k = _packed([10, 20], [10, 20])
    out = cupy.full(q.shape, 7, dtype=q.dtype)
    with pytest.raises(flashkit.InputError, match="max_seqlen_q: expected >= the longest sequence"):
        flashkit.attention_varlen(q, k, v, cu_q, cu_k, 19, 20, out=out)
    short = cupy.asarray([0, 10, 29], dtype=cupy.int32)
    with pytest.raises(flashkit.InputError, match="cu_seqlens_k: expected to end at the 30 packed tokens"):
        flashkit.attention_varlen(q, k, v, cu_q, short, 20, 20, out=out)
    assert bool((out.astype(cupy.float32) == 7).all())   # nothing was written


def test_torch_tensors_in_and_out_zero_copy():
    torch = pytest.importorskip("torch")
    import flashkit
    lens = [100, 3, 257]
    q, k, v = (torch.randn(sum(lens), h, 64, device="cuda", dtype=torch.bfloat16) for h in (8, 2, 2))
    cu = torch.tensor([0, 100, 103, 360], device="cuda", dtype=torch.int32)
    out = flashkit.attention_varlen(q, k, v, cu, cu, 257, 257, causal=True)
    ref = torch.cat([torch.nn.functional.scaled_dot_product_attention(
        q[a:b].transpose(0, 1)[None].float(), k[a:b].transpose(0, 1)[None].float(),
        v[a:b].transpose(0, 1)[None].float(), is_causal=True, enable_gqa=True)[0].transpose(0, 1)
        for a, b in ((0, 100), (100, 103), (103, 360))])
    got = torch.from_dlpack(out).float()
    assert (got - ref).abs().max().item() < 2e-2
