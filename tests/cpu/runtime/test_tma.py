"""runtime/tma.py without a GPU: the tensor-map geometry of contract tensors and what TMA cannot describe."""

from __future__ import annotations

import pytest

from flashkit.runtime.tma import MapGeometry, map_geometry, transposed_v_geometry

BF16 = 2


def contiguous(batch, seqlen, heads, head_dim, item=BF16):
    return (seqlen * heads * head_dim * item, heads * head_dim * item, head_dim * item, item)


def test_contiguous_tensor():
    g = map_geometry(1 << 20, (2, 100, 4, 128), contiguous(2, 100, 4, 128), BF16, "bfloat16", 128)
    assert g == MapGeometry("bfloat16", 1 << 20, (128, 100, 4, 2), (1024, 256, 102400), (64, 128, 1, 1))


def test_packed_qkv_view_is_described_in_place():
    """q of a (batch, seqlen, 3, heads, D) tensor: row stride 3 * heads * D elements."""
    b, s, h, d = 2, 333, 4, 128
    strides = (s * 3 * h * d * BF16, 3 * h * d * BF16, d * BF16, BF16)
    g = map_geometry(4096, (b, s, h, d), strides, BF16, "bfloat16", 64)
    assert g.strides == (3 * h * d * BF16, d * BF16, s * 3 * h * d * BF16) and g.box == (64, 64, 1, 1)


def test_extent_one_dimensions_take_any_stride():
    """A dimension of extent 1 is never stepped: an odd stride there is replaced by a valid one."""
    g = map_geometry(0, (1, 10, 1, 64), (7, 130 * 64, 3, BF16), BF16, "float16", 64)
    assert g.strides[1] % 16 == 0 and g.strides[2] % 16 == 0


@pytest.mark.parametrize("address,strides,dtype,rows,why", [
    (8, contiguous(2, 10, 2, 64), "bfloat16", 64, "base address"),
    (0, (10 * 2 * 72, 2 * 72, 72, BF16), "bfloat16", 64, "16-byte units"),
    (0, (2 * 10 * 2 * 64 * BF16, 2 * 64 * BF16 + 2, 64 * BF16, BF16), "bfloat16", 64, "row stride"),
    (0, contiguous(2, 10, 2, 64), "float32", 64, "TMA maps take"),
    (0, contiguous(2, 10, 2, 64), "bfloat16", 512, "box rows"),
])
def test_what_tma_cannot_describe(address, strides, dtype, rows, why):
    head_dim = strides[2] // BF16 if why == "16-byte units" else 64
    with pytest.raises(ValueError, match=why):
        map_geometry(address, (2, 10, 2, head_dim), strides, BF16, dtype, rows)


def test_a_head_dim_inside_a_panel_keeps_the_panel_box():
    """hd96 of bf16 (192 B): two 64-element boxes, the second read past the end as TMA's zero fill."""
    g = map_geometry(0, (2, 10, 2, 96), contiguous(2, 10, 2, 96), BF16, "bfloat16", 128)
    assert g.dims[0] == 96 and g.box == (64, 128, 1, 1)


@pytest.mark.parametrize("block_n,swizzle", [(128, 128), (64, 64)])
def test_transposed_v_in_the_workspace(block_n, swizzle):
    """fp8's V^T (batch, kv_heads, head_dim, keys padded to block_n), 1-byte keys: a box of one tile's keys (a 128-
    or 64-byte panel, swizzled alike) by every head-dim row."""
    g = transposed_v_geometry("float8_e4m3", 1, 2, 3, 256, 300, block_n, 256)
    keys = -(-300 // block_n) * block_n
    assert g.dims == (keys, 256, 3, 2) and g.strides == (keys, 256 * keys, 3 * 256 * keys)
    assert g.box == (block_n, 256, 1, 1) and g.swizzle == swizzle and g.address == 0


def test_panels_are_128_or_64_bytes():
    with pytest.raises(ValueError, match="panels of"):
        map_geometry(0, (2, 10, 2, 64), contiguous(2, 10, 2, 64), BF16, "bfloat16", 64, panel_bytes=32)
