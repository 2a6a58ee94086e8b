"""Verification of drop-in functors (flashkit verify --mod NAME): the fused kernel against the float64 reference
with the functor's own Python reference (NAME.py beside NAME.cu) applied, under DESIGN.md's rule.

The reference module defines score_mod(score, batch, head, q_idx, kv_idx, args) and / or
mask_mod(batch, head, q_idx, kv_idx, args) on broadcasting index arrays (batch (B,1,1,1), head (1,H,1,1),
q_idx (1,1,Sq,1), kv_idx (1,1,1,Sk)); args carries xp (NumPy or CuPy), seqlen_q, seqlen_k and the named
arguments. sample_args(batch, heads, seqlen_q, seqlen_k, xp, rng) draws arguments for a shape (needed when
an argument has no default).
"""

from __future__ import annotations

import importlib.util
import itertools
from types import ModuleType, SimpleNamespace

import numpy as np

from ..call.dtypes import BY_NAME
from ..errors import UnsupportedError
from ..registry.functor_manifest import ModSpec
from ..registry.manifest import KernelSpec
from ..runtime.device import cupy_module
from .block_sparse import BLOCK_PATTERN, block_patterns
from .harness import SHAPES, Check, CheckResult, Shape, judge, random_qkv
from .reference import output_atol, plain_attention, reference_attention

QUICK_SHAPES = (Shape(1, 1, 1, 1, 1), Shape(2, 17, 17, 4, 4), Shape(3, 128, 128, 8, 1), Shape(2, 127, 1000, 4, 4),
                Shape(2, 1000, 127, 8, 8), Shape(1, 1000, 1000, 16, 2))


