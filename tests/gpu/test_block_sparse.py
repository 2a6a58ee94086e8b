"""The block-sparse variants (block_sparse on mma.sync, block_sparse_hopper on the TMA core) on a GPU: every mask pattern against the reference, empty rows, mask building speed,
and work that scales with density."""

from __future__ import annotations


import numpy as np
import pytest

import flashkit
from flashkit.features.block_mask import BlockMask, compress
from flashkit.verify.block_sparse import block_sparse_checks
from flashkit.registry import discover_kernels

pytestmark = pytest.mark.gpu

SPECS = [discover_kernels().get(name) for name in ("block_sparse", "block_sparse_hopper")]
QUICK = [c for s in SPECS for c in block_sparse_checks(s, s.dtypes, s.head_dims.examples(), (False, True), quick=True)]
# The full pattern set on one dtype / head dim (the 4097 shape included).
FULL = [c for s in SPECS for c in block_sparse_checks(s, ("bfloat16",), (128,), (False, True), quick=False)]


def _run(check, seed=0):
    from flashkit.runtime.device import device_info
    spec = discover_kernels().get(check.variant)
    if not spec.runs_on(device_info().cc):
        pytest.skip(f"{spec.name} needs compute capability {spec.arch_requirement()}")
    res = check.run(seed)
    assert res.passed, f"{res.label}: err {res.max_error:.3g} > bound {res.bound:.3g}; lse err {res.lse_error} " \
                       f"> {res.lse_bound}; {res.note}"


@pytest.mark.parametrize("check", QUICK, ids=[f"{c.variant}: {c.label}" for c in QUICK])
def test_quick_matrix(check):
    _run(check)


@pytest.mark.parametrize("check", FULL, ids=[f"{c.variant}: {c.label}" for c in FULL])
def test_every_pattern(check):
    _run(check, seed=1)


def _qkv(b, sq, sk, h, hk, d, dtype="bfloat16", seed=0):
    from flashkit.verify.harness import Shape, random_qkv
    return random_qkv(Shape(b, sq, sk, h, hk), d, dtype, seed)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_dropped_rows_give_zero_and_minus_inf(causal, head_dim):
    import cupy
    q, k, v = _qkv(2, 300, 500, 4, 2, head_dim)
    blocks = np.ones((2, 4, 3, 4), bool)
    blocks[0, 1, 1, :] = False           # query block 1 of (batch 0, head 1) keeps nothing
    blocks[1, :, 0, :] = False           # query block 0 of batch 1 keeps nothing
    mask = BlockMask.from_blocks(cupy.asarray(blocks))
    out, lse = flashkit.attention(q, k, v, block_mask=mask, causal=causal, return_lse=True)
    out32 = out.astype(cupy.float32)
    assert not bool(cupy.isnan(out32).any()) and not bool(cupy.isnan(lse).any())
    assert bool((out32[0, 128:256, 1] == 0).all()) and bool((lse[0, 1, 128:256] == -cupy.inf).all())
    assert bool((out32[1, :128] == 0).all()) and bool((lse[1, :, :128] == -cupy.inf).all())
    assert bool(cupy.isfinite(lse[0, 0]).all())


def test_all_dropped_mask_with_causal_above_the_diagonal():
    """Blocks kept only above the causal diagonal: nothing is visible, so O = 0 and LSE = -inf everywhere."""
    import cupy
    q, k, v = _qkv(1, 512, 512, 2, 2, 128)
    blocks = cupy.triu(cupy.ones((4, 4), bool), k=1)
    out, lse = flashkit.attention(q, k, v, block_mask=BlockMask.from_blocks(blocks), causal=True, return_lse=True)
    assert bool((out.astype(cupy.float32) == 0).all())
    assert bool((lse == -cupy.inf).all())


def test_gpu_compression_matches_numpy():
    import cupy
    blocks = np.random.default_rng(0).random((2, 3, 37, 41)) < 0.3
    count, index = compress(cupy.asarray(blocks), cupy)
    want_count, want_index = compress(blocks, np)
    np.testing.assert_array_equal(cupy.asnumpy(count), want_count)
    np.testing.assert_array_equal(cupy.asnumpy(index), want_index)


def test_mask_is_reused_across_calls():
    q, k, v = _qkv(1, 1000, 1000, 4, 4, 64)
    mask = BlockMask.random(1, 4, 1000, 1000, 0.5, seed=3)
    a = flashkit.attention(q, k, v, block_mask=mask)
    count, index = mask.device_arrays()
    b = flashkit.attention(q, k, v, block_mask=mask)
    assert mask.device_arrays()[0] is count and mask.device_arrays()[1] is index
    assert bool((a == b).all())


