"""padding.py: transformers' masks classified exactly (NumPy), checked against a brute-force reading of what
each token's query may see."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from flashkit.errors import InputError, UnsupportedError
from flashkit.integrations.padding import padding_of_4d, plan_padding


def visible(mask2d: np.ndarray, q_len: int, causal: bool, window=None) -> dict:
    """What the padding mask means: {(b, query row): keys it sees} for every query that is a token."""
    b, keys = mask2d.shape
    out = {}
    for s in range(b):
        for r in range(q_len):
            p = keys - q_len + r
            if not mask2d[s, p]:   # a padding position: its output is unspecified
                continue
            seen = {j for j in range(keys) if mask2d[s, j] and (not causal or j <= p)}
            if window is not None:
                seen = {j for j in seen if j >= p - window[0] and (causal or j <= p + window[1])}
            out[(s, r)] = seen
    return out


def planned(plan, batch: int, q_len: int, window=None) -> dict:
    """What the plan computes for the same queries: a dense call over keys [0, plan.keys) (bottom-right causal),
    or per sequence the packed tokens with bottom-right causal in packed coordinates."""
    out = {}
    keys = plan.keys
    for s in range(batch):
        if not plan.ragged:
            for r in range(q_len):
                p = keys - q_len + r
                seen = set(range(keys)) if not plan.causal else set(range(p + 1))
                if window is not None:
                    seen = {j for j in seen if j >= p - window[0] and (plan.causal or j <= p + window[1])}
                out[(s, r)] = seen
            continue
        kpos = list(np.flatnonzero(plan.key_mask[s]))
        qrows = list(np.flatnonzero(plan.query_mask[s]))
        nk, nq = len(kpos), len(qrows)
        for rank, r in enumerate(qrows):
            cols = [c for c in range(nk) if not plan.causal or c <= rank + nk - nq]
            if window is not None:
                cols = [c for c in cols if c >= rank + nk - nq - window[0] and
                        (plan.causal or c <= rank + nk - nq + window[1])]
            out[(s, r)] = {kpos[c] for c in cols}
    return out


def check_exact(mask2d, q_len, causal, window=None):
    plan = plan_padding(mask2d, q_len, mask2d.shape[1], causal, window)
    want = visible(mask2d, q_len, causal, window)
    got = planned(plan, mask2d.shape[0], q_len, window)
    for key, seen in want.items():
        assert got.get(key) == seen, (mask2d.astype(int).tolist(), q_len, causal, key, got.get(key), seen)
    return plan


RIGHT = np.array([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0], [1, 0, 0, 0, 0, 0]], dtype=np.int64)
LEFT = RIGHT[:, ::-1].copy()
HOLES = np.array([[1, 0, 1, 1, 0, 1], [0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0]], dtype=np.int64)


def test_no_padding_is_one_dense_call():
    plan = check_exact(np.ones((2, 5), dtype=bool), 5, True)
    assert not plan.ragged and plan.keys == 5 and plan.causal


def test_right_padding_under_causal_attention_is_dense():
    plan = check_exact(RIGHT, 6, True)
    assert not plan.ragged


@pytest.mark.parametrize("mask,causal", [(RIGHT, False), (LEFT, True), (LEFT, False), (HOLES, True),
                                         (HOLES, False)])
def test_other_padding_is_ragged_and_exact(mask, causal):
    for q_len in (1, 2, 6):
        plan = check_exact(mask, q_len, causal)
        assert plan.ragged


def test_every_small_mask_is_exact():
    """All 2-sequence masks over 4 keys, causal and not, every query length: the plan sees what the mask says."""
    rows = [np.array(r) for r in itertools.product((0, 1), repeat=4)]
    for a, b in itertools.product(rows, rows):
        mask = np.stack([a, b])
        for causal, q_len in itertools.product((False, True), (1, 2, 4)):
            check_exact(mask, q_len, causal)


def test_window_with_left_or_right_padding_is_exact_and_holes_refused():
    for mask, causal in itertools.product((RIGHT, LEFT), (True, False)):
        check_exact(mask, 6, causal, window=(1, 1))
    with pytest.raises(UnsupportedError, match="attention_mask: padding between tokens with a sliding window"):
        plan_padding(HOLES, 6, 6, True, (1, 1))


def test_a_static_cache_mask_covers_a_prefix_of_the_keys():
    mask = np.ones((2, 5), dtype=bool)
    plan = plan_padding(mask, 2, 9, True)
    assert plan.keys == 5 and not plan.ragged
    with pytest.raises(UnsupportedError, match="attention_mask: covers 5 keys, fewer than the 6 queries"):
        plan_padding(mask, 6, 9, True)
    with pytest.raises(InputError, match="attention_mask: expected a 2D"):
        plan_padding(mask[None], 2, 5, True)


def _sdpa_style(mask2d, q_len, causal, additive=False, dtype=np.float32):
    """The 4D mask transformers' sdpa path builds: keep = padding & causal (bottom-right), per query row."""
    b, kv = mask2d.shape
    i = np.arange(q_len)[:, None] + kv - q_len
    j = np.arange(kv)[None, :]
    keep = mask2d.astype(bool)[:, None, None, :] & ((j <= i) if causal else np.ones((q_len, kv), bool))[None, None]
    if not additive:
        return keep
    return np.where(keep, 0, np.finfo(dtype).min).astype(dtype)


@pytest.mark.parametrize("mask", [RIGHT, LEFT, HOLES])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("additive", [False, True])
def test_4d_padding_masks_reduce_to_their_2d_mask(mask, causal, additive):
    for q_len in (1, 3, 6):
        four = _sdpa_style(mask, q_len, causal, additive)
        keys, got_causal = padding_of_4d(four, 3, q_len, 6, causal=not causal)
        assert (keys == mask.astype(bool)).all()
        if q_len > 1 and not (mask.all(axis=1).all()):
            check_exact(keys, q_len, got_causal)


def test_4d_masks_that_are_no_padding_pattern_are_refused():
    rng = np.random.default_rng(0)
    noise = rng.random((2, 1, 6, 6)) < 0.5
    with pytest.raises(UnsupportedError, match="attention_mask: this 4D mask is not a padding mask"):
        padding_of_4d(noise, 2, 6, 6, True)
    bias = _sdpa_style(RIGHT, 6, True, additive=True)
    bias[0, 0, 3, 1] = -2.5
    with pytest.raises(UnsupportedError, match="a bias"):
        padding_of_4d(bias, 3, 6, 6, True)
    heads = np.concatenate([_sdpa_style(RIGHT, 6, True), _sdpa_style(LEFT, 6, True)], axis=1)
    with pytest.raises(UnsupportedError, match="differs between heads"):
        padding_of_4d(heads, 3, 6, 6, True)
    with pytest.raises(InputError, match="attention_mask: expected a 4D mask"):
        padding_of_4d(_sdpa_style(RIGHT, 6, True), 3, 5, 6, True)


def test_a_broadcast_4d_mask_covers_the_batch():
    keys, causal = padding_of_4d(_sdpa_style(np.ones((1, 6), int), 6, True), 4, 6, 6, causal=False)
    assert keys.shape == (4, 6) and keys.all() and causal