def load_reference(spec: ModSpec) -> ModuleType:
    """The functor's Python reference module; UnsupportedError when verify cannot check it."""
    path = spec.reference
    if path is None:
        raise UnsupportedError(f"mod {spec.name!r}: cannot check it: no Python reference "
                               f"({spec.path.with_suffix('.py').name} beside {spec.path.name}); it runs unverified")
    module_spec = importlib.util.spec_from_file_location(f"flashkit_mod_reference_{spec.name}", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    missing = [f for f in spec.functions if not callable(getattr(module, f, None))]
    if missing:
        raise UnsupportedError(f"mod {spec.name!r}: cannot check it: {path.name} defines no {missing[0]}()")
    needs_args = [a.name for a in spec.args if a.default is None]
    if needs_args and not callable(getattr(module, "sample_args", None)):
        raise UnsupportedError(f"mod {spec.name!r}: cannot check it: {path.name} defines no sample_args() to draw "
                               f"{', '.join(needs_args)}")
    return module


def reference_args(spec: ModSpec, module: ModuleType, shape: Shape, seed: int, xp) -> dict:
    """mod_args for one check: the reference's sample_args, defaults for the rest."""
    drawn = {}
    if callable(getattr(module, "sample_args", None)):
        drawn = module.sample_args(shape.batch, shape.heads, shape.seqlen_q, shape.seqlen_k, xp,
                                   np.random.default_rng(seed + 7))
    return {a.name: drawn.get(a.name, a.default) for a in spec.args if a.name in drawn or a.default is not None}


def _reference_grid(shape: Shape, args: dict, xp) -> tuple:
    """What a reference function takes beside the scores: the (B,1,1,1), (1,H,1,1), (1,1,Sq,1), (1,1,1,Sk) index
    arrays and the namespace of xp, the lengths and the arguments."""
    ns = SimpleNamespace(xp=xp, seqlen_q=shape.seqlen_q, seqlen_k=shape.seqlen_k, **args)
    b = xp.arange(shape.batch)[:, None, None, None]
    h = xp.arange(shape.heads)[None, :, None, None]
    qi = xp.arange(shape.seqlen_q)[None, None, :, None]
    ki = xp.arange(shape.seqlen_k)[None, None, None, :]
    return b, h, qi, ki, ns


def functor_terms(spec: ModSpec, module: ModuleType, shape: Shape, args: dict, xp):
    """(element mask (B, H, Sq, Sk) or None, score_fn or None) of the reference."""
    grid = _reference_grid(shape, args, xp)
    full = (shape.batch, shape.heads, shape.seqlen_q, shape.seqlen_k)
    mask = xp.broadcast_to(xp.asarray(module.mask_mod(*grid), dtype=bool), full) if spec.mask else None
    score_fn = (lambda s, xp_: module.score_mod(s, *grid)) if spec.score else None
    return mask, score_fn


def functor_slope(spec: ModSpec, module: ModuleType, shape: Shape, args: dict, xp):
    """The reference's score_mod_grad(modified score, xp) over the whole (B, H, Sq, Sk) grid, or None (no score_mod, or
    a bias: slope 1)."""
    if not spec.score_grad or spec.bias:
        return None
    grid = _reference_grid(shape, args, xp)
    return lambda m, xp_: module.score_mod_grad(m, *grid)


def functor_check(spec: KernelSpec, mod: ModSpec, module: ModuleType, shape: Shape, head_dim: int, dtype: str,
                  causal: bool) -> Check:
    """One run of the fused kernel against the reference with the functor applied."""
    block = BLOCK_PATTERN if spec.requires.get("block_sparse") else None   # a block-sparse variant: under a block mask
    label = (f"{shape.label()} d{head_dim} {dtype} {'causal ' if causal else ''}mod={mod.name}"
             + (f" block:{block}" if block else ""))

    def run(seed: int) -> CheckResult:
        from ..api import attention
        xp = cupy_module()
        q, k, v = random_qkv(shape, head_dim, dtype, seed)
        args = reference_args(mod, module, shape, seed, xp)
        blocks = block_patterns()[block](shape, seed) if block else None
        out = xp.full(q.shape, xp.nan, dtype=q.dtype)   # poisoned: an unwritten element stays NaN
        out, lse = attention(q, k, v, causal=causal, variant=spec.name, return_lse=True, out=out, mod=mod.name,
                             mod_args=args, block_mask=blocks)
        mask, score_fn = functor_terms(mod, module, shape, args, xp)
        if blocks is not None:
            element = blocks.to_element_mask(shape.seqlen_q, shape.seqlen_k)
            mask = element if mask is None else (mask & element)
        kw = dict(scale=head_dim ** -0.5, causal=causal, mask=mask, score_fn=score_fn)
        ref, lse_ref = reference_attention(q, k, v, **kw)
        plain, lse_plain = plain_attention(q, k, v, dtype=BY_NAME[dtype], **kw)
        atol = output_atol(ref, BY_NAME[dtype], max(shape.seqlen_k, head_dim))
        return judge(spec.name, label, out, ref, plain, atol, lse, lse_ref, lse_plain, head_dim=head_dim)

    return Check(spec.name, label, run)


def functor_variants(specs, mod: ModSpec) -> list[KernelSpec]:
    """The forward variants that build the functor in (their manifests declare its functions: a block-sparse one
    takes score_mods, under a block mask); the backward's checks are verify/backward.py's."""
    return [s for s in specs if mod.builds_into(s) and not s.supports("backward")]


def functor_checks(mod: ModSpec, specs, dtypes=None, head_dims=None, causal=None, quick: bool = False,
                   shapes=None) -> list[Check]:
    """The shape matrix (DESIGN's; a smaller one when quick) x dtypes x head dims x causal, on each variant."""
    module = load_reference(mod)
    out = []
    for spec in functor_variants(specs, mod):
        dts = [d for d in (dtypes or spec.dtypes) if d in spec.dtypes]
        hds = [d for d in (head_dims or (64, 128)) if d in spec.head_dims]
        causal_opts = spec.causal_options(tuple(causal) if causal is not None else (False, True))
        for dt, hd, c, sh in itertools.product(dts, hds, causal_opts, shapes or (QUICK_SHAPES if quick else SHAPES)):
            out.append(functor_check(spec, mod, module, sh, hd, dt, c))
    return out
