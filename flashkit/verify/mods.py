"""Verification of the built-in modifications (window_size, attention_chunk, softcap, alibi_slopes).

An extension of the harness: every variant whose manifest declares `window`, `softcap` or `alibi` gets
these checks on top of its family's. The reference applies the same modification (verify/reference.py:
local_mask as the explicit element mask, score_mod on the scaled scores); the rule is DESIGN.md's.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

from ..call.dtypes import BY_NAME
from ..registry.manifest import KernelSpec
from ..runtime.device import cupy_module
from .block_sparse import BLOCK_PATTERN, block_patterns
from .harness import SHAPES, Check, CheckResult, Shape, head_dims_label, judge, random_qkv, register_extension
from .reference import local_mask, output_atol, plain_attention, reference_attention

ALIBI_BASE = 8.0   # the ALiBi paper's slopes: 2^(-8 (h + 1) / heads)


@dataclass(frozen=True)
class ModCase:
    """One modification setting; alibi is None, 'heads' ((heads,) slopes) or 'batch' ((batch, heads)); block None or
    a block-mask pattern of verify/block_sparse.py, under which the modification runs."""

    name: str
    causal: bool = False
    window: tuple[int, int] | None = None
    chunk: int = 0
    softcap: float = 0.0
    alibi: str | None = None
    block: str | None = None

    def features(self) -> set[str]:
        return ({"window"} if self.window is not None or self.chunk else set()) | ({"chunk"} if self.chunk else set()) | (
            {"softcap"} if self.softcap else set()) | ({"alibi"} if self.alibi else set()) | (
            {"block_sparse"} if self.block else set())

    def under_block_mask(self, pattern: str) -> "ModCase":
        return replace(self, name=f"{self.name} block:{pattern}", block=pattern)


CASES = (
    ModCase("window(256,0)", window=(256, 0)),
    ModCase("window(64,64)", window=(64, 64)),
    ModCase("window(-1,100)", window=(-1, 100)),
    ModCase("window(300,17)", window=(300, 17)),
    ModCase("causal window(200,-1)", causal=True, window=(200, -1)),
    ModCase("chunk(128)", chunk=128),
    ModCase("causal chunk(100)", causal=True, chunk=100),
    ModCase("softcap(1.5)", softcap=1.5),
    # caps below the scores (most elements saturated, slopes near 0): the backward's slopes taken from the recomputed
    # score, not from the 16-bit P (score_mod.cuh's RecomputedSlopes)
    ModCase("softcap(0.25)", softcap=0.25),
    ModCase("window(64,64)+softcap(0.5)", window=(64, 64), softcap=0.5),
    ModCase("alibi(heads)", alibi="heads"),
    ModCase("causal alibi(batch,heads)", causal=True, alibi="batch"),
    ModCase("softcap(2)+alibi", softcap=2.0, alibi="heads"),
    ModCase("softcap(0.25)+alibi", softcap=0.25, alibi="heads"),
    ModCase("window(300,17)+alibi(batch,heads)", window=(300, 17), alibi="batch"),
    ModCase("causal window(128,0)+softcap(3)+alibi", causal=True, window=(128, 0), softcap=3.0, alibi="batch"),
)
CASE_BY_NAME = {c.name: c for c in CASES}
QUICK_CASES = tuple(c for c in CASES if c.name in ("window(300,17)", "causal chunk(100)", "softcap(2)+alibi"))
QUICK_SHAPES = (Shape(2, 127, 1000, 4, 4), Shape(2, 1000, 127, 8, 8), Shape(3, 128, 128, 8, 1))
# A block-sparse forward runs every case under BLOCK_PATTERN's block mask (its manifest requires one); a backward that
# takes block masks runs BLOCK_CASES besides its unmasked ones: a window's edges, caps and slopes on listed tiles.
BLOCK_CASES = tuple(CASE_BY_NAME[name].under_block_mask(pattern) for name, pattern in (
    ("window(300,17)", "random(0.5)"), ("softcap(0.25)+alibi", "butterfly"),
    ("causal window(128,0)+softcap(3)+alibi", "sliding_window(256)"), ("causal chunk(100)", "random(0.5)")))


def alibi_base(heads: int, xp):
    """The ALiBi paper's geometric slopes 2^(-8 (h + 1) / heads), h = 0 .. heads - 1 (float64)."""
    return 2.0 ** (-ALIBI_BASE * (xp.arange(heads) + 1) / heads)


def alibi_slopes(case: ModCase, shape: Shape, seed: int, xp):
    """The ALiBi paper's geometric slopes, jittered per (batch, head) by the seed; float32."""
    rng = xp.random.default_rng(seed + 1)
    base = alibi_base(shape.heads, xp)
    rows = 1 if case.alibi == "heads" else shape.batch
    slopes = (base[None] * (0.5 + rng.random((rows, shape.heads)))).astype(xp.float32)
    return slopes[0] if case.alibi == "heads" else slopes


def case_mask(case: ModCase, shape: Shape, xp, block_mask=None):
    """The window's or chunk's explicit element mask, and the block mask's on top (its BlockMask), or None."""
    out = None if case.window is None and not case.chunk else local_mask(
        shape.seqlen_q, shape.seqlen_k, case.window or (-1, -1), case.chunk, xp)
    if block_mask is not None:
        blocks = block_mask.to_element_mask(shape.seqlen_q, shape.seqlen_k)
        out = blocks if out is None else (blocks & out)
    return out


