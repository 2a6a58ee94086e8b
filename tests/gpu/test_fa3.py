"""fa3, the warp-specialized Hopper forward: lengths at every tile boundary +- 1, strided views read in place
through TMA, and the tensor-map cache. Skips off compute capability 9.0."""

from __future__ import annotations

import pytest

from flashkit.registry import discover_kernels
from flashkit.verify import Shape
from flashkit.verify.dense import dense_check

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def fa3():
    from flashkit.runtime.device import device_info
    spec = discover_kernels().get("fa3")
    cc = device_info().cc
    if not spec.runs_on(cc):
        pytest.skip(f"fa3 needs compute capability {spec.arch_requirement()}; this device has {cc[0]}.{cc[1]}")
    return spec


def _boundary_lengths(tile: int) -> list[int]:
    return [n for t in (tile, 2 * tile) for n in (t - 1, t, t + 1)]


@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_tile_boundaries(fa3, head_dim, causal):
    """seqlen_q and seqlen_k at every multiple of block_m / block_n (and 2x) +- 1, both ways."""
    from flashkit.runtime.device import device_info
    cfg = fa3.launch_config(device_info().cc, head_dim)
    lengths_q, lengths_k = _boundary_lengths(cfg["block_m"]), _boundary_lengths(cfg["block_n"])
    failures = []
    for i, (sq, sk) in enumerate(zip(lengths_q, lengths_k[::-1])):
        for shape in (Shape(2, sq, sk, 4, 2), Shape(1, sk, sq, 2, 1)):
            result = dense_check(fa3, shape, head_dim, "bfloat16", causal).run(1000 + i)
            if not result.passed:
                failures.append(f"{result.label}: error {result.max_error:.3g} > {result.bound:.3g} {result.note}")
    assert not failures, "\n".join(failures)


def test_strided_views_read_in_place(fa3):
    """q, k, v sliced out of one packed (batch, seqlen, 3, heads, D) tensor: TMA reads them as they are."""
    import cupy as cp
    import ml_dtypes
    from flashkit import attention
    rng = cp.random.default_rng(7)
    qkv = rng.standard_normal((2, 333, 3, 4, 128), dtype=cp.float32).astype(ml_dtypes.bfloat16)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    assert not q.flags.c_contiguous
    out = attention(q, k, v, causal=True, variant="fa3")
    want = attention(cp.ascontiguousarray(q), cp.ascontiguousarray(k), cp.ascontiguousarray(v), causal=True,
                     variant="fa3")
    assert cp.array_equal(out.view(cp.uint16), want.view(cp.uint16))


def test_repeated_calls_encode_nothing(fa3):
    """The second call with the same arrays finds all four tensor maps in the cache."""
    import cupy as cp
    import ml_dtypes
    from flashkit import attention
    from flashkit.runtime.tma import encode
    rng = cp.random.default_rng(3)
    q, k, v = (rng.standard_normal((1, 256, 2, 64), dtype=cp.float32).astype(ml_dtypes.bfloat16) for _ in range(3))
    out = cp.empty_like(q)
    attention(q, k, v, out=out, variant="fa3")
    before = encode.cache_info()
    attention(q, k, v, out=out, variant="fa3")
    after = encode.cache_info()
    assert after.misses == before.misses and after.hits == before.hits + 4
