"""verify/arch_tiles.py: which other architectures' tiles a variant has, and running a variant with them."""

from __future__ import annotations

from flashkit.registry import discover_kernels
from flashkit.registry.manifest import KernelSpec
from flashkit.runtime.build import make_config
from flashkit.verify.arch_tiles import arch_tiles, tiles_of


def test_fa2_bwd_alone_has_tiles_of_its_own_for_smaller_shared_memories():
    specs = discover_kernels().specs
    assert arch_tiles(specs["fa2_bwd"], (9, 0)) == [((8, 0), 256), ((8, 6), 128)]
    assert arch_tiles(specs["fa2_bwd"], (8, 0)) == [((8, 6), 128), ((9, 0), 256)]
    assert {name for name, spec in specs.items() if arch_tiles(spec, (9, 0))} == {"fa2_bwd"}


def test_tiles_of_swaps_one_variants_tables_and_restores_them():
    specs = discover_kernels().specs
    fa2_bwd, fa2 = specs["fa2_bwd"], specs["fa2"]
    real = KernelSpec.launch_config
    on_h100 = make_config(fa2_bwd, "bfloat16", 128, False, (9, 0))
    with tiles_of("fa2_bwd", (8, 6)):
        assert make_config(fa2_bwd, "bfloat16", 128, False, (9, 0)).launch == \
            (("block_m", 64), ("block_n", 64), ("q_stages", 1), ("warps", 8))
        assert fa2.launch_config((9, 0), 128) == real(fa2, (9, 0), 128)   # the others keep the device's
    assert KernelSpec.launch_config is real
    assert make_config(fa2_bwd, "bfloat16", 128, False, (9, 0)) == on_h100
