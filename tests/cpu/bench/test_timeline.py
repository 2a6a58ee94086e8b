"""flashkit.bench.timeline without a GPU: the timeline copy of a variant, its build, and the summary of stamps."""

from __future__ import annotations

import pytest

from flashkit.bench import timeline
from flashkit.errors import FlashkitError
from flashkit.registry import discover_kernels
from flashkit.registry.discover import parse_file


def test_the_copy_is_a_renamed_drop_in_with_the_flag(tmp_path):
    spec = discover_kernels().get("fa3_fp8")
    name = timeline.write_copy(spec, tmp_path)
    copy = parse_file(tmp_path / f"{name}.cu")
    assert name == "fa3_fp8_timeline" and copy.name == name
    assert copy.launch["timeline"] == 1
    assert {k: v for k, v in copy.launch.items() if k != "timeline"} == spec.launch
    assert copy.overrides == spec.overrides and copy.entries == spec.entries


@pytest.mark.parametrize("variant", ["fa3", "fa3_fp8", "block_sparse_hopper", "fa3_bwd"])
def test_every_hopper_variant_has_a_copy(tmp_path, variant):
    copy = parse_file(tmp_path / f"{timeline.write_copy(discover_kernels().get(variant), tmp_path)}.cu")
    assert copy.launch["timeline"] == 1 and copy.name == variant + timeline.SUFFIX


def test_a_variant_without_timeline_points_is_refused(tmp_path):
    with pytest.raises(FlashkitError, match="no timeline points"):
        timeline.write_copy(discover_kernels().get("fa2"), tmp_path)


def test_a_manifest_it_cannot_rewrite_is_refused():
    with pytest.raises(FlashkitError, match="to rewrite"):
        timeline.timeline_source("/*---\nname: other\n---*/\n", "fa3")


@pytest.mark.parametrize("variant", ["fa3", "fa3_bwd"])
def test_the_timeline_build_carries_its_stamps_and_the_plain_one_does_not(tmp_path, variant):
    """GPU-less NVRTC compile of hd128 with and without the flag (the symbol scripts/timeline.py reads)."""
    from flashkit.errors import DeviceError
    from flashkit.runtime.build import compile_variant, make_config
    spec = discover_kernels().get(variant)
    copy = parse_file(tmp_path / f"{timeline.write_copy(spec, tmp_path)}.cu")
    try:
        cubins = [compile_variant(s, make_config(s, "bfloat16", 128, False, (9, 0)), s.target((9, 0))).cubin
                  for s in (copy, spec)]
    except DeviceError as e:
        pytest.skip(str(e))
    assert timeline.SYMBOL.encode() + b"\0" in cubins[0]
    assert timeline.SYMBOL.encode() + b"\0" not in cubins[1]


def _stamps(period=1000, phases=(100, 50, 80, 20, 600), offset=0, visits=range(1, 20), consumers=2):
    """Two consumers with the given phase lengths (rest = period - their sum), the producer issuing K 700 early."""
    rows = [[[0] * timeline.POINTS for _ in range(timeline.VISITS)] for _ in range(timeline.ROLES)]
    for c in range(consumers):
        for v in visits:
            t = 10_000 + v * period + c * offset
            for p, d in enumerate((0,) + phases):
                t += d
                rows[c][v][p] = t
    for v in visits:
        rows[timeline.PRODUCER][v][timeline.K_ISSUED] = rows[0][v][1] - 700
    return rows


def test_summary_medians():
    s = timeline.summarize(_stamps(offset=300))
    assert s.period == 1000 and s.k_lead == 700
    assert len(s.phases) == 2
    for ph in s.phases:
        assert [ph[k] for k in timeline.PHASES] == [100, 50, 80, 20, 600] and ph["rest"] == 150
    assert s.visits == 18 - 4   # visits 1..18 have a successor; the first four left out
    text = s.render()
    assert "visit period 1000" in text and "consumer 1:" in text and "700 cycles" in text


def test_backward_summary():
    phases = (30, 200, 150, 40, 120, 60, 400)   # timeline.BWD_PHASES' intervals
    s = timeline.summarize(_stamps(period=1200, phases=phases, consumers=3), phases=timeline.BWD_PHASES)
    assert s.period == 1200 and len(s.phases) == 3
    assert [s.phases[2][k] for k in timeline.BWD_PHASES] == list(phases) and s.phases[2]["rest"] == 200
    assert "dS barrier" in s.render() and "settle" not in s.render()


def test_summary_refuses_empty_stamps():
    with pytest.raises(FlashkitError, match="no timeline stamps"):
        timeline.summarize(_stamps(visits=()))
    with pytest.raises(FlashkitError, match="too few"):
        timeline.summarize(_stamps(visits=(3,)))
