"""Randomized cross-feature checks: seeded random calls through the public API against the float64 reference.

The shape matrix and the feature families check each feature on its own variants; users combine them. Each fuzz
case draws, from one seed:
  dtype        float16 or bfloat16
  head dims    any multiple of 8 up to 256, v's the same or narrower (DeepSeek's MLA)
  shape        batch 1-3, kv heads 1-4 with groups of 1-8 query heads (MHA, GQA, MQA); each length tiny, random
               or at a tile boundary +- 1 (64, 128 and 192 rows), seqlen_q != seqlen_k either way
  masks        causal; a window (either side unbounded or not), a chunk; softcap; ALiBi (heads,) or (batch, heads);
               a softmax scale of its own
  layout       q, k, v, out and dout contiguous, as (b, h, s, d) views (what transformers passes), as heads of one
               packed qkv buffer (a fused projection's output), or with rows padded past the head dim
  call         attention (and attention_backward), or attention_varlen (and its backward) over a packed batch
               of random lengths, zero among them
The kernel is the API's own choice: what a user with this call gets. Outputs and gradients land on NaN-poisoned
memory, and every result is judged by DESIGN.md's rule (verify/harness.py's judge, verify/backward.py's
judge_each), varlen sequences each against their own reference. A FlashkitError is a failure: every drawn call is
one the API documents as valid.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..call.dtypes import BY_NAME
from ..runtime.device import cupy_module
from .harness import Check, CheckResult, judge
from .mods import alibi_base
from .reference import local_mask, output_atol, plain_attention, reference_attention
from .varlen import offsets

LAYOUTS = ("contiguous", "bhsd", "packed", "padded")
MAX_SCORES = 1 << 22     # batch x heads x seqlen_q x seqlen_k of a case: the float64 reference's budget
MAX_HEAD_DIM = 256
HEAD_DIM_STEP = 8        # every head dim the API takes is a multiple of 8
ROW_PAD = 8              # "padded" layout: elements past the head dim in each row (16 B: TMA's stride unit)
TILE_ROWS = (64, 128, 192)
FEATURE_ODDS = dict(causal=0.5, window=0.2, chunk=0.08, softcap=0.2, alibi=0.2, scale=0.3, narrow_v=0.25,
                    backward=0.45, varlen=0.2, out=0.5)


@dataclass(frozen=True)
class FuzzCase:
    """One drawn call; lens_q / lens_k are the packed sequences' lengths of a varlen case (None: batched)."""

    index: int
    dtype: str
    batch: int
    seqlen_q: int
    seqlen_k: int
    heads: int
    kv_heads: int
    head_dim: int
    head_dim_v: int
    causal: bool
    window: tuple[int, int] | None
    chunk: int
    softcap: float
    alibi: str | None
    scale: float | None
    layout: str
    backward: bool
    given_out: bool
    lens_q: tuple[int, ...] | None = None
    lens_k: tuple[int, ...] | None = None

    @property
    def varlen(self) -> bool:
        return self.lens_q is not None

    def label(self) -> str:
        kv = f"/{self.kv_heads}" if self.kv_heads != self.heads else ""
        dims = f"d{self.head_dim}" + (f"/v{self.head_dim_v}" if self.head_dim_v != self.head_dim else "")
        shape = (f"varlen q{list(self.lens_q)} k{list(self.lens_k)}" if self.varlen else
                 f"b{self.batch} sq{self.seqlen_q} sk{self.seqlen_k}")
        parts = [f"fuzz#{self.index}", shape, f"h{self.heads}{kv}", dims, self.dtype, self.layout]
        parts += ["causal"] if self.causal else []
        parts += [f"window{self.window}"] if self.window else []
        parts += [f"chunk({self.chunk})"] if self.chunk else []
        parts += [f"softcap({self.softcap:.3g})"] if self.softcap else []
        parts += [f"alibi({self.alibi})"] if self.alibi else []
        parts += [f"scale({self.scale:.3g})"] if self.scale is not None else []
        parts += ["out="] if self.given_out else []
        parts += ["backward"] if self.backward else []
        return " ".join(parts)


def _length(rng: np.random.Generator, allow_zero: bool = False) -> int:
    """Tiny (1-19), random (20-699) or a tile boundary +- 1; 0 possible for a varlen sequence."""
    r = rng.random()
    if allow_zero and r < 0.1:
        return 0
    if r < 0.3:
        return int(rng.integers(1, 20))
    if r < 0.65:
        return int(rng.integers(20, 700))
    return max(1, int(rng.integers(1, 9)) * int(rng.choice(TILE_ROWS)) + int(rng.integers(-1, 2)))


