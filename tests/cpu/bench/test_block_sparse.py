"""flashkit.bench without a GPU: FLOPs of the kept blocks (bench/block_sparse.py)."""

from __future__ import annotations

import numpy as np

from flashkit.bench import block_sparse, config


def test_block_sparse_flops_full_mask_equals_dense():
    blocks = np.ones((1, 1, 8, 8), dtype=bool)
    got = block_sparse.block_sparse_flops(blocks, 2, 4, 1024, 1024, 64, 128, 128)
    assert got == config.attention_flops(2, 4, 1024, 1024, 64)


def test_block_sparse_flops_counts_ragged_blocks_and_per_head_masks():
    # seqlen 300 with 128-blocks: rows/keys per block 128, 128, 44.
    blocks = np.zeros((2, 3, 3, 3), dtype=bool)
    blocks[0, 0, 2, 2] = True      # 44 x 44
    blocks[1, 2, 0, 1] = True      # 128 x 128
    blocks[1, 1, 2, 0] = True      # 44 x 128
    got = block_sparse.block_sparse_flops(blocks, 2, 3, 300, 300, 32, 128, 128)
    assert got == 4.0 * 32 * (44 * 44 + 128 * 128 + 44 * 128)
    assert block_sparse.block_sparse_flops(np.zeros((1, 1, 3, 3), bool), 2, 3, 300, 300, 32, 128, 128) == 0.0


def test_block_sparse_flops_matches_element_count_of_a_random_mask():
    from flashkit.features.block_mask import BlockMask
    mask = BlockMask.random(2, 3, 700, 500, 0.4, seed=3, block=128, xp=np)
    bq, bk = mask.block
    elements = np.broadcast_to(mask.to_element_mask(700, 500), (2, 3, 700, 500)).sum()
    assert block_sparse.block_sparse_flops(mask.dense_blocks(), 2, 3, 700, 500, 64, bq, bk) == 4.0 * 64 * elements
