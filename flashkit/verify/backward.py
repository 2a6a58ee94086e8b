"""Verification of backward variants: dq, dk, dv of the shape matrix against float64 gradients.

Each gradient passes DESIGN's rule on its own: max|g - ref| <= 2 max|plain - ref| + atol, with `plain`
the same backward computed in the input precision (P and dS rounded to it) and no NaN or Inf (the
gradients land on NaN-poisoned memory, so an unwritten element fails).
"""

from __future__ import annotations

import itertools

from ..call.dtypes import BY_NAME
from ..registry.manifest import KernelSpec
from ..runtime.device import cupy_module
from .harness import ERROR_FACTOR, QUICK_SHAPES, SHAPES, Check, CheckResult, Shape, random_qkv, register_family
from .reference import output_atol
from .reference_backward import plain_backward, reference_backward

GRADIENTS = ("dq", "dk", "dv")


def poison_pool(arrays) -> None:
    """Fill, then free, blocks of the gradients' sizes, so that the gradients land on NaN-filled memory."""
    xp = cupy_module()
    junk = [xp.empty(a.shape, dtype=a.dtype) for a in arrays]
    for j in junk:
        j.view(xp.uint8).fill(0xFF)   # NaN in float16 and bfloat16
    del junk


def judge_gradients(variant: str, label: str, inputs, grads, head_dim: int, causal: bool, dtype: str) -> CheckResult:
    """The rule on each of dq, dk, dv; the result carries the gradient closest to (or furthest past) its bound."""
    xp = cupy_module()
    q, k, v, dout = inputs
    scale = head_dim ** -0.5
    refs = reference_backward(q, k, v, dout, scale=scale, causal=causal)
    plains = plain_backward(q, k, v, dout, scale=scale, dtype=BY_NAME[dtype], causal=causal)
    worst, notes, passed = (0.0, 0.0, -1.0), [], True
    for name, g, ref, plain in zip(GRADIENTS, grads, refs, plains):
        g64 = g.astype(xp.float32).astype(xp.float64)
        finite = bool(xp.isfinite(g64).all())
        err = float(xp.abs(g64 - ref).max()) if finite else float("nan")
        atol = output_atol(ref, BY_NAME[dtype], max(q.shape[1], k.shape[1]))
        bound = ERROR_FACTOR * float(xp.abs(plain.astype(xp.float64) - ref).max()) + atol
        ok = finite and err <= bound
        passed &= ok
        ratio = err / bound if finite and bound > 0 else float("inf")
        if ratio > worst[2]:
            worst = (err, bound, ratio)
        notes.append(f"{name} {err:.3g}/{bound:.3g}" + ("" if finite else " NaN/Inf or unwritten"))
    return CheckResult(variant, label, worst[0], worst[1], None, None, passed, "; ".join(notes))


def backward_check(spec: KernelSpec, shape: Shape, head_dim: int, dtype: str, causal: bool) -> Check:
    """One backward run (forward by the default kernel, then the variant's gradients) against float64 autograd."""
    label = f"{shape.label()} d{head_dim} {dtype}" + (" causal" if causal else "") + " backward"

    def run(seed: int) -> CheckResult:
        from ..api import attention
        from ..backward import attention_backward
        xp = cupy_module()
        q, k, v = random_qkv(shape, head_dim, dtype, seed)
        dout = xp.random.default_rng(seed + 1).standard_normal(q.shape, dtype=xp.float32).astype(q.dtype)
        out, lse = attention(q, k, v, causal=causal, return_lse=True)
        poison_pool((q, k, v))
        grads = attention_backward(dout, q, k, v, out, lse, causal=causal, variant=spec.name)
        return judge_gradients(spec.name, label, (q, k, v, dout), grads, head_dim, causal, dtype)

    return Check(spec.name, label, run)


def backward_checks(spec: KernelSpec, dtypes, head_dims, causal_opts, quick: bool) -> list[Check]:
    """The shape matrix for each dtype, head dim and causal option, through the backward."""
    shapes = QUICK_SHAPES if quick else SHAPES
    return [backward_check(spec, s, d, t, c)
            for t, d, c, s in itertools.product(dtypes, head_dims, causal_opts, shapes)]


register_family("backward", backward_checks, by_support=True)
