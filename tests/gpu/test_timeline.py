"""The timeline build of the Hopper kernels on a real device (flashkit/bench/timeline.py): every consumer stamps
its visits in order, and the summary's phases add up to the visit period."""

from __future__ import annotations

import pytest

from flashkit.bench.timeline import BWD_PHASES, PHASES, run_timeline
from flashkit.registry import discover_kernels

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("variant,head_dim", [("fa3", 64), ("fa3", 128), ("fa3_fp8", 128), ("fa3_bwd", 64),
                                              ("fa3_bwd", 128)])
def test_phases_add_up_to_the_period(variant, head_dim):
    from flashkit.runtime.device import device_info
    spec = discover_kernels().get(variant)
    cc = device_info().cc
    if not spec.runs_on(cc):
        pytest.skip(f"{variant} needs compute capability {spec.arch_requirement()}; this device has {cc[0]}.{cc[1]}")
    s = run_timeline(variant, head_dim, 2048, heads=4)
    assert s.visits >= 4 and s.period > 0 and len(s.phases) >= 2   # two or three consumer warpgroups
    names = BWD_PHASES if spec.features.get("backward") else PHASES
    for ph in s.phases:
        assert list(ph) == list(names) + ["rest"] and all(x >= 0 for x in ph.values())
        # one visit's phases and the rest between visits are the period (medians of each: within a quarter)
        assert abs(sum(ph.values()) - s.period) <= s.period / 4
