"""Random serving calls: `attention_with_kvcache` drawn from a seed, against the float64 reference.

verify/decode.py checks the decode kernel on a fixed matrix (lengths of half to all of the capacity, a shuffled
block table, an append). What a server passes varies more, and each case draws it from one seed:
  dtype, head dim   float16 or bfloat16; any multiple of 8 up to 256 (the decode kernel's classes and the head
                    dims padded below them)
  rows              1 query row (decode) or 2-16 (speculative decode), heads in groups of 1-16 over 1-4 kv heads
                    (MHA, GQA, MQA) within the kernel's packed rows (seqlen_q x group <= MAX_PACKED_ROWS)
  lengths           each sequence's cached keys: 0, tiny, random, or a 16-key tile or page boundary +- 1; the same
                    for every sequence, then passed as an int, or not
  append            k_new / v_new of 0-16 rows, written at each sequence's length first
  cache             contiguous with slack rows, or paged (page_size 16-256) through a shuffled block table whose
                    entries past a sequence's pages are -1 or any page (never read); memory contiguous, rows padded
                    past the head dim, or k and v as the heads of one buffer
  call              causal (bottom-right aligned per sequence, so rows may see no key) or not; a softmax scale;
                    a window (left 0-8, about a tile, or up to the longest sequence; right open, 0 or a few keys)
                    and softcap (1-50), each or neither; q and out contiguous, (b, h, s, d) views or padded rows;
                    out given (NaN-poisoned) or not
The judge is DESIGN.md's rule on out and the LSE, each sequence against its own reference; the caches must hold,
bit for bit, what they held with k_new / v_new written at each sequence's length and nothing else. A FlashkitError
is a failure: every drawn call is one the API documents as valid.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..call.dtypes import BY_NAME
from ..features.kv_cache import PAGE_MAX, PAGE_MIN, PAGE_MULTIPLE
from ..runtime.device import cupy_module
from .decode import reference_masking
from .fuzz import HEAD_DIM_STEP, MAX_HEAD_DIM, place
from .harness import Check, CheckResult, judge
from .reference import output_atol, plain_attention, reference_attention

MAX_ROWS = 16              # query rows a sequence (the decode kernel's seqlen_q limit)
MAX_PACKED_ROWS = 64       # seqlen_q x heads / kv_heads (its packed_rows limit)
MAX_NEW = 16               # k_new / v_new rows
MAX_KEYS = 5000            # a sequence's cached keys
TILE_KEYS = 16             # the decode kernel's key tile
Q_LAYOUTS = ("contiguous", "bhsd", "padded")
CACHE_LAYOUTS = ("contiguous", "padded", "kv_packed")
NEW_LAYOUTS = ("contiguous", "bhsd")
FEATURE_ODDS = dict(speculative=0.4, append=0.5, paged=0.6, equal_lengths=0.15, causal=0.5, scale=0.3, out=0.5,
                    window=0.25, softcap=0.25)
SOFTCAP_RANGE = (1.0, 50.0)


@dataclass(frozen=True)
class KvCacheCase:
    """One drawn serving call; lens are each sequence's cached keys before the append."""

    index: int
    dtype: str
    seqlen_q: int
    heads: int
    kv_heads: int
    head_dim: int
    lens: tuple[int, ...]
    seqlen_new: int
    capacity: int            # contiguous: rows a sequence; paged: the block table's pages x page_size
    page_size: int           # 0: contiguous
    spare_pages: int         # pages of the pool no sequence uses
    table_fill: str          # "-1" or "page": the block table's entries past a sequence's pages
    causal: bool
    scale: float | None
    q_layout: str
    cache_layout: str
    new_layout: str
    given_out: bool
    lens_as_int: bool
    window: tuple[int, int] | None = None
    softcap: float = 0.0

    @property
    def batch(self) -> int:
        return len(self.lens)

    def label(self) -> str:
        kv = f"/{self.kv_heads}" if self.kv_heads != self.heads else ""
        lens = f"{self.lens[0]}(int)" if self.lens_as_int else str(list(self.lens))
        parts = [f"kvfuzz#{self.index}", f"b{self.batch} sq{self.seqlen_q} lens{lens}", f"h{self.heads}{kv}",
                 f"d{self.head_dim}", self.dtype, f"q:{self.q_layout}", f"cache:{self.cache_layout}"]
        parts += [f"paged{self.page_size}(fill {self.table_fill}, +{self.spare_pages})"] if self.page_size else [
            f"capacity{self.capacity}"]
        parts += [f"+{self.seqlen_new}new({self.new_layout})"] if self.seqlen_new else []
        parts += ["causal"] if self.causal else []
        parts += [f"window({self.window[0]},{self.window[1]})"] if self.window else []
        parts += [f"softcap({self.softcap:.3g})"] if self.softcap else []
        parts += [f"scale({self.scale:.3g})"] if self.scale is not None else []
        parts += ["out="] if self.given_out else []
        return " ".join(parts)


