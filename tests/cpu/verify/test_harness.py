"""verify/harness.py without a GPU: each family registers its checks, and a variant goes to its family."""

from __future__ import annotations

import flashkit.verify  # noqa: F401  (registers the dense, fp8 and block-sparse families)
from flashkit.registry import discover_kernels
from flashkit.verify import harness


def test_every_family_registers_with_the_harness():
    assert {"dense", "fp8", "block_sparse", "backward"} <= set(harness._FAMILIES)


def test_each_variant_goes_to_the_family_its_manifest_requires():
    specs = discover_kernels().specs
    assert harness.family_of(specs["fa2"]) == harness.DENSE
    assert harness.family_of(specs["fp8"]) == harness.family_of(specs["fa3_fp8"]) == "fp8"
    assert harness.family_of(specs["block_sparse"]) == "block_sparse"
    assert harness.family_of(specs["fa2_bwd"]) == "backward"   # gradients, not forward outputs


def test_backward_variants_are_checked_through_their_gradients():
    specs = discover_kernels().specs
    from flashkit.verify.backward import MASKS, QUICK_VARLEN_CASES, VARLEN_CASES
    from flashkit.verify.mods import mod_checks
    checks = harness.checks_for(specs["fa2_bwd"], ["bfloat16"], [64], [False, True], quick=True)
    modified = mod_checks(specs["fa2_bwd"], ["bfloat16"], [64], [False, True], quick=True)   # the mods extension
    assert modified and all(c.label.endswith(" backward") for c in modified)
    narrow_v = [c for c in checks if "/v" in c.label]   # the head_dim_v extension: pairs of q / k's class 64
    assert narrow_v and all(c.label.endswith(" backward") and " d40/v8 " in c.label for c in narrow_v)
    # block masks of every pattern and the shipped functors, on the quick masked shapes, causal and not
    modified_labels = {c.label for c in modified}   # with modification cases under block masks (mods.BLOCK_CASES)
    assert any(" block:" in label for label in modified_labels)
    masked = [c for c in checks if (" block:" in c.label or " mod:" in c.label) and c.label not in modified_labels]
    assert {c.label.split(" bfloat16 ")[1].split(" backward")[0].removeprefix("causal ") for c in masked} == set(MASKS)
    assert len(masked) == 2 * 2 * len({c.label.split(" bfloat16 ")[1].removeprefix("causal ") for c in masked})
    assert len(checks) == 2 * (len(harness.QUICK_SHAPES) + len(QUICK_VARLEN_CASES)) + len(modified) + len(masked) + \
        len(narrow_v)
    assert all(c.variant == "fa2_bwd" and c.label.endswith(" backward") for c in checks)
    varlen = [c.label for c in checks if c.label.startswith("varlen ")]   # the forward's varlen matrix stays out
    assert len(varlen) == 2 * len(QUICK_VARLEN_CASES)
    full = harness.checks_for(specs["fa2_bwd"], ["float16"], [128], [True], quick=False)
    assert sum(c.label.startswith("varlen ") for c in full) == len(VARLEN_CASES)


def test_checks_for_builds_the_family_checks_without_running_them():
    from flashkit.verify import mods as verify_mods
    specs = discover_kernels().specs
    every = harness.checks_for(specs["fa2"], ["float16"], [64], [False], quick=True)
    dense = [c for c in every if not any(c.label.endswith(" " + m.name) for m in verify_mods.CASES)
             and not c.label.startswith("varlen ")]
    assert len(dense) == len(harness.QUICK_SHAPES) and all(c.variant == "fa2" for c in every)
    assert len(every) > len(dense)   # fa2 declares the modifications: their extension adds checks
    sparse = harness.checks_for(specs["block_sparse"], ["float16"], [64], [False], quick=True)
    assert sparse and all(any(p in c.label for p in ("random", "sliding", "butterfly")) for c in sparse)
    fp8 = harness.checks_for(specs["fp8"], None, [64], [False], quick=True)
    assert fp8 and all("fp8" in c.label for c in fp8)
