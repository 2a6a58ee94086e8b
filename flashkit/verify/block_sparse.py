"""Verification of block-sparse variants: every BlockMask pattern and random densities, against the reference.

The reference sees the mask as an explicit element mask (BlockMask.to_element_mask, and causal on top);
the rule is the harness's (DESIGN.md): max|out - ref| <= 2 max|plain - ref| + atol, no NaN, all written.
"""

from __future__ import annotations

import itertools
from typing import Callable

from ..call.dtypes import BY_NAME
from ..registry.manifest import KernelSpec
from ..runtime.device import cupy_module
from .harness import Check, CheckResult, Shape, judge, random_qkv, register_family
from .reference import output_atol, plain_attention, reference_attention

# Odd seqlens, seqlen_q != seqlen_k both ways, GQA and MQA, batch > 1, a one-row query, a ragged 4097.
SHAPES = (
    Shape(1, 1000, 1000, 4, 4), Shape(2, 300, 700, 4, 2), Shape(1, 777, 255, 8, 1),
    Shape(2, 1, 129, 2, 2), Shape(1, 4097, 4097, 2, 2),
)
QUICK_SHAPES = SHAPES[1:3]
DENSITIES = (1.0, 0.5, 0.25, 0.1, 0.0)
BLOCK_PATTERN = "random(0.5)"   # the block mask under which other families run a block-sparse variant (mods, functors)

MaskFactory = Callable[[Shape, int], "object"]   # (shape, seed) -> BlockMask


def block_patterns() -> dict[str, MaskFactory]:
    """Every helper pattern, and per-(batch, head) random masks at each density."""
    from ..features.block_mask import BlockMask
    xp = cupy_module()
    out: dict[str, MaskFactory] = {
        "causal-blocks": lambda s, seed: BlockMask.causal(s.seqlen_q, s.seqlen_k, xp=xp),
        "sliding_window(256)": lambda s, seed: BlockMask.sliding_window(s.seqlen_q, s.seqlen_k, width=256, xp=xp),
        "strided(3)": lambda s, seed: BlockMask.strided(s.seqlen_q, s.seqlen_k, stride=3, xp=xp),
        "fixed(4)": lambda s, seed: BlockMask.fixed(s.seqlen_q, s.seqlen_k, stride=4, xp=xp),
        "butterfly": lambda s, seed: BlockMask.butterfly(s.seqlen_q, s.seqlen_k, xp=xp),
        "random(0.5) broadcast": lambda s, seed: BlockMask.random(1, 1, s.seqlen_q, s.seqlen_k, 0.5, seed=seed,
                                                                   xp=xp),
    }
    for d in DENSITIES:
        out[f"random({d})"] = (lambda dens: lambda s, seed: BlockMask.random(
            s.batch, s.heads, s.seqlen_q, s.seqlen_k, dens, seed=seed, xp=xp))(d)
    return out


PATTERN_NAMES = ("causal-blocks", "sliding_window(256)", "strided(3)", "fixed(4)", "butterfly",
                 "random(0.5) broadcast") + tuple(f"random({d})" for d in DENSITIES)
QUICK_PATTERNS = ("sliding_window(256)", "butterfly") + tuple(f"random({d})" for d in DENSITIES)


def block_sparse_check(spec: KernelSpec, shape: Shape, head_dim: int, dtype: str, causal: bool,
                       pattern: str) -> Check:
    """One block-sparse run against the float64 reference with the mask made explicit."""
    label = f"{shape.label()} d{head_dim} {dtype} {pattern}" + (" causal" if causal else "")

    def run(seed: int) -> CheckResult:
        from ..api import attention
        xp = cupy_module()
        mask = block_patterns()[pattern](shape, seed)
        q, k, v = random_qkv(shape, head_dim, dtype, seed)
        out = xp.full(q.shape, xp.nan, dtype=q.dtype)   # poisoned: an unwritten element stays NaN
        want_lse = spec.supports("lse")
        result = attention(q, k, v, causal=causal, variant=spec.name, return_lse=want_lse, out=out,
                           block_mask=mask)
        out, lse = result if want_lse else (result, None)
        emask = mask.to_element_mask(shape.seqlen_q, shape.seqlen_k)
        scale = head_dim ** -0.5
        ref, lse_ref = reference_attention(q, k, v, scale=scale, causal=causal, mask=emask)
        plain, lse_plain = plain_attention(q, k, v, scale=scale, dtype=BY_NAME[dtype], causal=causal, mask=emask)
        note = f"density {mask.density:.3f}"
        atol = output_atol(ref, BY_NAME[dtype], max(shape.seqlen_k, head_dim))
        return judge(spec.name, label, out, ref, plain, atol, lse, lse_ref, lse_plain, note=note, head_dim=head_dim)

    return Check(spec.name, label, run)


def block_sparse_checks(spec: KernelSpec, dtypes, head_dims, causal_opts, quick: bool) -> list[Check]:
    """Every pattern over the block-sparse shapes, for each dtype, head dim and causal option."""
    shapes = QUICK_SHAPES if quick else SHAPES
    patterns = QUICK_PATTERNS if quick else PATTERN_NAMES
    return [block_sparse_check(spec, s, d, t, c, p)
            for t, d, c, s, p in itertools.product(dtypes, head_dims, causal_opts, shapes, patterns)]


register_family("block_sparse", block_sparse_checks)
