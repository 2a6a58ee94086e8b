"""runtime/bwd_order.py: the backward's causal key-block order, sized per call by simulating the schedule."""

from __future__ import annotations

import numpy as np
import pytest

from flashkit.runtime.bwd_order import (greedy_makespan, launch_order_costs, order_pairs,
                                        visits_per_key_block)

H100_SMS = 132


def test_visits_fall_with_the_key_block_under_the_causal_mask():
    assert visits_per_key_block(512, 512, 64, 128, causal=True).tolist() == [8, 6, 4, 2]
    assert visits_per_key_block(512, 512, 64, 128, causal=False).tolist() == [8, 8, 8, 8]
    assert visits_per_key_block(128, 512, 64, 128, causal=True).tolist() == [2, 2, 2, 2]   # bottom-right aligned
    assert visits_per_key_block(512, 128, 64, 128, causal=True).tolist() == [2]            # top rows see no key
    # a left window of 128 keys: key block n is seen by the query blocks within 128 rows after it
    assert visits_per_key_block(512, 512, 64, 128, causal=True, window=(128, 0)).tolist() == [4, 4, 4, 2]


def test_launch_order_costs_take_each_groups_key_block_0_first():
    work = np.array([3.0, 2.0, 1.0])
    assert launch_order_costs(work, pairs=2, group=1).tolist() == [3, 2, 1, 3, 2, 1]    # the launch order
    assert launch_order_costs(work, pairs=3, group=2).tolist() == [3, 3, 2, 2, 1, 1, 3, 2, 1]


def test_greedy_makespan_is_the_list_schedule():
    assert greedy_makespan(np.array([4.0, 1, 1, 1, 1]), sms=2) == 4.0
    assert greedy_makespan(np.array([1.0, 1, 1, 1, 4]), sms=2) == 6.0                     # the heavy one last
    assert greedy_makespan(np.zeros(0), sms=2) == 0.0


@pytest.mark.parametrize("shape,group", [
    ((8, 4, 4, 2048, 2048, 64, 192), 16),   # issue 12's training shape, hd64 GQA 16 / 4: the tail of 2.7 waves
    ((8, 2, 4, 2048, 2048, 64, 128), 8),    # hd128 GQA 8 / 2: one-wave groups, measured 0.655x -> 1.00x cuDNN
    ((2, 16, 1, 8192, 8192, 64, 128), 2),   # many waves: a small group keeps L2 locality
    ((1, 4, 4, 2048, 2048, 64, 192), 1),    # fewer CTAs than SMs: nothing to reorder
])
def test_order_pairs_takes_the_smallest_group_near_the_best_makespan(shape, group):
    assert order_pairs(*shape, True, (-1, -1), H100_SMS) == group


def test_equal_key_blocks_keep_the_launch_order():
    assert order_pairs(8, 4, 4, 2048, 2048, 64, 192, False, (-1, -1), H100_SMS) == 1
