"""Verification of backward variants: dq, dk, dv of the shape matrix against float64 gradients, and, for a
variant declaring varlen, of packed batches (attention_varlen_backward) against each sequence's own.

Each gradient passes DESIGN's rule on its own: max|g - ref| <= 2 max|plain - ref| + atol, with `plain`
the same backward computed in the input precision (P and dS rounded to it) and no NaN or Inf (the
gradients land on NaN-poisoned memory, so an unwritten element fails).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from ..call.arrays import array_module
from ..call.dtypes import BY_NAME
from ..registry.manifest import KernelSpec
from ..runtime.device import cupy_module
from .harness import (ERROR_FACTOR, QUICK_SHAPES, SHAPES, Check, CheckResult, Shape, head_dims_label, random_qkv,
                      register_family)
from .reference import output_atol
from .reference_backward import plain_backward, reference_backward
from .varlen import packed_qkv

GRADIENTS = ("dq", "dk", "dv")


def poison_pool(arrays) -> None:
    """Fill, then free, blocks of the gradients' sizes, so that the gradients land on NaN-filled memory."""
    xp = cupy_module()
    junk = [xp.empty(a.shape, dtype=a.dtype) for a in arrays]
    for j in junk:
        j.view(xp.uint8).fill(0xFF)   # NaN in float16 and bfloat16
    del junk


def judge_gradients(variant: str, label: str, inputs, grads, head_dim: int, causal: bool, dtype: str,
                    mask=None, score_fn=None, score_grad_fn=None) -> CheckResult:
    """The rule on each of dq, dk, dv; the result carries the gradient closest to (or furthest past) its bound.
    mask: an explicit element mask (a block mask's, a mask_mod's) on top of causal; score_fn / score_grad_fn: a
    score_mod functor's reference and its slope."""
    q, k, v, dout = inputs
    kw = dict(scale=head_dim ** -0.5, causal=causal, mask=mask, score_fn=score_fn, score_grad_fn=score_grad_fn)
    refs = reference_backward(q, k, v, dout, **kw)
    plains = plain_backward(q, k, v, dout, dtype=BY_NAME[dtype], **kw)
    return judge_each(variant, label, grads, refs, plains, dtype, max(q.shape[1], k.shape[1]))


def judge_each(variant: str, label: str, grads, refs, plains, dtype: str, reduction_len: int) -> CheckResult:
    """DESIGN's rule on each gradient against its float64 reference and plain same-precision backward."""
    xp = cupy_module()
    worst, notes, passed = (0.0, 0.0, -1.0), [], True
    for name, g, ref, plain in zip(GRADIENTS, grads, refs, plains):
        g64 = g.astype(xp.float32).astype(xp.float64)
        finite = bool(xp.isfinite(g64).all())
        err = float(xp.abs(g64 - ref).max()) if finite and g64.size else 0.0 if finite else float("nan")
        atol = output_atol(ref, BY_NAME[dtype], reduction_len) if ref.size else 0.0
        bound = ERROR_FACTOR * (float(xp.abs(plain.astype(xp.float64) - ref).max()) if ref.size else 0.0) + atol
        ok = finite and err <= bound
        passed &= ok
        ratio = err / bound if finite and bound > 0 else float("inf")
        if ratio > worst[2]:
            worst = (err, bound, ratio)
        notes.append(f"{name} {err:.3g}/{bound:.3g}" + ("" if finite else " NaN/Inf or unwritten"))
    return CheckResult(variant, label, worst[0], worst[1], None, None, passed, "; ".join(notes))


def random_dout(q, v, seed: int):
    """A fresh N(0, 1) upstream gradient of the forward output's shape (q's, with v's head dim last), q's dtype."""
    xp = cupy_module()
    shape = q.shape[:-1] + v.shape[-1:]
    return xp.random.default_rng(seed).standard_normal(shape, dtype=xp.float32).astype(q.dtype)


def backward_check(spec: KernelSpec, shape: Shape, head_dim: int, dtype: str, causal: bool,
                   head_dim_v: int | None = None) -> Check:
    """One backward run (forward by the default kernel, then the variant's gradients) against float64 autograd; v
    (and out, dout, dv) of head_dim_v columns where given."""
    label = f"{shape.label()} {head_dims_label(head_dim, head_dim_v)} {dtype}" + (" causal" if causal else "") + \
        " backward"

    def run(seed: int) -> CheckResult:
        from ..api import attention
        from ..backward import attention_backward
        q, k, v = random_qkv(shape, head_dim, dtype, seed, head_dim_v)
        dout = random_dout(q, v, seed + 1)
        out, lse = attention(q, k, v, causal=causal, return_lse=True)
        poison_pool((q, k, v))
        grads = attention_backward(dout, q, k, v, out, lse, causal=causal, variant=spec.name)
        return judge_gradients(spec.name, label, (q, k, v, dout), grads, head_dim, causal, dtype)

    return Check(spec.name, label, run)


