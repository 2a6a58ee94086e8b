"""verify/arch_tiles.py: which other architectures' tiles a variant has, and running a variant with them."""

from __future__ import annotations

from flashkit.registry import discover_kernels
from flashkit.registry.manifest import KernelSpec
from flashkit.runtime.build import make_config
from flashkit.verify.arch_tiles import arch_tiles, tiles_of


def test_the_tiles_of_smaller_shared_memories():
    """sm_86 / sm_89's 99 KB a block: the FA2 family's hd192 / hd256 tiles, decode's hd128-256 rings, fa2_bwd's hd64
    (64-query blocks), hd128, hd192 and hd256 (V in registers); sm_80's 163 KB: fa2_bwd's hd256 (Q and dO
    single-buffered)."""
    specs = discover_kernels().specs
    assert arch_tiles(specs["fa2_bwd"], (9, 0)) == [((8, 0), 256), ((8, 6), 64), ((8, 6), 128), ((8, 6), 192),
                                                    ((8, 6), 256)]
    assert arch_tiles(specs["fa2_bwd"], (8, 0)) == [((8, 6), 64), ((8, 6), 128), ((8, 6), 192), ((8, 6), 256),
                                                    ((9, 0), 256)]
    for name in ("fa2", "causal"):
        assert arch_tiles(specs[name], (9, 0)) == [((8, 6), 192), ((8, 6), 256)]
    for name, hd in (("block_sparse", 256), ("fa1", 256)):
        assert arch_tiles(specs[name], (9, 0)) == [((8, 6), hd)]
    assert arch_tiles(specs["decode"], (9, 0)) == [((8, 6), hd) for hd in (128, 160, 192, 256)]
    assert {name for name, spec in specs.items() if arch_tiles(spec, (9, 0))} == \
        {"fa2_bwd", "fa2", "causal", "block_sparse", "fa1", "decode"}


def test_no_checks_without_a_device(monkeypatch):
    import flashkit.verify.arch_tiles as module
    monkeypatch.setattr(module, "device_count", lambda: 0)
    assert module.arch_tile_checks(discover_kernels().get("fa2"), ["bfloat16"], [256], (False,), True) == []


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


def test_verify_runs_the_family_checks_with_each_architectures_tiles(monkeypatch):
    import flashkit.verify.arch_tiles as module
    from flashkit.runtime.device import DeviceInfo
    from flashkit.verify import checks_for
    monkeypatch.setattr(module, "device_count", lambda: 1)
    monkeypatch.setattr(module, "device_info", lambda *a: DeviceInfo(0, "Fake H100", (9, 0), 132, 232448, 0, 0))
    fa2 = discover_kernels().get("fa2")
    checks = module.arch_tile_checks(fa2, ["bfloat16"], [200, 256, 64], (False, True), False)
    assert checks and all(c.label.endswith("[sm_86's tiles]") and " d256" in c.label for c in checks)
    assert len(checks) == len(module.family_checks(fa2, ["bfloat16"], [256], (False, True), True))
    assert [c for c in checks_for(fa2, ["bfloat16"], [256], [False]) if c.label.endswith("tiles]")]
    assert module.arch_tile_checks(fa2, ["bfloat16"], [64], (False,), False) == []


def test_sm120_takes_sm86s_tables_whose_shared_memory_the_compile_tier_checks():
    """sm_120 (consumer Blackwell) has sm_86's 99 KB a block: every variant gives it the tables and head-dim bounds
    that the compile tier builds and checks for sm_86."""
    from flashkit.runtime.cubin import SMEM_PER_BLOCK_OPTIN
    assert SMEM_PER_BLOCK_OPTIN[(12, 0)] == SMEM_PER_BLOCK_OPTIN[(8, 6)]
    for spec in discover_kernels().specs.values():
        if not (spec.runs_on((8, 6)) and spec.runs_on((12, 0))):
            continue
        for hd in spec.head_dims.classes or spec.head_dims.examples():
            assert spec.launch_config((12, 0), hd) == spec.launch_config((8, 6), hd), (spec.name, hd)
            assert spec.head_dims.on_arch(hd, (12, 0)) == spec.head_dims.on_arch(hd, (8, 6)), (spec.name, hd)
        if arch_tiles(spec, (9, 0)) and any(a == (8, 6) for a, _ in arch_tiles(spec, (9, 0))):
            assert "sm_86" in spec.declared_archs(), spec.name
