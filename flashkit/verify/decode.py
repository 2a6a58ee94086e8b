"""Verification of the split-KV decode variant: decode shapes, GQA / MQA / MHA, paged caches with shuffled
block tables, per-sequence lengths and the k_new / v_new append, against the float64 reference.

Each sequence is referenced on its own keys (its cache_seqlens + seqlen_new), causal bottom-right aligned
to that length; the rule is the harness's (DESIGN.md): max|out - ref| <= 2 max|plain - ref| + atol.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from ..call.dtypes import BY_NAME
from ..registry.manifest import KernelSpec
from ..runtime.device import cupy_module
from .harness import Check, CheckResult, judge, register_family
from .reference import local_mask, output_atol, plain_attention, reference_attention


@dataclass(frozen=True)
class DecodeCase:
    batch: int
    seqlen_q: int
    seqlen_k: int           # keys of the longest sequence (after any append)
    heads: int
    kv_heads: int
    page_size: int = 0      # 0: a contiguous cache
    cache: bool = False     # through attention_with_kvcache (per-sequence lengths), else attention()
    seqlen_new: int = 0     # k_new / v_new rows appended first
    window: tuple[int, int] | None = None   # window_size (each sequence's, bottom-right aligned to its length)
    softcap: float = 0.0

    def label(self) -> str:
        kv = f"/{self.kv_heads}" if self.kv_heads != self.heads else ""
        how = (f" paged{self.page_size}" if self.page_size else " cache" if self.cache else "")
        mods = ([f"window({self.window[0]},{self.window[1]})"] if self.window else []) + (
            [f"softcap{self.softcap:g}"] if self.softcap else [])
        return (f"b{self.batch} sq{self.seqlen_q} sk{self.seqlen_k} h{self.heads}{kv}{how}"
                + (f" +{self.seqlen_new}new" if self.seqlen_new else "") + "".join(" " + m for m in mods))


GROUPS = ((16, 2), (8, 1), (4, 4))   # GQA 8:1, MQA, MHA
SEQLENS_K = (1, 17, 1000, 4097, 33000)
CASES = tuple(DecodeCase(b, sq, sk, h, hk) for b, sq, sk, (h, hk) in
              itertools.product((1, 8), (1, 4), SEQLENS_K, GROUPS) if not (b == 8 and sk == 33000 and hk == 4)) + tuple(
    DecodeCase(b, sq, sk, 16, 2, page_size=ps, cache=True, seqlen_new=new) for b, sq, sk, ps, new in (
        (8, 1, 1000, 16, 0), (8, 4, 4097, 64, 0), (3, 1, 33000, 256, 0), (8, 1, 1000, 64, 1),
        (4, 4, 700, 16, 4), (8, 1, 300, 256, 3), (2, 1, 17, 16, 1))) + (
    DecodeCase(8, 1, 1000, 8, 1, cache=True), DecodeCase(4, 4, 4097, 16, 2, cache=True, seqlen_new=4),
    DecodeCase(2, 1, 1, 4, 4, cache=True, seqlen_new=1))
QUICK_CASES = tuple(c for c in CASES if c.seqlen_k in (17, 4097) and c.seqlen_q == 1 or c.cache)
# Built-in modifications (variants declaring window / softcap): Mistral's and Gemma 2's windows and caps, a window
# narrower than a tile, one with a right side, one wider than the cache, through the cache and through attention().
MOD_CASES = (
    DecodeCase(8, 1, 4097, 16, 2, page_size=64, cache=True, window=(1000, 0)),
    DecodeCase(4, 4, 4097, 16, 2, cache=True, seqlen_new=4, window=(300, 7)),
    DecodeCase(2, 1, 33000, 8, 1, cache=True, window=(4096, 0), softcap=30.0),
    DecodeCase(8, 4, 1000, 16, 2, page_size=16, cache=True, seqlen_new=1, softcap=5.0),
    DecodeCase(3, 16, 700, 4, 4, cache=True, window=(5, 2)),
    DecodeCase(2, 2, 300, 8, 2, cache=True, window=(5000, -1), softcap=50.0),
    DecodeCase(4, 1, 4097, 16, 2, window=(512, 0), softcap=20.0),
    DecodeCase(2, 8, 1000, 8, 1, window=(40, 40)),
)


def _cache_inputs(case: DecodeCase, head_dim: int, dtype: str, rng, xp):
    """q, the caches (paged with a shuffled block table, or contiguous), lengths before the append, k_new / v_new."""
    storage = BY_NAME[dtype].storage
    b, hk, d = case.batch, case.kv_heads, head_dim

    def draw(*shape):
        return rng.standard_normal(shape, dtype=xp.float32).astype(storage)

    lens = rng.integers(max(1, case.seqlen_k // 2), case.seqlen_k + 1, size=b).astype(xp.int32)
    lens[0] = case.seqlen_k   # the longest sequence fills its capacity
    before = xp.maximum(lens - case.seqlen_new, 0).astype(xp.int32)
    lens = before + case.seqlen_new
    q = draw(b, case.seqlen_q, case.heads, d)
    if case.page_size:
        pages = -(-case.seqlen_k // case.page_size) + 1   # one spare page: a partial last page and slack
        perm = xp.argsort(rng.random(b * pages)).astype(xp.int32)   # a shuffled block table
        table = perm.reshape(b, pages)
        k_cache, v_cache = draw(b * pages + 3, case.page_size, hk, d), draw(b * pages + 3, case.page_size, hk, d)
    else:
        table = None
        k_cache, v_cache = draw(b, case.seqlen_k + 5, hk, d), draw(b, case.seqlen_k + 5, hk, d)
    new = (draw(b, case.seqlen_new, hk, d), draw(b, case.seqlen_new, hk, d)) if case.seqlen_new else (None, None)
    return q, k_cache, v_cache, table, before, lens, new


def _sequence_kv(cache, table, page_size: int, b: int, length: int, xp):
    """Keys [0, length) of sequence b as a (1, length, kv_heads, D) array."""
    if table is None:
        return cache[b:b + 1, :length]
    j = xp.arange(length)
    return cache[table[b, j // page_size], j % page_size][None]


def decode_check(spec: KernelSpec, case: DecodeCase, head_dim: int, dtype: str, causal: bool) -> Check:
    label = f"{case.label()} d{head_dim} {dtype}" + (" causal" if causal else "")

    def run(seed: int) -> CheckResult:
        from ..api import attention
        from ..kvcache import attention_with_kvcache
        xp = cupy_module()
        rng = xp.random.default_rng(seed)
        q, k_cache, v_cache, table, before, lens, (k_new, v_new) = _cache_inputs(case, head_dim, dtype, rng, xp)
        out = xp.full(q.shape, xp.nan, dtype=q.dtype)   # poisoned: an unwritten element stays NaN
        mods = dict(window_size=case.window, softcap=case.softcap)
        if case.cache:
            out, lse = attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=before, block_table=table,
                                              k_new=k_new, v_new=v_new, causal=causal, return_lse=True,
                                              out=out, variant=spec.name, **mods)
        else:
            k, v = k_cache[:, :case.seqlen_k], v_cache[:, :case.seqlen_k]
            lens = xp.full((case.batch,), case.seqlen_k, dtype=xp.int32)
            out, lse = attention(q, k, v, causal=causal, variant=spec.name, return_lse=True, out=out, **mods)
        scale = head_dim ** -0.5
        refs, plains = [], []
        for b in range(case.batch):
            n = int(lens[b])
            k_b = _sequence_kv(k_cache, table, case.page_size, b, n, xp)
            v_b = _sequence_kv(v_cache, table, case.page_size, b, n, xp)
            if case.seqlen_new:   # the appended rows must be in the cache, where the kernel read them
                m = int(before[b])
                assert bool((k_b[0, m:].view(xp.uint16) == k_new[b].view(xp.uint16)).all()), "k_new not appended"
            masking = reference_masking(case.seqlen_q, n, causal, case.window, xp)
            refs.append(reference_attention(q[b:b + 1], k_b, v_b, scale=scale, softcap=case.softcap, **masking))
            plains.append(plain_attention(q[b:b + 1], k_b, v_b, scale=scale, dtype=BY_NAME[dtype],
                                          softcap=case.softcap, **masking))
        ref, lse_ref = (xp.concatenate(x) for x in zip(*refs))
        plain, lse_plain = (xp.concatenate(x) for x in zip(*plains))
        atol = output_atol(ref, BY_NAME[dtype], max(case.seqlen_k, head_dim))
        return judge(spec.name, label, out, ref, plain, atol, lse, lse_ref, lse_plain, head_dim=head_dim)

    return Check(spec.name, label, run)


def reference_masking(seqlen_q: int, seqlen_k: int, causal: bool, window: tuple[int, int] | None, xp) -> dict:
    """The reference's causal / mask keywords for one sequence: causal, and the window's mask beside it (the two
    together are the kernels' window with its right side at 0 when causal, as in verify/fuzz.py)."""
    return {"causal": causal, "mask": None if window is None else local_mask(seqlen_q, seqlen_k, window, xp=xp)}


def decode_checks(spec: KernelSpec, dtypes, head_dims, causal_opts, quick: bool) -> list[Check]:
    """The decode matrix for each dtype, head dim and causal option (and MOD_CASES where the variant takes a window
    and softcap)."""
    cases = QUICK_CASES if quick else CASES
    if spec.supports("window") and spec.supports("softcap"):
        cases = cases + (MOD_CASES[::2] if quick else MOD_CASES)
    return [decode_check(spec, c, d, t, causal)
            for t, d, causal, c in itertools.product(dtypes, head_dims, causal_opts, cases)]


register_family("kv_cache", decode_checks, by_support=True)