@dataclass(frozen=True)
class VarlenBackwardCase:
    """Packed sequences of these lengths (keys: lens_k, or lens_q when None) through attention_varlen_backward."""

    name: str
    lens_q: tuple[int, ...]
    lens_k: tuple[int, ...] | None = None
    heads: int = 8
    kv_heads: int = 2

    @property
    def keys(self) -> tuple[int, ...]:
        return self.lens_k if self.lens_k is not None else self.lens_q

    def label(self) -> str:
        kv = f"/{self.kv_heads}" if self.kv_heads != self.heads else ""
        return f"varlen {self.name} b{len(self.lens_q)} h{self.heads}{kv}"


# Zero-length sequences, one token, tile edges +- 1 (block_m 64, block_n 128), q != k both ways (a sequence with
# keys and no query: dK = dV = 0; queries and no key: dQ = 0), GQA 4:1, MQA, MHA.
VARLEN_CASES = (
    VarlenBackwardCase("edges", (0, 1, 17, 63, 64, 65, 127, 128, 129)),
    VarlenBackwardCase("cross", (5, 300, 0, 130, 1, 64, 129), (129, 1, 50, 0, 65, 200, 127), heads=4, kv_heads=4),
    VarlenBackwardCase("mqa", (1, 33, 200, 128, 0, 65), (64, 100, 17, 129, 1, 257), heads=8, kv_heads=1),
)
QUICK_VARLEN_CASES = VARLEN_CASES[:2]


def varlen_backward_check(spec: KernelSpec, case: VarlenBackwardCase, head_dim: int, dtype: str,
                          causal: bool, head_dim_v: int | None = None) -> Check:
    """One packed batch: forward by the default varlen kernel, the variant's gradients, each sequence referenced
    on its own in float64 (causal bottom-right aligned to it); v of head_dim_v columns where given."""
    label = f"{case.label()} {head_dims_label(head_dim, head_dim_v)} {dtype}" + (" causal" if causal else "") + \
        " backward"

    def run(seed: int) -> CheckResult:
        from ..backward import attention_varlen_backward
        from ..varlen import attention_varlen
        xp = cupy_module()
        rng = xp.random.default_rng(seed)
        storage = BY_NAME[dtype].storage
        q, k, v, cu_q, cu_k = packed_qkv(case, rng, xp, storage, head_dim, head_dim_v)
        dout = rng.standard_normal(q.shape[:2] + v.shape[2:], dtype=xp.float32).astype(storage)
        out, lse = attention_varlen(q, k, v, cu_q, cu_k, max(case.lens_q), max(case.keys), causal=causal,
                                    return_lse=True)
        poison_pool((q, k, v))
        grads = attention_varlen_backward(dout, q, k, v, out, lse, cu_q, cu_k, max(case.lens_q), max(case.keys),
                                          causal=causal, variant=spec.name)
        refs, plains = _per_sequence(case, q, k, v, dout, int(head_dim), causal, dtype, cu_q, cu_k)
        return judge_each(spec.name, label, grads, refs, plains, dtype, max(max(case.lens_q), max(case.keys)))

    return Check(spec.name, label, run)


def _per_sequence(case: VarlenBackwardCase, q, k, v, dout, head_dim: int, causal: bool, dtype: str, cu_q, cu_k):
    """The float64 and plain gradients of every sequence alone, packed back (zeros where a side is empty)."""
    xp = array_module(q)
    refs = [[], [], []]
    plains = [[], [], []]
    scale = head_dim ** -0.5
    for b, (nq, nk) in enumerate(zip(case.lens_q, case.keys)):
        q0, k0 = int(cu_q[b]), int(cu_k[b])
        qb, kb, vb, db = q[None, q0:q0 + nq], k[None, k0:k0 + nk], v[None, k0:k0 + nk], dout[None, q0:q0 + nq]
        if nq == 0 or nk == 0:   # nothing attends: every gradient of the sequence is 0
            zeros = tuple(xp.zeros(x.shape[1:], dtype=xp.float64) for x in (qb, kb, vb))
            for acc in (refs, plains):
                for i, z in enumerate(zeros):
                    acc[i].append(z)
            continue
        for acc, grads in ((refs, reference_backward(qb, kb, vb, db, scale=scale, causal=causal)),
                           (plains, plain_backward(qb, kb, vb, db, scale=scale, dtype=BY_NAME[dtype], causal=causal))):
            for i, g in enumerate(grads):
                acc[i].append(g[0])
    return ([xp.concatenate(parts) for parts in refs], [xp.concatenate(parts) for parts in plains])


