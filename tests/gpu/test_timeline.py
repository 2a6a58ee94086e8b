"""The timeline build of the Hopper forward on a real device (flashkit/bench/timeline.py): every consumer stamps
its visits in order, and the summary's phases add up to the visit period."""

from __future__ import annotations

import pytest

from flashkit.bench.timeline import PHASES, run_timeline
from flashkit.registry import discover_kernels

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("variant,head_dim", [("fa3", 64), ("fa3", 128), ("fa3_fp8", 128)])
def test_phases_add_up_to_the_period(variant, head_dim):
    from flashkit.runtime.device import device_info
    spec = discover_kernels().get(variant)
    cc = device_info().cc
    if not spec.runs_on(cc):
        pytest.skip(f"{variant} needs compute capability {spec.arch_requirement()}; this device has {cc[0]}.{cc[1]}")
    s = run_timeline(variant, head_dim, 2048, heads=4)
    assert s.visits >= 4 and s.period > 0 and len(s.phases) >= 2   # two or three consumer warpgroups
    for ph in s.phases:
        assert all(ph[k] >= 0 for k in PHASES)
        # one visit's phases and the rest between visits are the period (medians of each: within a quarter)
        assert abs(sum(ph[k] for k in PHASES) + ph["rest"] - s.period) <= s.period / 4
