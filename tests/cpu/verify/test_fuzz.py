"""The fuzz cases (verify/fuzz.py): valid calls only, reproducible from the seed, every feature drawn; the layouts
hold the same values in the memory they name."""

from __future__ import annotations

import numpy as np
import pytest

from flashkit.verify.fuzz import (FEATURE_ODDS, LAYOUTS, MAX_HEAD_DIM, MAX_SCORES, ROW_PAD, fuzz_cases, fuzz_check,
                                  place, place_qkv)

CASES = fuzz_cases(400, seed=0)


def test_the_same_seed_draws_the_same_cases_and_another_seed_others():
    assert fuzz_cases(50, seed=0) == CASES[:50]
    assert fuzz_cases(50, seed=1) != CASES[:50]


def test_every_case_is_a_call_the_api_documents():
    for case in CASES:
        assert case.dtype in ("float16", "bfloat16"), case
        assert case.head_dim % 8 == 0 and 8 <= case.head_dim <= MAX_HEAD_DIM, case
        assert case.head_dim_v % 8 == 0 and 8 <= case.head_dim_v <= case.head_dim, case   # v narrower or the same
        assert case.heads % case.kv_heads == 0, case
        assert case.layout in LAYOUTS and (case.layout != "packed" or case.head_dim_v == case.head_dim), case
        if case.window is not None:
            assert all(isinstance(w, int) and w >= -1 for w in case.window), case
        assert case.chunk >= 0 and case.softcap >= 0 and (case.scale is None or case.scale > 0), case
        if case.varlen:
            assert len(case.lens_q) == len(case.lens_k) == case.batch, case
            assert min(case.lens_q + case.lens_k) >= 0, case
            assert case.seqlen_q >= max(case.lens_q) and case.seqlen_k >= max(case.lens_k), case
            assert sum(a * b for a, b in zip(case.lens_q, case.lens_k)) * case.heads <= MAX_SCORES, case
        else:
            assert min(case.seqlen_q, case.seqlen_k) >= 1, case
            assert case.batch * case.heads * case.seqlen_q * case.seqlen_k <= MAX_SCORES, case


def test_the_cases_cover_every_feature_and_layout():
    seen = {
        "causal": any(c.causal for c in CASES), "window": any(c.window for c in CASES),
        "chunk": any(c.chunk for c in CASES), "softcap": any(c.softcap for c in CASES),
        "alibi": any(c.alibi for c in CASES), "scale": any(c.scale is not None for c in CASES),
        "narrow_v": any(c.head_dim_v < c.head_dim for c in CASES), "backward": any(c.backward for c in CASES),
        "varlen": any(c.varlen for c in CASES), "out": any(c.given_out for c in CASES),
    }
    assert seen == {name: True for name in FEATURE_ODDS}
    assert {c.layout for c in CASES} == set(LAYOUTS)
    assert {c.alibi for c in CASES} == {None, "heads", "batch"}
    assert any(c.kv_heads == 1 and c.heads > 1 for c in CASES)                  # MQA
    assert any(1 < c.kv_heads < c.heads for c in CASES)                          # GQA
    assert any(c.seqlen_q != c.seqlen_k for c in CASES if not c.varlen)
    assert any(c.varlen and 0 in c.lens_q + c.lens_k for c in CASES)             # empty sequences
    assert any(c.seqlen_q % 64 in (63, 0, 1) and c.seqlen_q > 64 for c in CASES)  # tile boundaries +- 1
    assert len({c.head_dim for c in CASES}) > 20


def test_labels_name_each_case_once():
    labels = [fuzz_check(c).label for c in CASES]
    assert len(set(labels)) == len(labels)
    assert all(label.startswith(f"fuzz#{c.index} ") for label, c in zip(labels, CASES))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_layout_keeps_the_values_in_the_memory_it_names(layout):
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 5, 4, 16)).astype(np.float16)
    k = rng.standard_normal((2, 5, 2, 16)).astype(np.float16)
    v = rng.standard_normal((2, 5, 2, 16)).astype(np.float16)
    placed = place_qkv(q, k, v, layout, np)
    for want, got in zip((q, k, v), placed):
        np.testing.assert_array_equal(got, want)
    pq = placed[0]
    item = q.itemsize
    if layout == "contiguous":
        assert pq.flags.c_contiguous
    elif layout == "bhsd":      # heads before rows: (b, h, s, d) memory seen as (b, s, h, d)
        assert pq.strides == (4 * 5 * 16 * item, 16 * item, 5 * 16 * item, item)
    elif layout == "padded":    # rows ROW_PAD elements longer than the head dim
        assert pq.strides[-2] == (16 + ROW_PAD) * item and not pq.flags.c_contiguous
    else:                       # q, k, v heads of one (b, s, 4 + 2 + 2, d) buffer
        assert all(x.strides[1] == 8 * 16 * item for x in placed)
        assert placed[1].__array_interface__["data"][0] - pq.__array_interface__["data"][0] == 4 * 16 * item


def test_packed_keys_and_values_share_a_buffer_when_the_lengths_differ():
    q = np.zeros((1, 3, 2, 8), np.float16)
    k = np.ones((1, 7, 1, 8), np.float16)
    v = np.full((1, 7, 1, 8), 2, np.float16)
    pq, pk, pv = place_qkv(q, k, v, "packed", np)
    assert pq is q and pk.strides[1] == pv.strides[1] == 2 * 8 * 2
    np.testing.assert_array_equal(pk, k)
    np.testing.assert_array_equal(pv, v)


def test_a_bhsd_view_of_packed_rows_works_for_three_dimensional_varlen_arrays():
    x = np.arange(3 * 2 * 8, dtype=np.float32).reshape(3, 2, 8)
    y = place(x, "bhsd", np)
    np.testing.assert_array_equal(y, x)
    assert y.strides == (8 * 4, 3 * 8 * 4, 4)
