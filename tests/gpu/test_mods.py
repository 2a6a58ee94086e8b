"""The built-in modifications (window_size, attention_chunk, softcap, alibi_slopes) on the forward kernels (the
block-sparse ones under a block mask) and the backward (fa2_bwd, fa3_bwd: dq, dk, dv; with block masks too), against the float64 reference with the same modification (DESIGN.md's
rule), over the shape matrix: fp16/bf16, hd 64/128 (256 on the Hopper kernels, whose hd256 builds take the row max
before softcap or ALiBi: max_first), each modification and combinations (window + causal, chunk + causal, softcap +
alibi, all together).
"""

from __future__ import annotations

import zlib

import pytest

from flashkit.registry import discover_kernels
from flashkit.verify.harness import Shape
from flashkit.verify.mods import mod_checks

pytestmark = pytest.mark.gpu

# DESIGN's matrix, trimmed: a one-row query, batch > 1, odd lengths, seqlen_q != seqlen_k both ways, GQA 8:1, MQA.
SHAPES = (Shape(1, 1, 1, 1, 1), Shape(2, 17, 17, 4, 4), Shape(3, 128, 128, 8, 1), Shape(1, 1000, 1000, 16, 2),
          Shape(2, 127, 1000, 4, 4), Shape(2, 1000, 127, 8, 8), Shape(1, 17, 4097, 8, 1))


# The block-sparse forwards' (every case under a block mask, verify/mods.py's BLOCK_PATTERN): a one-row query, GQA 8:1,
# seqlen_q != seqlen_k both ways, many tiles.
BLOCK_SHAPES = (Shape(2, 1, 129, 2, 2), Shape(3, 128, 128, 8, 1), Shape(2, 127, 1000, 4, 4), Shape(2, 1000, 127, 8, 8),
                Shape(1, 1000, 1000, 16, 2))

# The backward's: tile edges (64-query, 64/128/192-key blocks), seqlen_q != seqlen_k both ways, GQA 8:1.
BACKWARD_SHAPES = (Shape(2, 17, 17, 4, 4), Shape(3, 128, 128, 8, 1), Shape(1, 300, 300, 2, 2),
                   Shape(2, 127, 1000, 4, 4), Shape(2, 1000, 127, 8, 8))
HEAD_DIMS = {"fa2_bwd": [64, 128], "fa3_bwd": [64, 128, 256], "fa3": [64, 128, 256], "block_sparse_hopper": [64, 128, 256]}


def _params():
    specs = discover_kernels().specs
    out = []
    for name in ("fa2", "causal", "fa3", "block_sparse", "block_sparse_hopper", "fa2_bwd", "fa3_bwd"):
        spec = specs[name]
        backward = spec.supports("backward")
        shapes = BACKWARD_SHAPES if backward else BLOCK_SHAPES if name.startswith("block_sparse") else SHAPES
        checks = mod_checks(spec, ["float16", "bfloat16"], HEAD_DIMS.get(name, [64, 128]),
                            spec.causal_options(), quick=False, shapes=shapes)
        assert checks, name
        out += [pytest.param(name, c, id=f"{name}: {c.label}") for c in checks]
    return out


@pytest.mark.parametrize("variant,check", _params())
def test_mods(variant, check):
    from flashkit.cli.verify_cmd import format_result
    from flashkit.runtime.device import device_info
    spec = discover_kernels().get(variant)
    if not spec.runs_on(device_info().cc):
        pytest.skip(f"{variant} needs compute capability {spec.arch_requirement()}")
    result = check.run(zlib.crc32(check.label.encode()))
    assert result.variant == variant and result.passed, format_result(result)


def test_window_skips_tiles_and_matches_dense_when_unbounded():
    """window (-1, -1) is the plain kernel; a window reaching every key gives the dense answer bit for bit."""
    import cupy

    import flashkit
    rng = cupy.random.default_rng(1)
    q, k, v = (rng.standard_normal((1, 300, 2, 64), dtype=cupy.float32).astype(cupy.float16) for _ in range(3))
    dense = flashkit.attention(q, k, v, causal=True, variant="causal")   # the same kernel (fa3 differs on Hopper)
    wide = flashkit.attention(q, k, v, causal=True, window_size=(10**6, 0), variant="causal")
    assert bool((dense == wide).all())   # same tiles in the same order: the same sums
    assert bool((flashkit.attention(q, k, v, window_size=(-1, -1), variant="fa2")
                 == flashkit.attention(q, k, v, variant="fa2")).all())


@pytest.mark.parametrize("variant", ["fa2_bwd", "fa3_bwd"])
def test_backward_window_deterministic_is_bit_identical(variant):
    """deterministic=True with a window: each query block's dQ waits only for the key blocks that visit it (the
    first from the mask, bwd_mask.cuh), so the run ends, and two runs agree bit for bit."""
    import cupy

    import flashkit
    from flashkit.backward import attention_backward
    from flashkit.runtime.device import device_info
    if not discover_kernels().get(variant).runs_on(device_info().cc):
        pytest.skip(f"{variant} does not run here")
    from flashkit.call.dtypes import BY_NAME
    rng = cupy.random.default_rng(7)
    q, k, v, dout = (rng.standard_normal((2, 700, 4, 128), dtype=cupy.float32).astype(BY_NAME["bfloat16"].storage)
                     for _ in range(4))
    kw = dict(causal=True, window_size=(150, 0), softcap=20.0)
    out, lse = flashkit.attention(q, k, v, return_lse=True, **kw)
    runs = [attention_backward(dout, q, k, v, out, lse, deterministic=True, variant=variant, **kw) for _ in range(2)]
    for a, b in zip(*runs):
        assert bool((a.view(cupy.uint16) == b.view(cupy.uint16)).all())

