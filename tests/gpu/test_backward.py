"""attention_backward (fa2_bwd, and fa3_bwd on sm_90) against the float64 reference backward, by DESIGN's rule:
max|grad - ref| <= 2 max|plain - ref| + atol for each of dq, dk, dv, with plain the same backward in the
input precision; fresh random inputs; outputs come from NaN-poisoned memory; no NaN or Inf anywhere.
out and lse come from the fa2 forward, as a training step would have them.
fa3_bwd (the Hopper draft) runs only where the device is sm_90 (its manifest's arch); select it with
`-k fa3_bwd`.
"""

from __future__ import annotations

import zlib

import pytest

pytestmark = pytest.mark.gpu

DTYPES = ["float16", "bfloat16"]
VARIANTS = ["fa2_bwd", "fa3_bwd"]


def head_dims(variant):
    """The head dims to test a variant at: its manifest's classes (64, 128, 256) and, below
    each, the head dim furthest from it (compiled for the class, columns past the call's head dim zero)."""
    from flashkit.registry import discover_kernels
    return list(discover_kernels().specs[variant].head_dims.examples())


# (batch, seqlen_q, seqlen_k, heads, kv_heads)
SHAPES = [
    (1, 1, 1, 2, 2), (2, 17, 17, 4, 4), (1, 128, 128, 8, 1), (2, 1000, 1000, 8, 1), (1, 17, 128, 4, 2),
    (2, 128, 17, 4, 4), (1, 1000, 129, 16, 2), (1, 65, 1000, 2, 1), (1, 1, 1000, 2, 2), (1, 1000, 1, 2, 1),
]


