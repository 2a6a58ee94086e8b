"""The backward over visit lists (features/bwd_lists.py, bwd_lists.cuh): attention_backward with a block mask or a
mask_mod functor on fa3_bwd (and a block mask or a score_mod functor on fa2_bwd), against float64 gradients with the mask explicit (DESIGN.md's rule on dq, dk, dv),
from NaN-poisoned memory; every head dim class, causal and not, GQA, q != k both ways, per-head and broadcast
masks, an empty mask; deterministic=True bit for bit; the lists follow a mask_mod's array rewritten in place.
"""

from __future__ import annotations

import zlib

import pytest

from flashkit.registry import discover_kernels
from flashkit.verify.backward import MASKS, masked_backward_check, takes_mask
from flashkit.verify.harness import Shape

pytestmark = pytest.mark.gpu

# GQA 2:1 with q < k, MQA with q > k, a 4097-row causal square crossing many tiles, one query row.
SHAPES = (Shape(2, 300, 700, 4, 2), Shape(1, 777, 255, 8, 1), Shape(1, 4097, 4097, 2, 2), Shape(2, 1, 129, 2, 2))
HEAD_DIMS = (64, 128, 256, 96)   # each class (two, three consumers; columns split), one padded


def _params():
    out = []
    for i, shape in enumerate(SHAPES):
        for mask in MASKS:
            for hd in HEAD_DIMS:
                for causal in (False, True):
                    dtype = ("bfloat16", "float16")[(i + hd // 64 + causal) % 2]
                    check = masked_backward_check(discover_kernels().specs["fa3_bwd"], shape, hd, dtype, causal, mask)
                    out.append(pytest.param(check, id=check.label))
    return out


def _require(variant: str):
    from flashkit.runtime.device import device_info
    spec = discover_kernels().specs[variant]
    if not spec.runs_on(device_info().cc):
        pytest.skip(f"{variant} needs compute capability {spec.arch_requirement()}")


def _require_fa3_bwd():
    _require("fa3_bwd")


@pytest.mark.parametrize("check", _params())
def test_masked_backward_matches_reference(check):
    from flashkit.cli.verify_cmd import format_result
    _require_fa3_bwd()
    result = check.run(zlib.crc32(check.label.encode()))
    assert result.passed, format_result(result)


@pytest.mark.parametrize("mask", ["block:random(0.5)", "mod:document"])
@pytest.mark.parametrize("causal", [False, True])
def test_masked_deterministic_is_bit_identical(mask, causal):
    """Key blocks add dQ in the order of each query block's list rank: the same bits over repeated calls."""
    import cupy as cp
    import flashkit
    from flashkit.verify.backward import masked_call
    _require_fa3_bwd()
    shape, hd = Shape(2, 1000, 1000, 8, 2), 128
    rs = cp.random.RandomState(5)
    q, k, v, dout = (rs.standard_normal(s, dtype=cp.float32).astype(cp.float16) for s in
                     ((2, 1000, 8, hd), (2, 1000, 2, hd), (2, 1000, 2, hd), (2, 1000, 8, hd)))
    kw, *_ = masked_call(*mask.split(":", 1), shape, 11, cp)
    out, lse = flashkit.attention(q, k, v, causal=causal, return_lse=True, **kw)
    first = flashkit.attention_backward(dout, q, k, v, out, lse, causal=causal, deterministic=True, **kw)
    for _ in range(3):
        again = flashkit.attention_backward(dout, q, k, v, out, lse, causal=causal, deterministic=True, **kw)
        for name, a, b in zip(("dq", "dk", "dv"), first, again):
            assert bool((a.view(cp.uint16) == b.view(cp.uint16)).all()), f"{name} differs between runs"


def test_document_ids_rewritten_in_place_are_read_anew():
    """The lists are classified per call: a second call after the ids changed in place follows the new documents
    (one document, then every key its own document: dK of a key then comes from its own query alone)."""
    import cupy as cp
    import flashkit
    from flashkit.verify.backward import judge_gradients
    _require_fa3_bwd()
    b, s, h, hd = 1, 300, 2, 64
    rs = cp.random.RandomState(9)
    q, k, v, dout = (rs.standard_normal((b, s, h, hd), dtype=cp.float32).astype(cp.float16) for _ in range(4))
    ids = cp.zeros((b, s), dtype=cp.int32)
    for doc_ids in (None, cp.arange(s, dtype=cp.int32)[None] // 7):
        if doc_ids is not None:
            ids[...] = doc_ids
        kw = {"mod": "document", "mod_args": {"doc_ids": ids}}
        out, lse = flashkit.attention(q, k, v, causal=True, return_lse=True, **kw)
        grads = flashkit.attention_backward(dout, q, k, v, out, lse, causal=True, **kw)
        same_doc = (ids[0][:, None] == ids[0][None, :])[None, None]
        result = judge_gradients("fa3_bwd", "document in place", (q, k, v, dout), grads, hd, True, "float16",
                                 mask=same_doc)
        assert result.passed, result.note


CAPPED_CU = """/*---
name: NAME
kind: modification
summary: softcap as a functor - c tanh(score / c), with its derivative
functions: [score_mod, score_mod_grad]
args:
  cap: {kind: float, default: 20.0}
---*/
__device__ float score_mod(float s, int b, int h, int i, int j, const flashkit::ModArgs& a) {
    return a.floats[0] * tanhf(s / a.floats[0]);
}
// d/ds c tanh(s / c) = 1 - tanh^2 = 1 - (m / c)^2 at the modified score m
__device__ float score_mod_grad(float m, int b, int h, int i, int j, const flashkit::ModArgs& a) {
    const float t = m / a.floats[0];
    return 1.f - t * t;
}
"""
CAPPED_PY = '''
def score_mod(score, batch, head, q_idx, kv_idx, args):
    return args.cap * args.xp.tanh(score / args.cap)


def score_mod_grad(modded, batch, head, q_idx, kv_idx, args):
    return 1 - (modded / args.cap) ** 2


def sample_args(batch, heads, seqlen_q, seqlen_k, xp, rng):
    return {"cap": CAP}
'''


@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name,cap", [("capped", 2.0), ("capped_tight", 0.25)])
@pytest.mark.parametrize("variant", ["fa3_bwd", "fa2_bwd"])
def test_a_score_mod_with_a_non_unit_derivative(drop_in_functor, head_dim, causal, name, cap, variant):
    """A drop-in score_mod whose slope is not 1 (softcap written as a functor, its score_mod_grad from the modified
    score) against float64 gradients with the function and its derivative applied in the reference; at cap 2 the
    slope 1 - tanh^2 departs from 1 over most scores, at 0.25 most scores saturate (slopes near 0), where a slope read
    back from the 16-bit P fell outside the bound (score_mod.cuh's RecomputedSlopes)."""
    from flashkit.cli.verify_cmd import format_result
    _require(variant)
    drop_in_functor(name, CAPPED_CU.replace("NAME", name), CAPPED_PY.replace("CAP", repr(cap)))
    for shape in (Shape(2, 300, 700, 4, 2), Shape(1, 777, 255, 8, 1)):
        check = masked_backward_check(discover_kernels().specs[variant], shape, head_dim, "bfloat16", causal,
                                      f"mod:{name}")
        result = check.run(zlib.crc32(check.label.encode()))
        assert result.passed, format_result(result)


def _fa2_bwd_params():
    """fa2_bwd (mma.sync, any sm_80+): the block masks and the score_mod functor it takes, every head-dim class (at
    hd256: 64-key tiles, lists of their own geometry), and the sm_80 / sm_86 tiles of verify/arch_tiles.py's test."""
    spec = discover_kernels().specs["fa2_bwd"]
    masks = [m for m in MASKS if takes_mask(spec, m)]
    out = []
    for i, shape in enumerate(SHAPES):
        for mask in masks:
            for hd in (64, 128, 256):
                for causal in (False, True):
                    dtype = ("bfloat16", "float16")[(i + hd // 64 + causal) % 2]
                    check = masked_backward_check(spec, shape, hd, dtype, causal, mask)
                    out.append(pytest.param(check, id=check.label))
    return out


@pytest.mark.parametrize("check", _fa2_bwd_params())
def test_fa2_bwd_masked_backward_matches_reference(check):
    from flashkit.cli.verify_cmd import format_result
    result = check.run(zlib.crc32(check.label.encode()))
    assert result.passed, format_result(result)


@pytest.mark.parametrize("causal", [False, True])
def test_fa2_bwd_block_mask_deterministic_is_bit_identical(causal):
    """fa2_bwd adds dQ in each query block's list-rank order too: the same bits over repeated calls."""
    import cupy as cp
    import flashkit
    from flashkit.verify.backward import masked_call
    shape, hd, mask = Shape(2, 1000, 1000, 8, 2), 128, "block:random(0.5)"
    rs = cp.random.RandomState(6)
    q, k, v, dout = (rs.standard_normal(s, dtype=cp.float32).astype(cp.float16) for s in (
        (shape.batch, shape.seqlen_q, shape.heads, hd), (shape.batch, shape.seqlen_k, shape.kv_heads, hd),
        (shape.batch, shape.seqlen_k, shape.kv_heads, hd), (shape.batch, shape.seqlen_q, shape.heads, hd)))
    kw, *_ = masked_call(*mask.split(":", 1), shape, 12, cp)
    out, lse = flashkit.attention(q, k, v, causal=causal, return_lse=True, **kw)
    first = flashkit.attention_backward(dout, q, k, v, out, lse, causal=causal, deterministic=True,
                                       variant="fa2_bwd", **kw)
    for _ in range(3):
        again = flashkit.attention_backward(dout, q, k, v, out, lse, causal=causal, deterministic=True,
                                           variant="fa2_bwd", **kw)
        for name, a, b in zip(("dq", "dk", "dv"), first, again):
            assert bool((a.view(cp.uint16) == b.view(cp.uint16)).all()), f"{name} differs between runs"
