"""block_mask.py on NumPy: construction, compression against a naive loop, density, validation errors."""

from __future__ import annotations

import math

import numpy as np
import pytest

import flashkit
from flashkit.features.block_mask import BLOCK_MULTIPLE, INDEX_PAD, BlockMask, compress
from flashkit.errors import InputError, UnsupportedError
from flashkit.call.validate import Problem
from ..synth import qkv


def naive_compress(blocks: np.ndarray):
    """The compressed form by a plain loop over rows: count and ascending kept indices, -1 padded."""
    b, h, qb, kb = blocks.shape
    count = np.zeros((b, h, qb), np.int32)
    index = np.full((b, h, qb, kb), INDEX_PAD, np.int32)
    for i in range(b):
        for j in range(h):
            for r in range(qb):
                kept = [c for c in range(kb) if blocks[i, j, r, c]]
                count[i, j, r] = len(kept)
                index[i, j, r, :len(kept)] = kept
    return count, index


def naive_blocks(seqlen_q, seqlen_k, block, keep):
    """A block array from a per-element predicate keep(i, j): a block is kept if any element of it is."""
    qb, kb = math.ceil(seqlen_q / block), math.ceil(seqlen_k / block)
    out = np.zeros((qb, kb), bool)
    for r in range(qb):
        for c in range(kb):
            rows = range(r * block, min((r + 1) * block, seqlen_q))
            cols = range(c * block, min((c + 1) * block, seqlen_k))
            out[r, c] = any(keep(i, j) for i in rows for j in cols)
    return out


def problem(batch=1, seqlen_q=1000, seqlen_k=1000, heads=4, kv_heads=4, head_dim=64):
    return Problem(batch, seqlen_q, seqlen_k, heads, kv_heads, head_dim, "float16", head_dim ** -0.5)


# ---- compression -------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape,density,seed", [
    ((1, 1, 1, 1), 0.5, 0), ((2, 3, 5, 7), 0.5, 1), ((1, 4, 8, 8), 0.1, 2), ((3, 1, 9, 4), 0.9, 3),
    ((1, 1, 16, 16), 0.0, 4), ((1, 1, 16, 16), 1.0, 5), ((2, 2, 33, 65), 0.3, 6),
])
def test_compress_matches_naive_loop(shape, density, seed):
    blocks = np.random.default_rng(seed).random(shape) < density
    count, index = compress(blocks, np)
    want_count, want_index = naive_compress(blocks)
    assert count.dtype == np.int32 and index.dtype == np.int32
    assert count.shape == shape[:3] and index.shape == shape
    np.testing.assert_array_equal(count, want_count)
    np.testing.assert_array_equal(index, want_index)


def test_mask_exposes_compressed_arrays():
    blocks = np.array([[1, 0, 1], [0, 0, 0], [1, 1, 1]], bool)
    m = BlockMask.from_blocks(blocks)
    np.testing.assert_array_equal(m.kv_block_count, [[[2, 0, 3]]])
    np.testing.assert_array_equal(m.kv_block_index, [[[[0, 2, -1], [-1, -1, -1], [0, 1, 2]]]])
    assert m.shape == (1, 1, 3, 3)
    assert m.density == pytest.approx(5 / 9)


# ---- constructors ---------------------------------------------------------------------------------------

def test_default_block_is_128_and_readable():
    m = BlockMask.from_blocks(np.ones((2, 2), bool))
    assert m.block == (128, 128) and m.block_q == 128 and m.block_k == 128 and BLOCK_MULTIPLE == 128


def test_from_blocks_keeps_block_size_and_copies():
    blocks = np.zeros((1, 2, 3, 4), bool)
    blocks[0, 1, 2, 3] = True
    m = BlockMask.from_blocks(blocks, block=(256, 128))
    assert m.block == (256, 128)
    got = m.dense_blocks()
    np.testing.assert_array_equal(got, blocks)
    got[...] = True   # a copy: the mask is unchanged
    assert m.density == pytest.approx(1 / 24)


@pytest.mark.parametrize("seqlen_q,seqlen_k", [(1000, 1000), (300, 1000), (1000, 300), (1, 129), (129, 1)])
def test_causal_matches_element_definition(seqlen_q, seqlen_k):
    off = seqlen_k - seqlen_q
    want = naive_blocks(seqlen_q, seqlen_k, 128, lambda i, j: j <= i + off)
    m = BlockMask.causal(seqlen_q, seqlen_k, xp=np)
    np.testing.assert_array_equal(m.dense_blocks()[0, 0], want)


@pytest.mark.parametrize("seqlen_q,seqlen_k,width", [(1000, 1000, 256), (300, 1000, 100), (1000, 300, 1),
                                                     (700, 700, 5000)])
