"""The tiles other architectures take (verify/arch_tiles.py: sm_86 / sm_89's smaller FA2-family tiles at hd192 and
hd256, decode's two stages at hd128, fa2_bwd's single-buffered Q and dO), run on this GPU against the float64
reference with each variant's family checks (the quick matrix)."""

from __future__ import annotations

import pytest

from flashkit.registry import discover_kernels

pytestmark = pytest.mark.gpu

VARIANTS = ("fa2", "causal", "block_sparse", "fa1", "decode", "fa2_bwd")


@pytest.mark.parametrize("variant", VARIANTS)
def test_tiles_of_smaller_shared_memories_against_the_reference(variant):
    from flashkit.runtime.device import device_info
    from flashkit.verify.arch_tiles import arch_tile_checks, arch_tiles
    spec = discover_kernels().get(variant)
    cc = device_info().cc
    if not spec.runs_on(cc) or not arch_tiles(spec, cc):
        pytest.skip(f"{variant}: no other architecture's tiles to run on compute capability {cc[0]}.{cc[1]}")
    checks = arch_tile_checks(spec, list(spec.dtypes), list(spec.head_dims.examples()), spec.causal_options(), True)
    assert checks
    failed = []
    for i, check in enumerate(checks):
        res = check.run(i)
        if not res.passed:
            failed.append(f"{res.label}: err {res.max_error:.3g} > {res.bound:.3g}; {res.note}")
    assert not failed, f"{len(failed)} of {len(checks)}:\n" + "\n".join(failed)
