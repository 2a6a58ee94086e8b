"""Zigzag sharding: shard r holds chunks r and 2W-1-r; shard/unshard round-trips (NumPy; torch if installed)."""

from __future__ import annotations

import numpy as np
import pytest

from flashkit.errors import InputError
from flashkit.distributed import shard_zigzag, unshard_zigzag, zigzag_permutation, zigzag_positions
from flashkit.distributed.sharding import zigzag_chunks


@pytest.mark.parametrize("world", [1, 2, 3, 4, 8])
def test_round_trip_numpy(world):
    x = np.random.default_rng(world).standard_normal((2, 2 * world * 3, 4, 8))
    shards = [shard_zigzag(x, r, world) for r in range(world)]
    assert all(s.shape == (2, 6, 4, 8) for s in shards)
    np.testing.assert_array_equal(unshard_zigzag(shards), x)


@pytest.mark.parametrize("world", [1, 2, 4])
def test_shard_rows_are_the_zigzag_chunks(world):
    n = 2 * world * 5
    x = np.arange(n)[None, :, None, None]
    for r in range(world):
        a, b = zigzag_chunks(r, world)
        assert (a, b) == (r, 2 * world - 1 - r)
        got = shard_zigzag(x, r, world)[0, :, 0, 0]
        np.testing.assert_array_equal(got, zigzag_positions(r, world, n))
        np.testing.assert_array_equal(got[:5], np.arange(a * 5, a * 5 + 5))
        np.testing.assert_array_equal(got[5:], np.arange(b * 5, b * 5 + 5))


def test_permutation_covers_every_position_once():
    perm = zigzag_permutation(48, 4)
    np.testing.assert_array_equal(np.sort(perm), np.arange(48))
    x = np.arange(48)
    np.testing.assert_array_equal(np.concatenate([shard_zigzag(x, r, 4, dim=0) for r in range(4)]), x[perm])


def test_other_dims_and_negative_dim():
    x = np.random.default_rng(0).standard_normal((3, 2, 16))   # lse layout (batch, heads, seqlen)
    shards = [shard_zigzag(x, r, 2, dim=-1) for r in range(2)]
    np.testing.assert_array_equal(unshard_zigzag(shards, dim=2), x)


@pytest.mark.parametrize("seqlen,world", [(10, 2), (6, 4), (7, 1)])
def test_seqlen_not_divisible_by_twice_the_world(seqlen, world):
    with pytest.raises(InputError, match=f"divisible by {2 * world}"):
        shard_zigzag(np.zeros((1, seqlen, 1, 8)), 0, world)


def test_bad_rank_and_shards():
    x = np.zeros((1, 8, 1, 8))
    with pytest.raises(InputError, match="rank"):
        shard_zigzag(x, 2, 2)
    with pytest.raises(InputError, match="world_size"):
        shard_zigzag(x, 0, 0)
    with pytest.raises(InputError, match="same length"):
        unshard_zigzag([np.zeros((1, 4, 1, 8)), np.zeros((1, 6, 1, 8))])
    with pytest.raises(InputError, match="even"):
        unshard_zigzag([np.zeros((1, 3, 1, 8))])
    with pytest.raises(InputError, match="none"):
        unshard_zigzag([])


def test_round_trip_torch():
    torch = pytest.importorskip("torch", reason="torch is an optional extra: the torch round trip needs it")
    x = torch.randn(2, 24, 3, 8)
    shards = [shard_zigzag(x, r, 3) for r in range(3)]
    assert all(isinstance(s, torch.Tensor) and s.is_contiguous() for s in shards)
    assert torch.equal(unshard_zigzag(shards), x)