def _keys(rng: np.random.Generator, page_size: int) -> int:
    """A sequence's cached keys: 0, tiny (1-19), random, or a tile or page boundary +- 1."""
    r = rng.random()
    if r < 0.1:
        return 0
    if r < 0.35:
        return int(rng.integers(1, 20))
    if r < 0.7:
        return int(rng.integers(20, MAX_KEYS))
    unit = page_size if page_size and rng.random() < 0.5 else TILE_KEYS
    return max(0, min(MAX_KEYS, unit * int(rng.integers(1, 40)) + int(rng.integers(-1, 2))))


def draw_kvcache_case(rng: np.random.Generator, index: int) -> KvCacheCase:
    """One random valid attention_with_kvcache call from rng."""
    odds = {name: rng.random() < p for name, p in FEATURE_ODDS.items()}
    seqlen_q = int(rng.integers(2, MAX_ROWS + 1)) if odds["speculative"] else 1
    groups = [g for g in (1, 2, 3, 4, 8, 16) if seqlen_q * g <= MAX_PACKED_ROWS]
    kv_heads = int(rng.integers(1, 5))
    heads = kv_heads * int(rng.choice(groups))
    page_size = PAGE_MULTIPLE * int(rng.integers(PAGE_MIN // PAGE_MULTIPLE, PAGE_MAX // PAGE_MULTIPLE + 1)) if (
        odds["paged"]) else 0
    batch = int(rng.integers(1, 7))
    lens = ((_keys(rng, page_size),) * batch if odds["equal_lengths"]
            else tuple(_keys(rng, page_size) for _ in range(batch)))
    seqlen_new = int(rng.integers(1, MAX_NEW + 1)) if odds["append"] else 0
    longest = max(lens) + seqlen_new
    if page_size:   # the table's width: the longest sequence's pages and 0-2 more (at least one page)
        capacity = page_size * (max(1, -(-longest // page_size)) + int(rng.integers(0, 3)))
    else:
        capacity = max(1, longest + int(rng.choice((0, 0, 1, 5, 40))))
    head_dim = HEAD_DIM_STEP * int(rng.integers(1, MAX_HEAD_DIM // HEAD_DIM_STEP + 1))
    window = _window(rng, longest) if odds["window"] else None
    softcap = float(rng.uniform(*SOFTCAP_RANGE)) if odds["softcap"] else 0.0
    return KvCacheCase(
        index=index, dtype=str(rng.choice(("float16", "bfloat16"))), seqlen_q=seqlen_q, heads=heads,
        kv_heads=kv_heads, head_dim=head_dim, lens=lens, seqlen_new=seqlen_new,
        capacity=capacity, page_size=page_size, spare_pages=int(rng.integers(0, 4)),
        table_fill=str(rng.choice(("-1", "page"))), causal=odds["causal"],
        scale=float(rng.uniform(0.02, 0.5)) if odds["scale"] else None, q_layout=str(rng.choice(Q_LAYOUTS)),
        cache_layout=str(rng.choice(CACHE_LAYOUTS)), new_layout=str(rng.choice(NEW_LAYOUTS)),
        given_out=odds["out"], lens_as_int=odds["equal_lengths"] and rng.random() < 0.5, window=window,
        softcap=softcap)


def _window(rng: np.random.Generator, longest: int) -> tuple[int, int]:
    """window_size's (left, right): left 0-8 keys, a tile +- 1, or up to the longest sequence; right open, 0 (a
    causal window) or a few keys."""
    r = rng.random()
    left = (int(rng.integers(0, 9)) if r < 0.3 else TILE_KEYS + int(rng.integers(-1, 2)) if r < 0.5
            else int(rng.integers(0, max(longest, 1) + 1)))
    right = int(rng.choice((-1, 0, 0, int(rng.integers(1, 9)))))
    return left, right


def kvcache_cases(count: int, seed: int = 0) -> list[KvCacheCase]:
    """`count` cases drawn from `seed` (the same list for the same arguments)."""
    rng = np.random.default_rng(seed)
    return [draw_kvcache_case(rng, i) for i in range(count)]


def place_caches(k, v, layout: str, xp):
    """The caches in `layout`: contiguous, padded rows, or "kv_packed" (the heads of one buffer, k's then v's)."""
    if layout != "kv_packed":
        return place(k, layout, xp), place(v, layout, xp)
    hk = k.shape[-2]
    buf = xp.concatenate((k, v), axis=-2)
    return buf[..., :hk, :], buf[..., hk:, :]


def pool_pages(case: KvCacheCase) -> list[int]:
    """Pages of each sequence (its keys after the append, at least one page)."""
    return [max(1, -(-(n + case.seqlen_new) // case.page_size)) for n in case.lens]


def block_table(case: KvCacheCase, rng: np.random.Generator) -> tuple[np.ndarray, int]:
    """A shuffled block table (batch, capacity / page_size) int32 and the pool's page count: each sequence's pages
    distinct pages of the pool, the entries past them -1 or any page (table_fill)."""
    width = case.capacity // case.page_size
    used = pool_pages(case)
    pool = sum(used) + case.spare_pages
    order = rng.permutation(pool)
    table = (np.full((case.batch, width), -1, dtype=np.int32) if case.table_fill == "-1"
             else rng.integers(0, pool, size=(case.batch, width)).astype(np.int32))
    at = 0
    for b, n in enumerate(used):
        table[b, :n] = order[at:at + n]
        at += n
    return table, pool


def key_rows(case: KvCacheCase, table, b: int, length: int):
    """(page or sequence, row) index arrays of sequence b's keys [0, length)."""
    j = np.arange(length)
    if not case.page_size:
        return np.full(length, b), j
    return table[b, j // case.page_size], j % case.page_size


@dataclass
class KvInputs:
    """A case's arguments in their layouts (xp arrays), and the caches' expected contents after the call (host)."""

    q: object
    k_cache: object
    v_cache: object
    block_table: object
    k_new: object
    v_new: object
    cache_seqlens: object
    out: object
    q_host: np.ndarray
    k_want: np.ndarray
    v_want: np.ndarray
    table_host: np.ndarray | None


def case_inputs(case: KvCacheCase, rng: np.random.Generator, xp) -> KvInputs:
    """Fresh N(0, 1) data for the case, placed as it names; out NaN-poisoned where given."""
    hk, d = case.kv_heads, case.head_dim
    storage = BY_NAME[case.dtype].storage

    def normal(shape):
        return rng.standard_normal(shape, dtype=np.float32).astype(storage)
    if case.page_size:
        table, pool = block_table(case, rng)
        cache_shape = (pool, case.page_size, hk, d)
    else:
        table, cache_shape = None, (case.batch, case.capacity, hk, d)
    k_host, v_host = normal(cache_shape), normal(cache_shape)
    q_host = normal((case.batch, case.seqlen_q, case.heads, d))
    new_host = (normal((case.batch, case.seqlen_new, hk, d)), normal((case.batch, case.seqlen_new, hk, d)))
    # what the caches must hold afterwards: k_new / v_new at positions lens[b] + j, nothing else changed
    k_want, v_want = k_host.copy(), v_host.copy()
    for b, n in enumerate(case.lens):
        pages, rows = key_rows(case, table, b, n + case.seqlen_new)
        k_want[pages[n:], rows[n:]], v_want[pages[n:], rows[n:]] = new_host[0][b], new_host[1][b]
    k_cache, v_cache = place_caches(xp.asarray(k_host), xp.asarray(v_host), case.cache_layout, xp)
    k_new, v_new = ((place(xp.asarray(x), case.new_layout, xp) for x in new_host) if case.seqlen_new
                    else (None, None))
    out = (place(xp.full(q_host.shape, xp.nan, dtype=q_host.dtype), case.q_layout, xp) if case.given_out
           else None)
    seqlens = case.lens[0] if case.lens_as_int else xp.asarray(np.array(case.lens, dtype=np.int32))
    return KvInputs(place(xp.asarray(q_host), case.q_layout, xp), k_cache, v_cache,
                    None if table is None else xp.asarray(table), k_new, v_new, seqlens, out, q_host, k_want,
                    v_want, table)


def fuzz_kvcache_check(case: KvCacheCase) -> Check:
    """The case's call against the float64 reference and the caches' expected contents."""
    label = case.label()

    def run(seed: int) -> CheckResult:
        from ..errors import FlashkitError
        from ..kvcache import attention_with_kvcache
        xp = cupy_module()
        dtype = BY_NAME[case.dtype]
        variant = "auto:kvcache"
        a = case_inputs(case, np.random.default_rng([seed, case.index]), xp)
        try:
            got, lse = attention_with_kvcache(
                a.q, a.k_cache, a.v_cache, cache_seqlens=a.cache_seqlens, block_table=a.block_table, k_new=a.k_new,
                v_new=a.v_new, causal=case.causal, softmax_scale=case.scale, window_size=case.window,
                softcap=case.softcap, return_lse=True, out=a.out)
        except FlashkitError as e:
            return CheckResult(variant, label, math.nan, math.nan, None, None, False, f"raised {e!r}")
        if a.out is not None and not (got is a.out or xp.shares_memory(got, a.out)):
            return CheckResult(variant, label, math.nan, math.nan, None, None, False, "out= was not the result")
        for name, cache, want in (("k_cache", a.k_cache, a.k_want), ("v_cache", a.v_cache, a.v_want)):
            if not np.array_equal(xp.asnumpy(cache).view(np.uint16), want.view(np.uint16)):
                return CheckResult(variant, label, math.nan, math.nan, None, None, False,
                                   f"{name} differs from its contents with k_new / v_new appended")
        scale = case.scale if case.scale is not None else case.head_dim ** -0.5
        refs, plains = [], []
        for b, n in enumerate(case.lens):
            at = key_rows(case, a.table_host, b, n + case.seqlen_new)
            k_b, v_b = (xp.asarray(w[at][None]) for w in (a.k_want, a.v_want))
            q_b = xp.asarray(a.q_host[b:b + 1])
            masking = reference_masking(case.seqlen_q, n + case.seqlen_new, case.causal, case.window, xp)
            refs.append(reference_attention(q_b, k_b, v_b, scale=scale, softcap=case.softcap, **masking))
            plains.append(plain_attention(q_b, k_b, v_b, scale=scale, dtype=dtype, softcap=case.softcap, **masking))
        ref, lse_ref = (xp.concatenate(x) for x in zip(*refs))
        plain, lse_plain = (xp.concatenate(x) for x in zip(*plains))
        atol = output_atol(ref, dtype, max(max(case.lens) + case.seqlen_new, case.head_dim))
        return judge(variant, label, got, ref, plain, atol, lse, lse_ref, lse_plain, head_dim=case.head_dim)

    return Check("fuzz_kvcache", label, run)


def fuzz_kvcache_checks(count: int, seed: int = 0) -> list[Check]:
    """One check a case of kvcache_cases(count, seed)."""
    return [fuzz_kvcache_check(c) for c in kvcache_cases(count, seed)]