def case_block_mask(case: ModCase, shape: Shape, seed: int):
    """The case's flashkit.BlockMask (verify/block_sparse.py's pattern), or None."""
    if case.block is None:
        return None
    return block_patterns()[case.block](shape, seed)


def mod_check(spec: KernelSpec, shape: Shape, head_dim: int, dtype: str, case: ModCase,
              head_dim_v: int | None = None) -> Check:
    """One modified run against the float64 reference with the same modification (v of head_dim_v columns); a
    backward variant's gradients against the float64 gradients of the modified attention."""
    if spec.supports("backward"):
        return backward_mod_check(spec, shape, head_dim, dtype, case, head_dim_v)
    label = f"{shape.label()} {head_dims_label(head_dim, head_dim_v)} {dtype} {case.name}"

    def run(seed: int) -> CheckResult:
        from ..api import attention
        xp = cupy_module()
        q, k, v = random_qkv(shape, head_dim, dtype, seed, head_dim_v)
        slopes = alibi_slopes(case, shape, seed, xp) if case.alibi else None
        blocks = case_block_mask(case, shape, seed)
        out = xp.full(q.shape[:3] + v.shape[3:], xp.nan, dtype=q.dtype)   # poisoned: an unwritten element stays NaN
        want_lse = spec.supports("lse")
        result = attention(q, k, v, causal=case.causal, variant=spec.name, return_lse=want_lse, out=out,
                           window_size=case.window, softcap=case.softcap, alibi_slopes=slopes,
                           attention_chunk=case.chunk, block_mask=blocks)
        out, lse = result if want_lse else (result, None)
        emask = case_mask(case, shape, xp, blocks)
        kw = dict(scale=head_dim ** -0.5, causal=case.causal, mask=emask, softcap=case.softcap, alibi_slopes=slopes)
        ref, lse_ref = reference_attention(q, k, v, **kw)
        plain, lse_plain = plain_attention(q, k, v, dtype=BY_NAME[dtype], **kw)
        atol = output_atol(ref, BY_NAME[dtype], max(shape.seqlen_k, head_dim))
        return judge(spec.name, label, out, ref, plain, atol, lse, lse_ref, lse_plain, head_dim=head_dim)

    return Check(spec.name, label, run)


def backward_mod_check(spec: KernelSpec, shape: Shape, head_dim: int, dtype: str, case: ModCase,
                       head_dim_v: int | None = None) -> Check:
    """The modified forward by the default kernel, then the variant's gradients (on NaN-poisoned memory) against
    the float64 gradients with the same modification (verify/backward.py's rule on each of dq, dk, dv); v of
    head_dim_v columns where given."""
    label = f"{shape.label()} {head_dims_label(head_dim, head_dim_v)} {dtype} {case.name} backward"

    def run(seed: int) -> CheckResult:
        from ..api import attention
        from ..backward import attention_backward
        from .backward import judge_each, poison_pool, random_dout
        from .reference_backward import plain_backward, reference_backward
        xp = cupy_module()
        q, k, v = random_qkv(shape, head_dim, dtype, seed, head_dim_v)
        dout = random_dout(q, v, seed + 2)
        slopes = alibi_slopes(case, shape, seed, xp) if case.alibi else None
        blocks = case_block_mask(case, shape, seed)
        mods = dict(window_size=case.window, softcap=case.softcap, alibi_slopes=slopes, attention_chunk=case.chunk,
                    block_mask=blocks)
        out, lse = attention(q, k, v, causal=case.causal, return_lse=True, **mods)
        poison_pool((q, k, v))
        grads = attention_backward(dout, q, k, v, out, lse, causal=case.causal, variant=spec.name, **mods)
        kw = dict(scale=head_dim ** -0.5, causal=case.causal, mask=case_mask(case, shape, xp, blocks),
                  softcap=case.softcap, alibi_slopes=slopes)
        refs = reference_backward(q, k, v, dout, **kw)
        plains = plain_backward(q, k, v, dout, dtype=BY_NAME[dtype], **kw)
        return judge_each(spec.name, label, grads, refs, plains, dtype, max(shape.seqlen_q, shape.seqlen_k))

    return Check(spec.name, label, run)


def cases_for(spec: KernelSpec, causal_opts, cases=CASES) -> list[ModCase]:
    """The cases a variant can run: it declares every feature they need, and their causal setting; under
    BLOCK_PATTERN's block mask where its manifest requires one, and with BLOCK_CASES too where a backward takes one."""
    if spec.requires.get("block_sparse"):
        cases = [c if c.block else c.under_block_mask(BLOCK_PATTERN) for c in cases]
    elif spec.supports("block_sparse") and spec.supports("backward"):
        cases = list(cases) + [c for c in BLOCK_CASES if c not in cases]
    return [c for c in cases if c.causal in causal_opts and all(spec.supports(f) for f in c.features())
            and bool(c.block) >= bool(spec.requires.get("block_sparse"))]


def mod_checks(spec: KernelSpec, dtypes, head_dims, causal_opts, quick: bool, cases=None, shapes=None) -> list[Check]:
    """Each modification case over the shape matrix (DESIGN's; a smaller set when quick), the shapes the variant
    serves under its limits (decode's windows and softcap: verify/decode.py's MOD_CASES)."""
    cases = cases_for(spec, causal_opts, cases or (QUICK_CASES if quick else CASES))
    shapes = [s for s in shapes or (QUICK_SHAPES if quick else SHAPES) if s.within(spec)]
    return [mod_check(spec, s, d, t, c) for t, d, c, s in itertools.product(dtypes, head_dims, cases, shapes)]


register_extension("mods", mod_checks)