def masked_backward_check(spec: KernelSpec, shape: Shape, head_dim: int, dtype: str, causal: bool, mask: str,
                          deterministic: bool = False) -> Check:
    """One backward over a block mask ("block:<pattern>", verify/block_sparse.py's patterns) or a mask_mod functor
    ("mod:<name>", its Python reference's sample_args) against float64 gradients with the mask made explicit; the
    forward by the default kernel with the same mask."""
    label = (f"{shape.label()} d{head_dim} {dtype}" + (" causal" if causal else "") + f" {mask}"
             + (" deterministic" if deterministic else "") + " backward")

    def run(seed: int) -> CheckResult:
        from ..api import attention
        from ..backward import attention_backward
        xp = cupy_module()
        q, k, v = random_qkv(shape, head_dim, dtype, seed)
        dout = random_dout(q, v, seed + 1)
        kw, emask, score_fn, score_grad_fn = masked_terms(mask, shape, seed, xp)
        out, lse = attention(q, k, v, causal=causal, return_lse=True, **kw)
        poison_pool((q, k, v))
        grads = attention_backward(dout, q, k, v, out, lse, causal=causal, variant=spec.name,
                                   deterministic=deterministic, **kw)
        return judge_gradients(spec.name, label, (q, k, v, dout), grads, head_dim, causal, dtype, emask, score_fn,
                               score_grad_fn)

    return Check(spec.name, label, run)


def masked_terms(mask: str, shape: Shape, seed: int, xp) -> tuple:
    """masked_call of each "+"-joined term of mask ("block:random(0.5)+mod:relative_bias": a score_mod functor under a
    block mask), the keywords merged, the element masks intersected."""
    kw, emask, score_fn, score_grad_fn = {}, None, None, None
    for term in mask.split("+"):
        kind, name = term.split(":", 1)
        more, m, fn, grad_fn = masked_call(kind, name, shape, seed, xp)
        kw.update(more)
        emask = m if emask is None else (emask if m is None else emask & m)
        score_fn, score_grad_fn = fn or score_fn, grad_fn or score_grad_fn
    return kw, emask, score_fn, score_grad_fn


def masked_call(kind: str, name: str, shape: Shape, seed: int, xp) -> tuple:
    """(the attention keywords, the explicit element mask or None, the reference score_fn and score_grad_fn of a
    functor's score_mod or None) of a block mask pattern or a functor (mask_mod, or score_mod with its derivative)."""
    if kind == "block":
        from .block_sparse import block_patterns
        block_mask = block_patterns()[name](shape, seed)
        return {"block_mask": block_mask}, block_mask.to_element_mask(shape.seqlen_q, shape.seqlen_k), None, None
    from ..registry import discover_kernels
    from .functors import functor_slope, functor_terms, load_reference, reference_args
    mod = discover_kernels().get_mod(name)
    module = load_reference(mod)
    args = reference_args(mod, module, shape, seed, xp)
    emask, score_fn = functor_terms(mod, module, shape, args, xp)
    return {"mod": name, "mod_args": args}, emask, score_fn, functor_slope(mod, module, shape, args, xp)


# Block masks and functors through a backward that takes them: the patterns of every kind (banded, strided, random
# per (batch, head) at 0.5 and 0.0, broadcast), the shipped functors (mask_mod, and a score_mod with its derivative);
# odd shapes, GQA, q != k.
MASKED_SHAPES = (Shape(2, 300, 700, 4, 2), Shape(1, 777, 255, 8, 1), Shape(1, 1000, 1000, 4, 4), Shape(2, 1, 129, 2, 2))
MASKS = ("block:sliding_window(256)", "block:butterfly", "block:random(0.5)", "block:random(0.0)",
         "block:random(0.5) broadcast", "mod:document", "mod:prefix_lm", "mod:relative_bias",
         "block:random(0.5)+mod:relative_bias")


def takes_mask(spec: KernelSpec, mask: str) -> bool:
    """Whether a backward variant takes every term of a MASKS entry (block masks; the functor built in)."""
    from ..registry import discover_kernels
    mods = discover_kernels().mods
    return all(spec.supports("block_sparse") if kind == "block" else mods[name].builds_into(spec)
               for kind, name in (term.split(":", 1) for term in mask.split("+")))


def masked_backward_checks(spec: KernelSpec, dtypes, head_dims, causal_opts, quick: bool) -> list[Check]:
    masks = [m for m in MASKS if takes_mask(spec, m)]
    shapes = MASKED_SHAPES[:2] if quick else MASKED_SHAPES
    return [masked_backward_check(spec, s, d, t, c, m)
            for t, d, c, s, m in itertools.product(dtypes, head_dims, causal_opts, shapes, masks)]


def backward_checks(spec: KernelSpec, dtypes, head_dims, causal_opts, quick: bool) -> list[Check]:
    """The shape matrix for each dtype, head dim and causal option, through the backward; with the varlen matrix
    where the variant declares varlen, and block masks and mask_mod functors where it takes them."""
    shapes = QUICK_SHAPES if quick else SHAPES
    out = [backward_check(spec, s, d, t, c)
           for t, d, c, s in itertools.product(dtypes, head_dims, causal_opts, shapes)]
    if spec.supports("varlen"):
        cases = QUICK_VARLEN_CASES if quick else VARLEN_CASES
        out += [varlen_backward_check(spec, c, d, t, causal)
                for t, d, causal, c in itertools.product(dtypes, head_dims, causal_opts, cases)]
    return out + masked_backward_checks(spec, dtypes, head_dims, causal_opts, quick)


register_family("backward", backward_checks, by_support=True)