def test_sliding_window_matches_element_definition(seqlen_q, seqlen_k, width):
    off = seqlen_k - seqlen_q
    want = naive_blocks(seqlen_q, seqlen_k, 128, lambda i, j: abs(j - i - off) < width)
    m = BlockMask.sliding_window(seqlen_q, seqlen_k, width=width, xp=np)
    np.testing.assert_array_equal(m.dense_blocks()[0, 0], want)


def test_square_patterns_on_block_coordinates():
    n = 16 * 128
    r, c = np.arange(16)[:, None], np.arange(16)[None, :]
    strided = BlockMask.strided(n, stride=4, xp=np).dense_blocks()[0, 0]
    np.testing.assert_array_equal(strided, (r - c) % 4 == 0)
    fixed = BlockMask.fixed(n, stride=4, xp=np).dense_blocks()[0, 0]
    np.testing.assert_array_equal(fixed, (r // 4 == c // 4) | (c % 4 == 3))
    bfly = BlockMask.butterfly(n, xp=np).dense_blocks()[0, 0]
    want = np.array([[bin(i ^ j).count("1") <= 1 for j in range(16)] for i in range(16)])
    np.testing.assert_array_equal(bfly, want)
    assert bfly.sum(axis=1).tolist() == [5] * 16   # itself and log2(16) partners


@pytest.mark.parametrize("factory", [
    lambda: BlockMask.strided(777, 255, stride=3, xp=np), lambda: BlockMask.fixed(255, 777, stride=2, xp=np),
    lambda: BlockMask.butterfly(1, 4097, xp=np), lambda: BlockMask.sliding_window(1, 1, width=1, xp=np),
])
def test_patterns_fit_odd_shapes_and_keep_a_block_per_row(factory):
    m = factory()
    assert m.shape[2:] == (math.ceil(m.seqlen_q / 128), math.ceil(m.seqlen_k / 128))
    assert (m.kv_block_count >= 1).all()   # every pattern keeps the diagonal block


@pytest.mark.parametrize("density", [0.0, 0.1, 0.25, 0.5, 1.0])
def test_random_density(density):
    m = BlockMask.random(2, 4, 4096, 4096, density, seed=7, xp=np)
    assert m.shape == (2, 4, 32, 32)
    assert abs(m.density - density) < 0.03
    if density in (0.0, 1.0):
        assert m.density == density
    np.testing.assert_array_equal(m.kv_block_count, m.dense_blocks().sum(-1))


def test_random_is_seeded():
    a = BlockMask.random(1, 2, 1000, 1000, 0.5, seed=3, xp=np).dense_blocks()
    b = BlockMask.random(1, 2, 1000, 1000, 0.5, seed=3, xp=np).dense_blocks()
    c = BlockMask.random(1, 2, 1000, 1000, 0.5, seed=4, xp=np).dense_blocks()
    assert (a == b).all() and (a != c).any()


def test_from_dense_reduces_whole_blocks():
    blocks = np.random.default_rng(0).random((2, 1, 3, 4)) < 0.5
    dense = np.repeat(np.repeat(blocks, 128, axis=2), 128, axis=3)[:, :, :300, :400]
    m = BlockMask.from_dense(dense)
    np.testing.assert_array_equal(m.dense_blocks(), blocks)
    assert (m.seqlen_q, m.seqlen_k) == (300, 400)
    np.testing.assert_array_equal(m.to_element_mask(300, 400), dense)


def test_from_dense_rejects_partial_blocks():
    dense = np.ones((256, 256), bool)
    dense[130, 5] = False
    with pytest.raises(InputError, match=r"^block_mask: .*partial.*query block 1, key block 0"):
        BlockMask.from_dense(dense)


def test_from_dense_causal_ignores_hidden_elements():
    n = 512
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    window = (j <= i) & (j >= 128 * (i // 128) - 256)   # two whole blocks back, then the causal edge
    with pytest.raises(InputError):
        BlockMask.from_dense(window)
    m = BlockMask.from_dense(window, causal=True)
    r, c = np.arange(4)[:, None], np.arange(4)[None, :]
    np.testing.assert_array_equal(m.dense_blocks()[0, 0], (r - c >= 0) & (r - c <= 2))


def test_to_element_mask_expands_blocks():
    m = BlockMask.random(1, 2, 300, 200, 0.5, seed=1, xp=np)
    em = m.to_element_mask(300, 200)
    assert em.shape == (1, 2, 300, 200) and em.dtype == bool
    blocks = m.dense_blocks()
    for i, j in [(0, 0), (127, 128), (128, 199), (299, 0), (299, 199)]:
        assert (em[:, :, i, j] == blocks[:, :, i // 128, j // 128]).all()


def test_density_counts_blocks_that_exist():
    m = BlockMask.from_blocks(np.array([[[[1, 0], [0, 0]]], [[[1, 1], [1, 1]]]], bool))
    assert m.density == pytest.approx(5 / 8)


def test_compress_is_fast_for_32k():
    import time
    BlockMask.causal(32768, xp=np)
    start = time.perf_counter()
    m = BlockMask.causal(32768, xp=np)
    assert time.perf_counter() - start < 0.05
    assert m.shape == (1, 1, 256, 256)


# ---- validation --------------------------------------------------------------------------------------

@pytest.mark.parametrize("build,match", [
    (lambda: BlockMask.from_blocks(np.ones((2, 2), np.int32)), "boolean"),
    (lambda: BlockMask.from_blocks(np.ones((2, 2, 2), bool)), "shape"),
    (lambda: BlockMask.from_blocks(np.ones((1, 1, 0, 2), bool)), "shape"),
    (lambda: BlockMask.from_blocks(np.ones((2, 2), bool), block=64), "multiple of 128"),
    (lambda: BlockMask.from_blocks(np.ones((2, 2), bool), block=(128, 200)), "block_k"),
    (lambda: BlockMask.from_blocks(np.ones((2, 2), bool), seqlen_q=300), "seqlen_q=300"),
    (lambda: BlockMask.random(1, 1, 128, 128, 1.5), "density"),
    (lambda: BlockMask.random(1, 1, 0, 128, 0.5), "seqlen_q"),
    (lambda: BlockMask.sliding_window(128, width=0), "width"),
    (lambda: BlockMask.strided(128, stride=0), "stride"),
    (lambda: BlockMask.from_dense(np.ones((4, 4), np.float32)), "boolean"),
])
def test_construction_errors_name_block_mask(build, match):
    with pytest.raises(InputError, match=rf"^block_mask: .*{match}"):
        build()


@pytest.mark.parametrize("p,match", [
    (problem(seqlen_q=1200), r"seqlen_q=1200"),
    (problem(seqlen_k=2000), r"seqlen_k=2000"),
    (problem(batch=3), r"batch dimension 2 .*expected 1 or 3"),
    (problem(batch=2, heads=8, kv_heads=8), r"heads dimension 4 .*expected 1 or 8"),
])
def test_check_compatible(p, match):
    m = BlockMask.random(2, 4, 1000, 1000, 0.5, xp=np)
    with pytest.raises(InputError, match=rf"^block_mask: .*{match}"):
        m.check_compatible(p)


def test_check_compatible_accepts_broadcast_and_fitting_shapes():
    BlockMask.random(2, 4, 1000, 1000, 0.5, xp=np).check_compatible(problem(batch=2, heads=4, kv_heads=1))
    BlockMask.causal(1000, xp=np).check_compatible(problem(batch=5, heads=16, kv_heads=2))
    # Without seqlens (from_blocks), any seqlen with the same block counts fits.
    m = BlockMask.from_blocks(np.ones((8, 8), bool))
    m.check_compatible(problem(seqlen_q=897, seqlen_k=1024))
    with pytest.raises(InputError, match="expected 8 x 9"):
        m.check_compatible(problem(seqlen_q=897, seqlen_k=1025))


def test_attention_rejects_mismatched_mask_before_compile():
    q, k, v = qkv((2, 17, 4, 64), (2, 33, 4, 64))
    with pytest.raises(InputError, match=r"^block_mask: "):
        flashkit.attention(q, k, v, block_mask=BlockMask.causal(1000, xp=np))
    with pytest.raises(InputError, match=r"^block_mask: expected a flashkit.BlockMask"):
        flashkit.attention(q, k, v, block_mask=np.ones((1, 1), bool))


def test_registry_selects_block_sparse_only_with_a_mask():
    sel = flashkit.explain(dtype="bfloat16", head_dim=128, block_sparse=True, causal=True, cc=(9, 0))
    assert sel.chosen.name == "block_sparse_hopper"   # the TMA core on Hopper
    ampere = flashkit.explain(dtype="bfloat16", head_dim=128, block_sparse=True, causal=True, cc=(8, 0))
    assert ampere.chosen.name == "block_sparse"
    plain = flashkit.explain(dtype="bfloat16", head_dim=128, cc=(9, 0))
    assert plain.chosen.name != "block_sparse"
    assert any("block_sparse=True" in r for r in plain.rejected["block_sparse"])
    with pytest.raises(UnsupportedError):
        flashkit.explain(dtype="bfloat16", head_dim=128, block_sparse=True, variant="fa2", cc=(9, 0))


def test_module_imports_without_a_gpu():
    import importlib
    import sys
    for name in ("flashkit.features.block_mask", "flashkit.verify.block_sparse"):
        sys.modules.pop(name, None)
        importlib.import_module(name)
    assert flashkit.BlockMask is BlockMask or flashkit.BlockMask.__name__ == "BlockMask"