def _side(rng: np.random.Generator, seqlen_k: int) -> int:
    """One side of a window: unbounded (-1), 0, or up to the key length."""
    r = rng.random()
    return -1 if r < 0.3 else 0 if r < 0.45 else int(rng.integers(0, seqlen_k + 1))


def draw_case(rng: np.random.Generator, index: int) -> FuzzCase:
    """One random valid call (FuzzCase) from rng."""
    odds = {name: rng.random() < p for name, p in FEATURE_ODDS.items()}
    head_dim = HEAD_DIM_STEP * int(rng.integers(1, MAX_HEAD_DIM // HEAD_DIM_STEP + 1))
    head_dim_v = (HEAD_DIM_STEP * int(rng.integers(1, head_dim // HEAD_DIM_STEP + 1)) if odds["narrow_v"]
                  else head_dim)
    kv_heads = int(rng.integers(1, 5))
    heads = kv_heads * int(rng.choice((1, 2, 3, 4, 8)))
    lens_q = lens_k = None
    if odds["varlen"]:
        batch = int(rng.integers(1, 5))
        lens_q = tuple(_length(rng, allow_zero=True) for _ in range(batch))
        lens_k = lens_q if rng.random() < 0.5 else tuple(_length(rng, allow_zero=True) for _ in range(batch))
        while sum(a * b for a, b in zip(lens_q, lens_k)) * heads > MAX_SCORES:
            lens_q, lens_k = (tuple(n // 2 for n in lens) for lens in (lens_q, lens_k))
        seqlen_q, seqlen_k = max(max(lens_q), 1), max(max(lens_k), 1)
    else:
        batch = int(rng.integers(1, 4))
        seqlen_q = _length(rng)
        seqlen_k = seqlen_q if rng.random() < 0.5 else _length(rng)
        while batch * heads * seqlen_q * seqlen_k > MAX_SCORES:
            seqlen_q, seqlen_k = max(1, seqlen_q // 2), max(1, seqlen_k // 2)
    window = (_side(rng, seqlen_k), _side(rng, seqlen_k)) if odds["window"] else None
    layout = str(rng.choice(LAYOUTS))
    if layout == "packed" and head_dim_v != head_dim:   # one buffer's heads share a head dim
        layout = "padded"
    return FuzzCase(
        index=index, dtype=str(rng.choice(("float16", "bfloat16"))), batch=batch, seqlen_q=seqlen_q,
        seqlen_k=seqlen_k, heads=heads, kv_heads=kv_heads, head_dim=head_dim, head_dim_v=head_dim_v,
        causal=odds["causal"], window=window, chunk=int(rng.integers(1, 400)) if odds["chunk"] else 0,
        softcap=float(rng.uniform(0.5, 20.0)) if odds["softcap"] else 0.0,
        alibi=str(rng.choice(("heads", "batch"))) if odds["alibi"] else None,
        scale=float(rng.uniform(0.02, 0.5)) if odds["scale"] else None, layout=layout, backward=odds["backward"],
        given_out=odds["out"], lens_q=lens_q, lens_k=lens_k)


def fuzz_cases(count: int, seed: int = 0) -> list[FuzzCase]:
    """`count` cases drawn from `seed` (the same list for the same arguments)."""
    rng = np.random.default_rng(seed)
    return [draw_case(rng, i) for i in range(count)]


def place(x, layout: str, xp):
    """x (contiguous, heads on axis -2) with the same values in `layout`'s memory: "bhsd" a view of an array whose
    heads come before its rows (transformers' (b, h, s, d) transposed), "padded" a view of rows ROW_PAD elements
    longer; "contiguous" and "packed" (placed by place_qkv) as they are."""
    if layout == "bhsd":
        return xp.ascontiguousarray(xp.swapaxes(x, -3, -2)).swapaxes(-3, -2)
    if layout == "padded":
        buf = xp.zeros(x.shape[:-1] + (x.shape[-1] + ROW_PAD,), dtype=x.dtype)
        buf[..., :x.shape[-1]] = x
        return buf[..., :x.shape[-1]]
    return x


def place_qkv(q, k, v, layout: str, xp):
    """q, k, v in `layout`; "packed": the heads of one buffer (q, k and v where their rows match, else k and v)."""
    if layout != "packed":
        return tuple(place(x, layout, xp) for x in (q, k, v))
    hq, hk = q.shape[-2], k.shape[-2]
    if q.shape[:-2] == k.shape[:-2]:
        buf = xp.concatenate((q, k, v), axis=-2)
        return buf[..., :hq, :], buf[..., hq:hq + hk, :], buf[..., hq + hk:, :]
    buf = xp.concatenate((k, v), axis=-2)
    return q, buf[..., :hk, :], buf[..., hk:, :]


def output_layout(layout: str) -> str:
    """The layout of a case's out and dout: its inputs', but contiguous where they are heads of one qkv buffer."""
    return "contiguous" if layout == "packed" else layout


def poisoned(shape, dtype, layout: str, xp):
    """A NaN-filled output buffer in the output layout of `layout`."""
    return place(xp.full(shape, xp.nan, dtype=dtype), output_layout(layout), xp)


def _slopes(case: FuzzCase, rng, xp):
    """ALiBi's geometric slopes (verify/mods.py's alibi_base), jittered; (heads,) or (batch, heads) float32."""
    if case.alibi is None:
        return None
    base = alibi_base(case.heads, np)
    rows = 1 if case.alibi == "heads" else case.batch
    slopes = (base[None] * (0.5 + rng.random((rows, case.heads)))).astype(np.float32)
    return xp.asarray(slopes[0] if case.alibi == "heads" else slopes)


class _Sequences:
    """The references of a case, batched or one packed sequence at a time (varlen), joined as the API returns them."""

    def __init__(self, case: FuzzCase, xp):
        self.case, self.xp = case, xp
        if case.varlen:
            self.cq, self.ck = offsets(case.lens_q, np), offsets(case.lens_k, np)

    def mods(self, slopes, b: int | None, seqlen_q: int, seqlen_k: int) -> dict:
        c = self.case
        mask = (local_mask(seqlen_q, seqlen_k, c.window or (-1, -1), c.chunk, self.xp)
                if c.window is not None or c.chunk else None)
        if slopes is not None and b is not None and slopes.ndim == 2:
            slopes = slopes[b]
        scale = c.scale if c.scale is not None else c.head_dim ** -0.5
        return dict(scale=scale, causal=c.causal, mask=mask, softcap=c.softcap, alibi_slopes=slopes)

    def each(self, arrays, slopes):
        """(per-sequence arrays with a batch axis of 1, their mods) for each sequence; the batched case whole."""
        c = self.case
        if not c.varlen:
            yield arrays, self.mods(slopes, None, c.seqlen_q, c.seqlen_k)
            return
        for b, (nq, nk) in enumerate(zip(c.lens_q, c.lens_k)):
            queries, keys = slice(self.cq[b], self.cq[b + 1]), slice(self.ck[b], self.ck[b + 1])
            rows = (queries, keys, keys) + (queries,) * (len(arrays) - 3)   # q, k, v, then dout (query rows)
            yield tuple(a[r][None] for a, r in zip(arrays, rows)), self.mods(slopes, b, nq, nk)


def _forward_refs(seqs: _Sequences, q, k, v, slopes, dtype):
    """float64 reference and plain same-precision (out, lse), joined as the API lays them out."""
    xp = seqs.xp
    refs, plains = [], []
    for (qs, ks, vs), kw in seqs.each((q, k, v), slopes):
        refs.append(reference_attention(qs, ks, vs, **kw))
        plains.append(plain_attention(qs, ks, vs, dtype=dtype, **kw))
    if not seqs.case.varlen:
        return refs[0], plains[0]

    def join(pairs):   # out (1, n, h, d) -> (total, h, d); lse (1, h, n) -> (h, total)
        return (xp.concatenate([o[0] for o, _ in pairs], axis=0), xp.concatenate([s[0] for _, s in pairs], axis=1))
    return join(refs), join(plains)


def _backward_refs(seqs: _Sequences, q, k, v, dout, slopes, dtype):
    """float64 and plain (dq, dk, dv), joined as the API lays them out."""
    from .reference_backward import plain_backward, reference_backward
    xp = seqs.xp
    refs, plains = [], []
    for (qs, ks, vs, ds), kw in seqs.each((q, k, v, dout), slopes):
        if qs.shape[1] == 0 or ks.shape[1] == 0:   # nothing attends: every gradient of the sequence is 0
            zeros = tuple(xp.zeros(x.shape, dtype=xp.float64) for x in (qs, ks, vs))
            refs.append(zeros)
            plains.append(zeros)
            continue
        refs.append(reference_backward(qs, ks, vs, ds, **kw))
        plains.append(plain_backward(qs, ks, vs, ds, dtype=dtype, **kw))
    if not seqs.case.varlen:
        return refs[0], plains[0]

    def join(grads):
        return tuple(xp.concatenate([g[i][0] for g in grads], axis=0) for i in range(3))
    return join(refs), join(plains)


def chosen_variant(case: FuzzCase) -> str:
    """The kernel the API picks for the case's forward (flashkit.explain; '?' where it cannot say)."""
    from ..api import explain
    from ..errors import FlashkitError
    try:
        return explain(dtype=case.dtype, head_dim=case.head_dim, head_dim_v=case.head_dim_v, seqlen_q=case.seqlen_q,
                       seqlen_k=case.seqlen_k, heads=case.heads, kv_heads=case.kv_heads, batch=case.batch,
                       causal=case.causal, lse=True, window=case.window is not None or case.chunk > 0,
                       softcap=case.softcap > 0, alibi=case.alibi is not None, varlen=case.varlen).chosen.name
    except FlashkitError:
        return "?"


def fuzz_check(case: FuzzCase) -> Check:
    """The case's call (and backward) against the float64 reference; the result's variant is the API's choice."""
    label = case.label()

    def run(seed: int) -> CheckResult:
        from ..api import attention
        from ..backward import attention_backward, attention_varlen_backward
        from ..errors import FlashkitError
        from ..varlen import attention_varlen
        from .backward import judge_each, poison_pool
        xp = cupy_module()
        dtype = BY_NAME[case.dtype]
        variant = "auto:" + chosen_variant(case)
        rng = np.random.default_rng([seed, case.index])
        lead = (sum(case.lens_q),) if case.varlen else (case.batch, case.seqlen_q)
        lead_k = (sum(case.lens_k),) if case.varlen else (case.batch, case.seqlen_k)

        def normal(shape):
            return xp.asarray(rng.standard_normal(shape, dtype=np.float32)).astype(dtype.storage)
        q, k, v = place_qkv(normal(lead + (case.heads, case.head_dim)), normal(lead_k + (case.kv_heads, case.head_dim)),
                            normal(lead_k + (case.kv_heads, case.head_dim_v)), case.layout, xp)
        slopes = _slopes(case, rng, xp)
        out_shape = lead + (case.heads, case.head_dim_v)
        out = poisoned(out_shape, q.dtype, case.layout, xp) if case.given_out else None
        mods = dict(softmax_scale=case.scale, window_size=case.window, softcap=case.softcap, alibi_slopes=slopes,
                    attention_chunk=case.chunk)
        try:
            if case.varlen:
                cu_q, cu_k = offsets(case.lens_q, xp), offsets(case.lens_k, xp)
                sizes = (cu_q, cu_k, case.seqlen_q, case.seqlen_k)
                got, lse = attention_varlen(q, k, v, *sizes, causal=case.causal, return_lse=True, out=out, **mods)
            else:
                got, lse = attention(q, k, v, causal=case.causal, return_lse=True, out=out, **mods)
        except FlashkitError as e:
            return CheckResult(variant, label, math.nan, math.nan, None, None, False, f"forward raised {e!r}")
        seqs = _Sequences(case, xp)
        (ref, lse_ref), (plain, lse_plain) = _forward_refs(seqs, q, k, v, slopes, dtype)
        atol = output_atol(ref, dtype, max(case.seqlen_k, case.head_dim))
        result = judge(variant, label, got, ref, plain, atol, lse, lse_ref, lse_plain, head_dim=case.head_dim)
        if not result.passed or not case.backward:
            return result
        dout = place(normal(out_shape), output_layout(case.layout), xp)
        poison_pool((q, k, v))
        try:
            if case.varlen:
                grads = attention_varlen_backward(dout, q, k, v, got, lse, *sizes, causal=case.causal, **mods)
            else:
                grads = attention_backward(dout, q, k, v, got, lse, causal=case.causal, **mods)
        except FlashkitError as e:
            return CheckResult(variant, label, math.nan, math.nan, None, None, False, f"backward raised {e!r}")
        refs, plains = _backward_refs(seqs, q, k, v, dout, slopes, dtype)
        back = judge_each(variant, label, grads, refs, plains, case.dtype, max(case.seqlen_q, case.seqlen_k))
        note = f"forward {result.max_error:.3g}/{result.bound:.3g}; backward {back.note}"
        # err <= bound shows the gradient closest to (or furthest past) its bound: the backward's verdict
        return CheckResult(variant, label, back.max_error, back.bound, result.lse_error, result.lse_bound, back.passed,
                           note)

    return Check("fuzz", label, run)


def fuzz_checks(count: int, seed: int = 0) -> list[Check]:
    """One check a case of fuzz_cases(count, seed)."""
    return [fuzz_check(c) for c in fuzz_cases(count, seed)]
