"""Verification of a v head dim below q's and k's (head_dim_v; DeepSeek's MLA: 192 / 128).

An extension of the harness: every variant whose manifest declares `head_dim_v` (fa2, causal, fa3; the backward's
fa2_bwd, fa3_bwd) gets, on top of its family's checks, the dense shape matrix at 192 / 128 (causal and not, GQA and
MQA, seqlen_q != seqlen_k both ways, odd lengths), a few other pairs of head-dim classes and padded head dims on the
quick shapes, one modified case (window, softcap, ALiBi) and one varlen case where the variant declares them. The
reference is the same float64 attention (its P V product runs over v's own head dim), or its float64 gradients for a
backward variant (verify/backward.py); the rule is DESIGN.md's.
"""

from __future__ import annotations

import itertools

from ..registry.manifest import KernelSpec
from .backward import VARLEN_CASES as VARLEN_BACKWARD_CASES
from .backward import backward_check, varlen_backward_check
from .dense import dense_check
from .harness import QUICK_SHAPES, SHAPES, Check, register_extension
from .mods import CASE_BY_NAME, mod_check
from .mods import QUICK_SHAPES as MOD_SHAPES
from .varlen import CASES as VARLEN_CASES
from .varlen import varlen_check

MLA = (192, 128)   # (head_dim, head_dim_v): the pair every variant declaring head_dim_v runs on the full matrix
# Other pairs, on the quick shapes: classes apart, V one class below, V of one 128 B panel under Q / K's two (the
# second half-filled: the Hopper core's hd96), both padded, V far below Q / K (fa3_bwd's column split runs v of 64
# under 256 on 128-column V tiles, zero-filled), V whole under Q / K padded (dV's columns past q's head dim).
OTHER_PAIRS = ((128, 64), (256, 192), (96, 64), (200, 136), (136, 72), (40, 8), (256, 64), (136, 128))
MOD_CASE = "causal window(128,0)+softcap(3)+alibi"
VARLEN_CASE = "cross"


def pairs_for(spec: KernelSpec, head_dims) -> list[tuple[int, int]]:
    """The (head_dim, head_dim_v) pairs to check: those whose head_dim was asked for and the variant takes; for a
    backward variant, which verifies by class, those whose head_dim's class was asked for."""
    def asked(d: int) -> bool:
        return d in head_dims or (spec.supports("backward") and spec.head_dims.class_of(d) in head_dims)
    return [(d, dv) for d, dv in (MLA,) + OTHER_PAIRS if d in spec.head_dims and dv in spec.head_dims and asked(d)]


def head_dim_v_checks(spec: KernelSpec, dtypes, head_dims, causal_opts, quick: bool) -> list[Check]:
    """The head_dim_v matrix of a variant declaring it; [] otherwise."""
    if not spec.supports("head_dim_v"):
        return []
    backward = spec.supports("backward")
    dense = backward_check if backward else dense_check
    out = []
    for d, dv in pairs_for(spec, head_dims):
        full = (d, dv) == MLA and not quick
        shapes = SHAPES if full else QUICK_SHAPES[-3:]
        types = dtypes if full else dtypes[:1]
        out += [dense(spec, s, d, t, c, dv) for t, c, s in itertools.product(types, causal_opts, shapes)]
        if (d, dv) != MLA:
            continue
        case = CASE_BY_NAME[MOD_CASE]
        if case.causal in causal_opts and all(spec.supports(f) for f in case.features()):
            out += [mod_check(spec, s, d, t, case, dv) for t, s in itertools.product(types, MOD_SHAPES[:2])]
        if spec.supports("varlen"):
            cases, check = (VARLEN_BACKWARD_CASES, varlen_backward_check) if backward else (VARLEN_CASES, varlen_check)
            varlen = next(c for c in cases if c.name == VARLEN_CASE)
            out += [check(spec, varlen, d, t, c, dv) for t, c in itertools.product(types, causal_opts)]
    return out


register_extension("head_dim_v", head_dim_v_checks)
