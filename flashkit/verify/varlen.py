"""Verification of variable-length batches (attention_varlen) on every variant declaring `varlen`.

An extension of the harness. Each case packs sequences of the listed lengths (zero-length ones, one-token
ones, tile boundaries +- 1, 4097) back to back, runs one varlen launch into a NaN-poisoned output, and
references every sequence on its own in float64 (causal bottom-right aligned to that sequence); the rule
is DESIGN.md's, over the whole packed output and LSE.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from ..call.dtypes import BY_NAME
from ..registry.manifest import KernelSpec
from ..runtime.device import cupy_module
from .harness import Check, CheckResult, head_dims_label, judge, register_extension
from .reference import local_mask, output_atol, plain_attention, reference_attention


@dataclass(frozen=True)
class VarlenCase:
    name: str
    lens_q: tuple[int, ...]
    lens_k: tuple[int, ...] | None = None   # None: the same as lens_q (self-attention)
    heads: int = 8
    kv_heads: int = 2
    window: tuple[int, int] | None = None
    alibi: bool = False                     # (batch, heads) slopes

    @property
    def keys(self) -> tuple[int, ...]:
        return self.lens_k if self.lens_k is not None else self.lens_q

    def label(self) -> str:
        kv = f"/{self.kv_heads}" if self.kv_heads != self.heads else ""
        mods = (f" window{self.window}" if self.window else "") + (" alibi" if self.alibi else "")
        return f"varlen {self.name} b{len(self.lens_q)} h{self.heads}{kv}{mods}"


CASES = (
    VarlenCase("edges", (0, 1, 17, 63, 64, 65, 127, 128, 129, 4097)),
    VarlenCase("cross", (5, 300, 0, 1000, 1, 200), (700, 1, 50, 0, 1000, 200), heads=4, kv_heads=4),
    VarlenCase("decode", (1, 1, 1, 1, 4, 16), (100, 3000, 1, 257, 64, 999), heads=16, kv_heads=1),
    VarlenCase("mixed", (1500, 33, 700, 2, 1999, 256, 0, 1025)),
    VarlenCase("mods", (300, 1, 1000, 129), (400, 17, 1000, 129), window=(100, 20), alibi=True),
)
QUICK_CASES = tuple(c for c in CASES if c.name in ("edges", "cross", "mods"))


def offsets(lens, xp):
    """cu_seqlens of `lens`: (len(lens) + 1,) int32, from 0 (xp: numpy or cupy)."""
    return xp.asarray([0] + list(itertools.accumulate(lens)), dtype=xp.int32)


def packed_qkv(case, rng, xp, storage, head_dim: int, head_dim_v: int | None = None):
    """Random packed q (total_q, heads, head_dim), k and v (total_k, kv_heads, head_dim / head_dim_v) in the storage
    dtype, and the cu_seqlens of case's lengths (any case with lens_q, keys, heads and kv_heads)."""
    tq, tk = sum(case.lens_q), sum(case.keys)
    q = rng.standard_normal((tq, case.heads, head_dim), dtype=xp.float32).astype(storage)
    k, v = (rng.standard_normal((tk, case.kv_heads, d), dtype=xp.float32).astype(storage)
            for d in (head_dim, head_dim_v or head_dim))
    return q, k, v, offsets(case.lens_q, xp), offsets(case.keys, xp)


def varlen_check(spec: KernelSpec, case: VarlenCase, head_dim: int, dtype: str, causal: bool,
                 head_dim_v: int | None = None) -> Check:
    label = f"{case.label()} {head_dims_label(head_dim, head_dim_v)} {dtype}" + (" causal" if causal else "")

    def run(seed: int) -> CheckResult:
        from ..varlen import attention_varlen
        xp = cupy_module()
        rng = xp.random.default_rng(seed)
        q, k, v, cu_q, cu_k = packed_qkv(case, rng, xp, BY_NAME[dtype].storage, head_dim, head_dim_v)
        slopes = (0.5 * rng.random((len(case.lens_q), case.heads))).astype(xp.float32) if case.alibi else None
        out = xp.full(q.shape[:2] + v.shape[2:], xp.nan, dtype=q.dtype)   # poisoned: unwritten stays NaN
        out, lse = attention_varlen(q, k, v, cu_q, cu_k, max(case.lens_q), max(case.keys), causal=causal,
                                    return_lse=True, out=out, variant=spec.name, window_size=case.window,
                                    alibi_slopes=slopes)
        refs, plains = [], []
        for b, (nq, nk) in enumerate(zip(case.lens_q, case.keys)):
            q0, k0 = int(cu_q[b]), int(cu_k[b])
            qb, kb, vb = q[None, q0:q0 + nq], k[None, k0:k0 + nk], v[None, k0:k0 + nk]
            kw = dict(scale=head_dim ** -0.5, causal=causal,
                      mask=local_mask(nq, nk, case.window, 0, xp) if case.window else None,
                      alibi_slopes=slopes[b:b + 1] if slopes is not None else None)
            refs.append(reference_attention(qb, kb, vb, **kw))
            plains.append(plain_attention(qb, kb, vb, dtype=BY_NAME[dtype], **kw))
        ref, plain = (xp.concatenate([r[0][0] for r in rs]) for rs in (refs, plains))
        lse_ref, lse_plain = (xp.concatenate([r[1][0] for r in rs], axis=1) for rs in (refs, plains))
        atol = output_atol(ref, BY_NAME[dtype], max(max(case.keys), head_dim))
        return judge(spec.name, label, out, ref, plain, atol, lse, lse_ref, lse_plain, head_dim=head_dim)

    return Check(spec.name, label, run)


def varlen_checks(spec: KernelSpec, dtypes, head_dims, causal_opts, quick: bool) -> list[Check]:
    """The varlen matrix for a forward variant that declares it (and the modifications it declares); [] otherwise
    (a backward variant's varlen matrix is verify/backward.py's)."""
    if not spec.supports("varlen") or spec.supports("backward"):
        return []
    cases = [c for c in (QUICK_CASES if quick else CASES)
             if not (c.window and not spec.supports("window")) and not (c.alibi and not spec.supports("alibi"))]
    return [varlen_check(spec, c, d, t, causal)
            for t, d, causal, c in itertools.product(dtypes, head_dims, causal_opts, cases)]


register_extension("varlen", varlen_checks)
