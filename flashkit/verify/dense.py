"""Verification of dense variants: the shape matrix, with and without the causal mask, against the reference."""

from __future__ import annotations

import itertools

from ..call.dtypes import BY_NAME
from ..registry.manifest import KernelSpec
from ..runtime.device import cupy_module
from .harness import (DENSE, QUICK_SHAPES, SHAPES, Check, CheckResult, Shape, head_dims_label, judge, random_qkv,
                      register_family)
from .reference import output_atol, plain_attention, reference_attention


def dense_check(spec: KernelSpec, shape: Shape, head_dim: int, dtype: str, causal: bool,
                head_dim_v: int | None = None) -> Check:
    """One dense run against the float64 reference, bounded by the plain same-precision implementation (v of
    head_dim_v columns where given)."""
    label = f"{shape.label()} {head_dims_label(head_dim, head_dim_v)} {dtype}" + (" causal" if causal else "")

    def run(seed: int) -> CheckResult:
        from ..api import attention
        xp = cupy_module()
        q, k, v = random_qkv(shape, head_dim, dtype, seed, head_dim_v)
        out = xp.full(q.shape[:3] + v.shape[3:], xp.nan, dtype=q.dtype)   # poisoned: an unwritten element stays NaN
        want_lse = spec.supports("lse")
        result = attention(q, k, v, causal=causal, variant=spec.name, return_lse=want_lse, out=out)
        out, lse = result if want_lse else (result, None)
        scale = head_dim ** -0.5
        ref, lse_ref = reference_attention(q, k, v, scale=scale, causal=causal)
        plain, lse_plain = plain_attention(q, k, v, scale=scale, dtype=BY_NAME[dtype], causal=causal)
        atol = output_atol(ref, BY_NAME[dtype], max(shape.seqlen_k, head_dim))
        return judge(spec.name, label, out, ref, plain, atol, lse, lse_ref, lse_plain, head_dim=head_dim)

    return Check(spec.name, label, run)


def dense_checks(spec: KernelSpec, dtypes, head_dims, causal_opts, quick: bool) -> list[Check]:
    """The dense shape matrix for each dtype, head dim and causal option."""
    shapes = QUICK_SHAPES if quick else SHAPES
    return [dense_check(spec, s, d, t, c) for t, d, c, s in itertools.product(dtypes, head_dims, causal_opts, shapes)]


register_family(DENSE, dense_checks)
