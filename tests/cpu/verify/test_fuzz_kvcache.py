"""The serving fuzz cases (verify/fuzz_kvcache.py): calls the API validates and a kernel runs on sm_80 and sm_90,
reproducible from the seed, every feature drawn; the inputs hold what the case names, and the caches' expected
contents have k_new / v_new at each sequence's length."""

from __future__ import annotations

import numpy as np
import pytest

from flashkit.api import request_for
from flashkit.call.arrays import ArrayMeta
from flashkit.features.kv_cache import validate_kvcache
from flashkit.features.mods import mods_of
from flashkit.registry import discover_kernels
from flashkit.registry.select import select_kernel
from flashkit.verify.fuzz_kvcache import (CACHE_LAYOUTS, FEATURE_ODDS, MAX_PACKED_ROWS, MAX_ROWS, NEW_LAYOUTS,
                                          Q_LAYOUTS, case_inputs, fuzz_kvcache_check, key_rows, kvcache_cases,
                                          pool_pages)

CASES = kvcache_cases(300, seed=0)


def meta(x, name):
    """x (a host array standing in for a device one) as validation sees it."""
    return ArrayMeta(name, tuple(x.shape), np.dtype(x.dtype), tuple(s // x.itemsize for s in x.strides), True,
                     "numpy.ndarray")


def test_the_same_seed_draws_the_same_cases_and_another_seed_others():
    assert kvcache_cases(40, seed=0) == CASES[:40]
    assert kvcache_cases(40, seed=1) != CASES[:40]


@pytest.mark.parametrize("index", range(0, 300, 7))
def test_a_case_is_a_call_the_api_validates_and_a_kernel_runs(index):
    case = CASES[index]
    a = case_inputs(case, np.random.default_rng(index), np)
    seqlens = np.full(case.batch, a.cache_seqlens, np.int32) if case.lens_as_int else a.cache_seqlens
    call = validate_kvcache(
        meta(a.q, "q"), meta(a.k_cache, "k_cache"), meta(a.v_cache, "v_cache"), meta(seqlens, "cache_seqlens"),
        None if a.block_table is None else meta(a.block_table, "block_table"),
        None if a.k_new is None else meta(a.k_new, "k_new"), None if a.v_new is None else meta(a.v_new, "v_new"),
        case.scale)
    assert call.problem.seqlen_k == case.capacity and call.seqlen_new == case.seqlen_new
    assert max(case.lens) + case.seqlen_new <= case.capacity                  # check_values' bound
    mods = mods_of(call.problem, case.causal, window_size=case.window, softcap=case.softcap)
    for cc in ((8, 0), (9, 0)):
        req = request_for(call.problem, causal=case.causal, lse=True, kv_cache=True, cc=cc, **mods.request_flags())
        assert select_kernel(req, discover_kernels().specs).chosen.name == "decode"


def test_every_case_keeps_to_the_kernels_limits():
    for case in CASES:
        assert 1 <= case.seqlen_q <= MAX_ROWS and case.seqlen_q * case.heads // case.kv_heads <= MAX_PACKED_ROWS
        assert case.heads % case.kv_heads == 0 and min(case.lens) >= 0, case
        if case.page_size:
            assert case.capacity % case.page_size == 0, case
            assert case.capacity // case.page_size >= max(pool_pages(case)), case


def test_the_cases_cover_every_feature_and_layout():
    seen = {
        "speculative": any(c.seqlen_q > 1 for c in CASES), "append": any(c.seqlen_new for c in CASES),
        "paged": any(c.page_size for c in CASES), "equal_lengths": any(c.lens_as_int for c in CASES),
        "causal": any(c.causal for c in CASES), "scale": any(c.scale is not None for c in CASES),
        "out": any(c.given_out for c in CASES), "window": any(c.window for c in CASES),
        "softcap": any(c.softcap for c in CASES),
    }
    assert seen == {name: True for name in FEATURE_ODDS}
    assert {c.q_layout for c in CASES} == set(Q_LAYOUTS)
    assert {c.cache_layout for c in CASES} == set(CACHE_LAYOUTS)
    assert {c.new_layout for c in CASES if c.seqlen_new} == set(NEW_LAYOUTS)
    assert {c.table_fill for c in CASES if c.page_size} == {"-1", "page"}
    assert any(0 in c.lens and not c.seqlen_new for c in CASES)               # a sequence with no key at all
    assert any(c.causal and c.seqlen_q > min(c.lens) + c.seqlen_new for c in CASES)   # rows that see no key
    assert any(c.kv_heads == 1 and c.heads > 1 for c in CASES)                 # MQA
    assert any(1 < c.kv_heads < c.heads for c in CASES)                        # GQA
    assert any(n % 16 in (15, 0, 1) and n > 16 for c in CASES for n in c.lens)  # tile boundaries +- 1
    assert {c.window[1] for c in CASES if c.window} >= {-1, 0} and any(c.window and c.window[1] > 0 for c in CASES)
    assert any(c.window and c.softcap and c.causal for c in CASES)             # Gemma 2's serving call
    head_dims = discover_kernels().get("decode").head_dims                       # every class, each padded too
    assert {head_dims.class_of(c.head_dim) for c in CASES if c.head_dim in head_dims.classes} == set(head_dims.classes)
    assert {head_dims.class_of(c.head_dim) for c in CASES if c.head_dim not in head_dims.classes} == \
        set(head_dims.classes)


def test_labels_name_each_case_once():
    labels = [fuzz_kvcache_check(c).label for c in CASES]
    assert len(set(labels)) == len(labels)


@pytest.mark.parametrize("index", [i for i, c in enumerate(CASES) if c.page_size and c.seqlen_new][:6])
def test_the_expected_caches_hold_the_append_at_each_length_and_nothing_else(index):
    case = CASES[index]
    rng = np.random.default_rng(index)
    a = case_inputs(case, rng, np)
    before = np.asarray(a.k_cache).copy()   # the cache as passed (unchanged on the host)
    changed = before.view(np.uint16) != a.k_want.view(np.uint16)
    pages = set(a.table_host.reshape(-1).tolist())
    touched = 0
    for b, n in enumerate(case.lens):
        p, r = key_rows(case, a.table_host, b, n + case.seqlen_new)
        new = np.asarray(a.k_new)[b]
        np.testing.assert_array_equal(a.k_want[p[n:], r[n:]].view(np.uint16), new.view(np.uint16))
        touched += case.seqlen_new
        assert set(p.tolist()) <= pages
    assert changed.any(axis=(2, 3)).sum() <= touched   # rows outside the appends keep their values


def test_sequences_own_distinct_pages():
    for case in [c for c in CASES if c.page_size][:40]:
        a = case_inputs(case, np.random.default_rng(0), np)
        owned = [a.table_host[b, :n] for b, n in enumerate(pool_pages(case))]
        flat = np.concatenate(owned)
        assert len(set(flat.tolist())) == len(flat), case
        assert flat.max() < a.k_cache.shape[0]


# The check itself, run on the host: a stand-in for attention_with_kvcache built from the library's validation and
# append (features/kv_cache.py) and the float64 reference must pass, and each way of getting a call wrong must fail.
class _HostArrays:
    """NumPy in CuPy's place for the check's and the judge's array calls."""

    asnumpy = staticmethod(np.asarray)

    def __getattr__(self, name):
        return getattr(np, name)


def _host_kvcache(broken: str = ""):
    from flashkit.features.kv_cache import append_new
    from flashkit.verify.decode import reference_masking
    from flashkit.verify.reference import reference_attention

    def call(q, k_cache, v_cache, *, cache_seqlens, block_table, k_new, v_new, causal, softmax_scale, window_size,
             softcap, return_lse, out):
        batch = q.shape[0]
        seqlens = np.full(batch, cache_seqlens, np.int32) if isinstance(cache_seqlens, int) else cache_seqlens
        kv = validate_kvcache(meta(q, "q"), meta(k_cache, "k_cache"), meta(v_cache, "v_cache"),
                              meta(seqlens, "cache_seqlens"),
                              None if block_table is None else meta(block_table, "block_table"),
                              None if k_new is None else meta(k_new, "k_new"),
                              None if v_new is None else meta(v_new, "v_new"), softmax_scale)
        if broken != "no append":
            append_new(kv, k_cache, v_cache, k_new, v_new, seqlens + (broken == "append one late"), block_table, np)
        lengths = seqlens + kv.seqlen_new
        result = np.empty(q.shape, q.dtype) if out is None else out
        lse = np.empty((batch, q.shape[2], q.shape[1]), np.float32)
        scale = softmax_scale or q.shape[-1] ** -0.5
        for b in range(batch):
            j = np.arange(int(lengths[b]))
            at = (np.full(len(j), b), j) if block_table is None else (block_table[b, j // kv.page_size],
                                                                      j % kv.page_size)
            masking = reference_masking(q.shape[1], len(j), causal, window_size, np)
            o, s = reference_attention(q[b:b + 1], k_cache[at][None], v_cache[at][None], scale=scale, softcap=softcap,
                                       **masking)
            result[b], lse[b] = o[0] + (0.05 if broken == "output" else 0), s[0]
        return result, lse
    return call


# NumPy warns where the judge's masked LSE difference meets -inf - -inf (CuPy does not); the mask drops those.
HOST_LSE = pytest.mark.filterwarnings("ignore:invalid value encountered in subtract:RuntimeWarning")


@pytest.fixture
def on_host(monkeypatch):
    import flashkit.kvcache
    import flashkit.verify.fuzz_kvcache as fk
    import flashkit.verify.harness as harness
    monkeypatch.setattr(fk, "cupy_module", _HostArrays)
    monkeypatch.setattr(harness, "cupy_module", _HostArrays)

    def use(broken=""):
        monkeypatch.setattr(flashkit.kvcache, "attention_with_kvcache", _host_kvcache(broken))
    return use


@HOST_LSE
@pytest.mark.parametrize("index", [i for i, c in enumerate(CASES) if max(c.lens) < 600][:12])
def test_a_correct_call_passes_the_check(on_host, index):
    on_host()
    result = fuzz_kvcache_check(CASES[index]).run(index)
    assert result.passed, result.note


APPENDING = [i for i, c in enumerate(CASES) if c.seqlen_new and max(c.lens) < 600]


@HOST_LSE
@pytest.mark.parametrize("broken, index, why", [
    ("no append", APPENDING[0], "k_cache differs"), ("append one late", APPENDING[1], "k_cache differs"),
    ("output", 2, "")])
def test_a_wrong_call_fails_the_check(on_host, broken, index, why):
    on_host(broken)
    result = fuzz_kvcache_check(CASES[index]).run(index)
    assert not result.passed and why in result.note
