"""features/kv_cache.py: every argument of attention_with_kvcache checked on metadata, one InputError naming it."""

from __future__ import annotations

import numpy as np
import pytest

from flashkit.call.arrays import ArrayMeta
from flashkit.errors import InputError
from flashkit.features.kv_cache import validate_kvcache


def meta(name, shape, dtype=np.float16, strides=None):
    if strides is None:
        strides = tuple(int(s) for s in np.cumprod((1,) + tuple(shape)[::-1][:-1])[::-1])
    return ArrayMeta(name, tuple(shape), np.dtype(dtype), tuple(strides), True, "cupy.ndarray", 0)


def args(**over):
    base = dict(q=meta("q", (2, 1, 8, 64)), k_cache=meta("k_cache", (6, 16, 2, 64)),
                v_cache=meta("v_cache", (6, 16, 2, 64)), cache_seqlens=meta("cache_seqlens", (2,), np.int32),
                block_table=meta("block_table", (2, 3), np.int32), k_new=None, v_new=None, softmax_scale=None)
    base.update(over)
    return base


def test_a_paged_call_is_described():
    call = validate_kvcache(**args())
    assert call.paged and call.page_size == 16 and call.problem.seqlen_k == 48 and call.num_blocks == 6
    assert call.problem.kv_heads == 2 and call.problem.heads == 8


def test_a_contiguous_cache_has_its_rows_as_capacity():
    call = validate_kvcache(**args(k_cache=meta("k_cache", (2, 100, 2, 64)), v_cache=meta("v_cache", (2, 100, 2, 64)),
                                   block_table=None))
    assert not call.paged and call.problem.seqlen_k == 100


@pytest.mark.parametrize("over, match", [
    (dict(block_table=meta("block_table", (2, 3), np.int64)), "block_table: expected dtype int32"),
    (dict(block_table=meta("block_table", (3, 3), np.int32)), "block_table: expected shape"),
    (dict(block_table=meta("block_table", (2, 3), np.int32, strides=(6, 2))), "block_table: expected a contiguous"),
    (dict(cache_seqlens=meta("cache_seqlens", (2,), np.int64)), "cache_seqlens: expected dtype int32"),
    (dict(cache_seqlens=meta("cache_seqlens", (3,), np.int32)), "cache_seqlens: expected shape"),
    (dict(k_cache=meta("k_cache", (6, 8, 2, 64)), v_cache=meta("v_cache", (6, 8, 2, 64))), "page_size"),
    (dict(k_cache=meta("k_cache", (6, 512, 2, 64)), v_cache=meta("v_cache", (6, 512, 2, 64))), "page_size"),
    (dict(k_cache=meta("k_cache", (6, 24, 2, 64)), v_cache=meta("v_cache", (6, 24, 2, 64))), "page_size"),
    (dict(v_cache=meta("v_cache", (6, 16, 2, 32))), "v_cache: expected the shape"),
    (dict(k_cache=meta("k_cache", (6, 16, 3, 64)), v_cache=meta("v_cache", (6, 16, 3, 64))), "kv heads"),
    (dict(k_cache=meta("k_cache", (6, 16, 2, 64), np.float32)), "k_cache: dtype must match"),
    (dict(q=meta("q", (2, 1, 8, 64), np.float32)), "q: dtype"),
    (dict(k_cache=meta("k_cache", (6, 16, 2, 64), strides=(2048, 128, 64, 2))), "k_cache: the last"),
    (dict(k_cache=meta("k_cache", (6, 16, 2, 64), strides=(2052, 132, 66, 1))), "k_cache: strides"),
    (dict(k_new=meta("k_new", (2, 1, 2, 64))), "k_new, v_new: pass both"),
    (dict(k_new=meta("k_new", (2, 1, 2, 64)), v_new=meta("v_new", (2, 1, 4, 64))), "v_new: expected shape"),
    (dict(k_new=meta("k_new", (2, 49, 2, 64)), v_new=meta("v_new", (2, 49, 2, 64))), "capacity"),
    (dict(block_table=None), "k_cache: batch must match"),
    (dict(q=meta("q", (2, 1, 8))), "q: expected 4 dims"),
])
def test_every_bad_argument_is_named(over, match):
    with pytest.raises(InputError, match=match):
        validate_kvcache(**args(**over))