def _cases():
    out = []
    for variant in VARIANTS:
        for i, shape in enumerate(SHAPES):
            for hd in head_dims(variant):
                for causal in (False, True):
                    dtype = DTYPES[(i + hd // 64 + causal) % 2]   # both dtypes over the matrix, half the runs
                    out.append(pytest.param(variant, shape, hd, causal, dtype,
                                            id=f"{variant}-b{shape[0]}-sq{shape[1]}-sk{shape[2]}-h{shape[3]}:"
                                               f"{shape[4]}-hd{hd}-{'causal' if causal else 'full'}-{dtype}"))
    return out


def require(variant):
    """Skip a variant this device's architecture does not run (fa3_bwd: sm_90 only)."""
    from flashkit.registry import discover_kernels
    from flashkit.runtime.device import device_info
    cc = device_info().cc
    if not discover_kernels().specs[variant].runs_on(cc):
        pytest.skip(f"{variant} does not run on compute capability {cc[0]}.{cc[1]}")


def _inputs(shape, hd, dtype, seed):
    import cupy as cp
    from flashkit.call.dtypes import BY_NAME
    b, sq, sk, h, hk = shape
    rs = cp.random.RandomState(seed)
    storage = BY_NAME[dtype].storage
    mk = lambda s: rs.standard_normal(s, dtype=cp.float32).astype(storage)  # noqa: E731
    return mk((b, sq, h, hd)), mk((b, sk, hk, hd)), mk((b, sk, hk, hd)), mk((b, sq, h, hd))


def run_backward(shape, hd, causal, dtype, seed, deterministic=False, variant="fa2_bwd"):
    import cupy as cp
    import flashkit
    from flashkit.verify.backward import poison_pool
    q, k, v, dout = _inputs(shape, hd, dtype, seed)
    out, lse = flashkit.attention(q, k, v, causal=causal, return_lse=True, variant="fa2")
    poison_pool((q, k, v))
    grads = flashkit.attention_backward(dout, q, k, v, out, lse, causal=causal, deterministic=deterministic,
                                        variant=variant)
    cp.cuda.Device().synchronize()
    return (q, k, v, dout), grads


def judge(inputs, grads, hd, causal, dtype, variant="fa2_bwd"):
    from flashkit.verify.backward import judge_gradients
    result = judge_gradients(variant, "", inputs, grads, hd, causal, dtype)
    return result.passed, result.note


@pytest.mark.parametrize("variant,shape,hd,causal,dtype", _cases())
def test_backward_matches_reference(variant, shape, hd, causal, dtype):
    require(variant)
    seed = zlib.crc32(f"{shape}{hd}{causal}{dtype}".encode())
    inputs, grads = run_backward(shape, hd, causal, dtype, seed, variant=variant)
    ok, report = judge(inputs, grads, hd, causal, dtype, variant)
    assert ok, report


# fa3_bwd's own risks: visits past the 2-stage rings' first rounds (many heads a group, many query blocks), the
# hd64 dQ key split (both consumers add), the ragged key block's second consumer (keys 64.. all past seqlen_k),
# a query block crossing the diagonal for one consumer only; at hd256 (key blocks of 64, consumers split by
# columns) the same shapes cross the diagonal inside a key block and cover both halves of the query block.
FA3_SHAPES = [(1, 4097, 4097, 4, 1), (2, 300, 70, 8, 8), (1, 64, 192, 2, 1), (3, 777, 1500, 4, 1)]


@pytest.mark.parametrize("shape", FA3_SHAPES, ids=lambda s: "b{}-sq{}-sk{}-h{}:{}".format(*s))
@pytest.mark.parametrize("hd", head_dims("fa3_bwd"))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_fa3_bwd_pipeline_shapes(shape, hd, causal):
    require("fa3_bwd")
    dtype = DTYPES[(hd // 64 + causal) % 2]
    inputs, grads = run_backward(shape, hd, causal, dtype, zlib.crc32(f"fa3{shape}{hd}{causal}".encode()),
                                 variant="fa3_bwd")
    ok, report = judge(inputs, grads, hd, causal, dtype, "fa3_bwd")
    assert ok, report


# Keys past seqlen_k carry no element mask: their zero K rows score 0, and P = exp2(0 - lse2) overflowed float16
# where every score of a row, so its LSE, lay below -11; dS = inf then met K's zero rows in dQ = dS K (NaN).
# Q's entries positive and K's negative make every score about -46 (numeric.cuh's SaturateFinite packs).
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("hd", [64, 128])
@pytest.mark.parametrize("seqlen_k", [3, 70])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_keys_past_seqlen_k_with_negative_lse(variant, hd, seqlen_k, causal):
    require(variant)
    import cupy as cp
    import flashkit
    from flashkit.verify.backward import poison_pool
    rs = cp.random.RandomState(seqlen_k + hd + causal)
    magnitude = lambda s: cp.abs(rs.standard_normal(s, dtype=cp.float32)) * 3   # noqa: E731
    q = magnitude((2, 100, 4, hd)).astype(cp.float16)
    k = (-magnitude((2, seqlen_k, 2, hd))).astype(cp.float16)
    v = rs.standard_normal((2, seqlen_k, 2, hd), dtype=cp.float32).astype(cp.float16)
    dout = rs.standard_normal((2, 100, 4, hd), dtype=cp.float32).astype(cp.float16)
    out, lse = flashkit.attention(q, k, v, causal=causal, return_lse=True, variant="fa2")
    assert float(cp.nan_to_num(lse, posinf=-1e9).max()) < -11, "the case needs every row's LSE below -11"
    poison_pool((q, k, v))
    grads = flashkit.attention_backward(dout, q, k, v, out, lse, causal=causal, variant=variant)
    ok, report = judge((q, k, v, dout), grads, hd, causal, "float16", variant)
    assert ok, report


# fa2_bwd's tiles for the architectures whose SMs hold less shared memory, run on this GPU (the same code;
# verify/arch_tiles.py): sm_80's hd256 with Q and dO single-buffered, sm_86 / sm_89's hd128 on 64-key blocks
# single-buffered. The shapes walk many query blocks a CTA (the one buffer refilled under dQ) and end ragged.
OTHER_ARCH_SHAPES = [(2, 1000, 1000, 8, 2), (1, 17, 128, 4, 2), (1, 1000, 129, 16, 2), (1, 65, 1000, 2, 1)]


def _other_arch_tiles():
    from flashkit.registry import discover_kernels
    from flashkit.verify.arch_tiles import arch_tiles
    return arch_tiles(discover_kernels().specs["fa2_bwd"], (9, 0))


@pytest.mark.parametrize("arch,hd", _other_arch_tiles(), ids=lambda x: f"sm{x[0]}{x[1]}" if isinstance(x, tuple) else f"hd{x}")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_fa2_bwd_tiles_of_smaller_shared_memories(arch, hd, causal):
    from flashkit.registry import discover_kernels
    from flashkit.runtime.build import make_config
    from flashkit.runtime.device import device_info
    from flashkit.verify.arch_tiles import tiles_of
    spec = discover_kernels().specs["fa2_bwd"]
    with tiles_of("fa2_bwd", arch):
        assert make_config(spec, "bfloat16", hd, causal, device_info().cc).launch == \
            tuple(sorted(spec.launch_config(arch, hd).items()))
        for i, shape in enumerate(OTHER_ARCH_SHAPES):
            dtype = DTYPES[(i + causal) % 2]
            seed = zlib.crc32(f"arch{arch}{shape}{hd}{causal}".encode())
            inputs, grads = run_backward(shape, hd, causal, dtype, seed)
            ok, report = judge(inputs, grads, hd, causal, dtype)
            assert ok, f"{shape}: {report}"


@pytest.mark.parametrize("variant,hd", [(v, d) for v in VARIANTS for d in head_dims(v)])
@pytest.mark.parametrize("causal", [False, True])
def test_deterministic_is_bit_identical(variant, hd, causal):
    import cupy as cp
    require(variant)
    if variant == "fa2_bwd" and hd != 128:
        pytest.skip("fa2_bwd: one head dim is enough (its dQ order does not depend on it)")
    shape, dtype = (2, 1000, 1000, 8, 2), "bfloat16"
    inputs, first = run_backward(shape, hd, causal, dtype, 7, deterministic=True, variant=variant)
    ok, report = judge(inputs, first, hd, causal, dtype, variant)
    assert ok, report
    for _ in range(3):
        _, again = run_backward(shape, hd, causal, dtype, 7, deterministic=True, variant=variant)
        for name, a, b in zip(("dq", "dk", "dv"), first, again):
            assert bool((a.view(cp.uint16) == b.view(cp.uint16)).all()), f"{name} differs between runs"


@pytest.mark.parametrize("variant", VARIANTS)
def test_strided_views_and_torch_tensors(variant):
    """dout and out as strided views (heads sliced out of a wider tensor); torch tensors through DLPack."""
    torch = pytest.importorskip("torch")
    require(variant)
    import cupy as cp
    import flashkit
    g = torch.Generator(device="cuda").manual_seed(3)
    wide = torch.randn(2, 300, 8, 64, device="cuda", generator=g, dtype=torch.bfloat16)
    q = wide[:, :, :4]
    k = torch.randn(2, 200, 2, 64, device="cuda", generator=g, dtype=torch.bfloat16)
    v = torch.randn(2, 200, 2, 64, device="cuda", generator=g, dtype=torch.bfloat16)
    dout = torch.randn(2, 300, 8, 64, device="cuda", generator=g, dtype=torch.bfloat16)[:, :, 4:]
    out, lse = flashkit.attention(q, k, v, causal=True, return_lse=True, variant="fa2")
    grads = flashkit.attention_backward(dout, q, k, v, out, lse, causal=True, variant=variant)
    inputs = tuple(cp.from_dlpack(x) for x in (q, k, v, dout))
    ok, report = judge(inputs, grads, 64, True, "bfloat16", variant)
    assert ok, report


@pytest.mark.parametrize("hd", head_dims("fa2_bwd"))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_fa2_bwd_score_mod_functor(hd, causal):
    """A drop-in score_mod functor (relative_bias, a bias) through fa2_bwd, against float64
    gradients with the functor's Python reference applied (verify/backward.py's masked checks)."""
    from flashkit.registry import discover_kernels
    from flashkit.verify.backward import MASKED_SHAPES, masked_backward_check
    require("fa2_bwd")
    spec = discover_kernels().specs["fa2_bwd"]
    for i, shape in enumerate(MASKED_SHAPES):
        dtype = DTYPES[(i + causal) % 2]
        res = masked_backward_check(spec, shape, hd, dtype, causal, "mod:relative_bias").run(
            zlib.crc32(f"fa2_bwd functor {shape}{hd}{causal}".encode()))
        assert res.passed, f"{res.label}: {res.note}"
