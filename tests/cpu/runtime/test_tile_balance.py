"""runtime/tile_balance.py: the host keeps the persistent grid only where its static tile order balances the work."""

from __future__ import annotations

import numpy as np

from flashkit.runtime.tile_balance import (MAX_IMBALANCE, causal_tile_work, persistent_balances,
                                           snake_imbalance)


def test_causal_work_is_heaviest_first_and_bottom_right_aligned():
    assert causal_tile_work(512, 512, 128, 128).tolist() == [4, 3, 2, 1]
    assert causal_tile_work(300, 300, 128, 64).tolist() == [5, 4, 2]          # rows 256-299 see keys 0-299
    assert causal_tile_work(256, 1000, 128, 128).tolist() == [8, 7]           # seqlen_k > seqlen_q: the offset
    assert causal_tile_work(1000, 10, 128, 128).tolist()[-1] == 0             # top rows see no key


def test_the_snake_order_balances_few_blocks_a_head_but_not_about_one_round_of_them():
    assert snake_imbalance(causal_tile_work(8192, 8192, 128, 128), 32, 132) < 1.05     # 64 blocks a head
    assert snake_imbalance(causal_tile_work(16384, 16384, 128, 128), 16, 132) > 1.4    # 128 blocks, 132 CTAs
    assert snake_imbalance(np.ones(7), 10, 132) == 1.0                                 # one round, equal tiles


def test_persistent_is_kept_unless_the_order_leaves_sms_idle():
    assert persistent_balances(16384, 16384, 16, 128, 128, causal=False, ctas=132)     # equal tiles: always
    assert persistent_balances(2048, 2048, 128, 128, 128, causal=True, ctas=132)
    assert not persistent_balances(16384, 16384, 16, 128, 128, causal=True, ctas=132)
    assert not persistent_balances(8192, 8192, 20, 128, 64, causal=True, ctas=132)     # hd192's 64-key tiles
    assert MAX_IMBALANCE > 1.0


def test_explain_says_which_grid_a_call_takes():
    from flashkit.api import explain
    notes = lambda **kw: [n for n in explain(cc=(9, 0), **kw).notes if n.startswith("grid:")]  # noqa: E731
    assert notes(head_dim=128, seqlen_q=16384, heads=16, causal=True)[0].startswith(
        "grid: one CTA a tile (2048 tiles): the persistent static order would take 1.5")
    assert notes(head_dim=128, seqlen_q=2048, batch=8, causal=True)[0].startswith(
        "grid: persistent, 132 CTAs walk 2048 causal tiles")
    assert notes(head_dim=128, seqlen_q=2048)[0].startswith("grid: persistent, 132 CTAs walk 256 tiles of equal work")
    assert notes(head_dim=128, seqlen_q=256, heads=2)[0].startswith("grid: persistent, 4 CTAs walk 4 tiles")
    assert "not persistent" in notes(head_dim=256, seqlen_q=2048)[0]
    assert notes(head_dim=128, seqlen_q=2048, variant="fa2") == []   # a q_blocks grid: no line
