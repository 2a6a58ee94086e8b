"""Block-sparse runs of the sweep: a random BlockMask per density, and FLOPs of its kept blocks only."""

from __future__ import annotations

from typing import Any

import numpy as np

from .config import BenchConfig, BenchShape
from .run import register_mask


def block_sparse_flops(dense_blocks: Any, batch: int, heads: int, seqlen_q: int, seqlen_k: int,
                       head_dim: int, block_q: int, block_k: int) -> float:
    """Forward FLOPs of the kept blocks only: 4 * D * sum over kept (i, j) of rows_i * keys_j, per (b, h).

    dense_blocks: boolean (B|1, H|1, q_blocks, k_blocks); ragged last blocks count only what exists.
    """
    blocks = np.asarray(dense_blocks.get() if hasattr(dense_blocks, "get") else dense_blocks, dtype=bool)
    qb, kb = blocks.shape[-2:]
    rows = np.minimum(block_q, seqlen_q - np.arange(qb) * block_q).astype(np.float64)
    keys = np.minimum(block_k, seqlen_k - np.arange(kb) * block_k).astype(np.float64)
    per_mask = np.einsum("bhij,i,j->bh", blocks.astype(np.float64), rows, keys)
    per_mask = np.broadcast_to(per_mask, (batch, heads))
    return 4.0 * head_dim * float(per_mask.sum())


def random_mask(shape: BenchShape, config: BenchConfig) -> tuple[Any, float] | None:
    """The mask of a block-sparse shape (density set) and its FLOPs; None for a dense shape."""
    if shape.density is None:
        return None
    from ..features.block_mask import BlockMask
    mask = BlockMask.random(shape.batch, shape.heads, shape.seqlen, shape.seqlen, shape.density,
                            seed=config.seed, block=config.block)
    bq, bk = mask.block
    flops = block_sparse_flops(mask.dense_blocks(), shape.batch, shape.heads, shape.seqlen, shape.seqlen,
                               shape.head_dim, bq, bk)
    return mask, flops


register_mask(random_mask)
