"""flashkit.bench without a GPU: shapes, FLOPs and rotation of the sweep (bench/config.py)."""

from __future__ import annotations

import pytest

from flashkit.bench import config


def test_attention_flops_formula():
    assert config.attention_flops(2, 16, 1024, 512, 128) == 4.0 * 2 * 16 * 1024 * 512 * 128
    assert config.attention_flops(2, 16, 1024, 512, 128, causal=True) == 2.0 * 2 * 16 * 1024 * 512 * 128


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_convention_shapes_keep_tokens_and_hidden(head_dim):
    shapes = config.convention_shapes(head_dims=[head_dim], causal=[False])
    assert [s.seqlen for s in shapes] == list(config.SEQLENS)
    for s in shapes:
        assert s.batch * s.seqlen == 16384
        assert s.heads * s.head_dim == 2048
        assert not s.causal


def test_convention_shapes_cover_every_combination_and_small_token_budgets():
    shapes = config.convention_shapes(causal=[False, True])
    assert len(shapes) == len(config.SEQLENS) * len(config.HEAD_DIMS) * 2
    assert {(s.head_dim, s.causal) for s in shapes} == {(d, c) for d in config.HEAD_DIMS for c in (False, True)}
    assert config.convention_shapes(seqlens=[4096], head_dims=[64], causal=[False], tokens=1024)[0].batch == 1
    with pytest.raises(ValueError, match="head_dim 4096"):
        config.convention_shapes(head_dims=[4096], hidden=2048)


@pytest.mark.parametrize("head_dim,heads", [(80, 25), (96, 21), (192, 10), (32, 64)])
def test_convention_shapes_take_the_whole_heads_of_head_dims_that_do_not_divide_hidden(head_dim, heads):
    (shape,) = config.convention_shapes(seqlens=[8192], head_dims=[head_dim], causal=[False])
    assert (shape.batch, shape.heads) == (2, heads)
    assert shape.heads * head_dim <= 2048 < (shape.heads + 1) * head_dim


def test_tflops_and_rotation():
    assert config.tflops(2e12, 1000.0) == pytest.approx(2.0)
    assert config.tflops(1.0, None) is None
    assert config.rotation_copies(192 * 2**20, 50 * 2**20) == 2            # one set already exceeds the L2
    n = config.rotation_copies(3 * 2**20, 50 * 2**20)
    assert n * 3 * 2**20 > 50 * 2**20 and (n - 1) * 3 * 2**20 <= 50 * 2**20
