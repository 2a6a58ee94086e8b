"""Head-dim classes (manifest head_dims.classes): parsing, the class of a head dim, overrides keyed by class, the
compiled specialization, and selection of the sm80 flash kernels for every head dim with no fallback to `standard`."""

from __future__ import annotations

import pytest

from flashkit.errors import ManifestError, UnsupportedError
from flashkit.registry import discover_kernels
from flashkit.registry.manifest import HeadDims, parse_manifest
from flashkit.registry.select import Request, select_kernel
from flashkit.runtime.build import make_config
from flashkit.verify.compile_matrix import spec_configs
from ..synth import manifest, spec_of, write_cu

CLASSES = [32, 64, 96, 128, 160, 192, 256]
RANGE = {"min": 8, "max": 256, "multiple_of": 8, "classes": CLASSES}
SM80_FLASH = ("fa2", "causal", "block_sparse")
EVERY_HEAD_DIM = tuple(range(8, 257, 8))


def test_classes_parse_and_map_each_head_dim_to_the_smallest_class_at_least_as_large(tmp_path):
    hd = spec_of(tmp_path, "toy", head_dims=RANGE).head_dims
    assert hd.classes == tuple(CLASSES)
    assert [hd.class_of(d) for d in (8, 32, 40, 64, 72, 80, 96, 104, 136, 160, 168, 192, 200, 248, 256)] == \
        [32, 32, 64, 64, 96, 96, 96, 128, 160, 160, 192, 192, 256, 256, 256]
    assert hd.describe() == "multiples of 8 from 8 to 256 (compiled as 32, 64, 96, 128, 160, 192, 256)"
    assert hd.padded_examples() == (8, 40, 72, 104, 136, 168, 200)
    assert hd.examples() == (8, 32, 40, 64, 72, 96, 104, 128, 136, 160, 168, 192, 200, 256)


def test_without_classes_a_head_dim_is_its_own_class():
    assert HeadDims(values=(64, 128)).class_of(64) == 64
    rng = HeadDims(low=8, high=256, multiple_of=8)
    assert rng.class_of(80) == 80 and rng.padded_examples() == ()


@pytest.mark.parametrize("classes", [[64, 32, 256], [32, 32, 256], [36, 256], [32, 64, 128], "32, 256", [0, 256]])
def test_bad_classes_are_refused(tmp_path, classes):
    path = write_cu(tmp_path, "bad.cu", manifest(head_dims={**RANGE, "classes": classes}))
    with pytest.raises(ManifestError, match="'classes' as increasing multiples of 8, the last >= max 256|head_dims"):
        parse_manifest(path)


def test_overrides_are_keyed_by_the_class(tmp_path):
    spec = spec_of(tmp_path, "toy", head_dims=RANGE,
                   overrides={"hd96": {"warps": 8}, "9.0": {"block_m": 64}, "9.0/hd192": {"block_n": 32},
                              "hd96/softcap": {"block_n": 128}})
    assert spec.launch_config(None, 80)["warps"] == 8 and spec.launch_config(None, 96)["warps"] == 8
    assert spec.launch_config(None, 104)["warps"] == 4
    assert spec.launch_config((9, 0), 176)["block_n"] == 32 and spec.launch_config((8, 0), 176)["block_n"] == 64
    assert spec.launch_config(None, 72, ("softcap",))["block_n"] == 128


def test_a_padded_head_dim_compiles_its_class_with_the_padded_define():
    fa2 = discover_kernels().get("fa2")
    cfg = make_config(fa2, "bfloat16", 80, False, (8, 0))
    exact = make_config(fa2, "bfloat16", 96, False, (8, 0))
    assert (cfg.head_dim, cfg.head_dim_padded, exact.head_dim, exact.head_dim_padded) == (96, True, 96, False)
    assert cfg.launch == exact.launch
    assert "-DFLASHKIT_HEAD_DIM=96" in cfg.defines() and "-DFLASHKIT_HEAD_DIM_PADDED=1" in cfg.defines()
    assert not any("PADDED" in d for d in exact.defines())
    assert "hd96 padded" in cfg.describe()
    # Calls of head dims 72, 80 and 88 share one specialization (one cubin, one loaded module).
    assert make_config(fa2, "bfloat16", 72, False, (8, 0)) == make_config(fa2, "bfloat16", 88, False, (8, 0)) == cfg


@pytest.mark.parametrize("name", SM80_FLASH)
def test_the_sm80_flash_kernels_take_every_multiple_of_8_up_to_256(name):
    spec = discover_kernels().get(name)
    for d in EVERY_HEAD_DIM:
        assert d in spec.head_dims
        c = spec.head_dims.class_of(d)
        assert c in spec.head_dims.classes and 0 <= c - d < 32 + 32 * (c == 256), (d, c)   # 200..224 pad to 256
        assert spec.launch_config((8, 0), d) == spec.launch_config((8, 0), c)
    assert 264 not in spec.head_dims and 12 not in spec.head_dims


def test_the_measured_tile_shapes_per_class():
    specs = discover_kernels().specs
    shape = lambda name, d, mods=(): tuple(specs[name].launch_config((9, 0), d, mods)[k]   # noqa: E731
                                           for k in ("block_m", "block_n", "warps"))
    assert shape("fa2", 24) == shape("causal", 32) == (128, 128, 4)
    assert shape("block_sparse", 32) == (128, 64, 4)
    for name in SM80_FLASH:
        assert shape(name, 80) == shape(name, 96) == shape(name, 128) == (128, 128, 8)
        assert shape(name, 136) == shape(name, 256) == (128, 64, 8)
    assert shape("fa2", 168) == shape("causal", 192) == (128, 128, 8)
    assert shape("fa2", 168, ("softcap",)) == shape("causal", 192, ("alibi", "window")) == (128, 64, 8)
    assert shape("block_sparse", 192) == (128, 64, 8)


def test_fa3_tiles_follow_the_mask_and_length():
    """fa3 at hd96: 192 x 112 tiles on three consumers, 128 x 128 on two (persistent) with a window, ALiBi or a
    functor (three consumers spill there); causal calls of up to 2048 query rows at hd96 and 1024 at hd64 on 128 x 128
    persistent, and non-causal hd64 calls of up to 1024 (the short calls' tables; hd64 causal with three stages); the
    three-consumer tiles persistent up to 4096 rows (hd96 causal up to 8192); functors persistent at hd96, mask_mods
    at hd128; dense hd128 issuing without the ping-pong turns, its modified builds with them."""
    fa3 = discover_kernels().get("fa3")
    shape = lambda hd, mods=(), causal=False, sq=None: tuple(   # noqa: E731
        fa3.launch_config((9, 0), hd, mods, causal, sq)[k] for k in ("block_m", "block_n", "warps", "persistent"))
    assert shape(96) == shape(96, ("softcap",)) == shape(96, ("varlen",), True, 8193) == (192, 112, 16, 0)
    assert shape(96, causal=True) == shape(96, causal=True, sq=8193) == shape(96, sq=4097) == (192, 112, 16, 0)
    assert shape(96, causal=True, sq=2049) == shape(96, causal=True, sq=8192) == shape(96, ("varlen",), sq=4096) == \
        shape(96, sq=1) == (192, 112, 16, 1)
    assert shape(96, causal=True, sq=2048) == shape(96, ("window",)) == shape(96, ("alibi",)) == (128, 128, 12, 1)
    assert shape(96, ("score_mod",)) == shape(96, ("mask_mod",), True) == (128, 128, 12, 1)
    assert shape(96, ("mask_mod", "window")) == (128, 128, 12, 0)
    assert shape(64, causal=True) == shape(64, causal=True, sq=4097) == shape(64, sq=4097) == (192, 128, 16, 0)
    assert shape(64, causal=True, sq=1025) == shape(64, sq=4096) == shape(64, sq=1025) == (192, 128, 16, 1)
    assert shape(64, causal=True, sq=1) == shape(64, ("softcap",), True, 1024) == shape(64, sq=1024) == \
        shape(64, sq=1) == (128, 128, 12, 1)
    assert shape(64, ("softcap",), True, 2048) == (128, 128, 12, 1) and shape(64, ("softcap",), True) == (128, 128, 12, 0)
    assert shape(64, ("softcap",)) == (192, 128, 16, 0) and shape(64, ("softcap",), sq=2048) == (192, 128, 16, 1)
    assert shape(64, ("varlen",), True, 1024) == (128, 128, 12, 1)
    assert shape(64, ("varlen",), True, 2048) == shape(64, ("varlen",), False, 4096) == (192, 128, 16, 1)
    assert fa3.launch_config((9, 0), 64, (), True, 1024)["stages"] == 3
    assert fa3.launch_config((9, 0), 64, (), True, 2048)["stages"] == 2
    assert fa3.launch_config((9, 0), 64, (), False, 1024)["stages"] == 2
    assert shape(128, ("mask_mod",)) == shape(128, ("mask_mod",), True) == shape(128, causal=True) == (128, 128, 12, 1)
    assert shape(128, ("score_mod",)) == (128, 128, 12, 0)
    assert shape(192, ("score_mod",))[3] == shape(192, ("mask_mod",))[3] == 0 and shape(192)[3] == 1
    assert fa3.length_bounds(64) == (1024, 4096) and fa3.length_bounds(96) == (2048, 4096, 8192)
    assert fa3.length_bounds(128) == ()
    free = lambda mods=(), causal=False: fa3.launch_config((9, 0), 128, mods, causal, 8192)["free_issue"]  # noqa: E731
    assert free() == free((), True) == 1
    assert not any(free((m,), c) for m in ("window", "softcap", "alibi", "varlen", "score_mod", "mask_mod")
                   for c in (False, True) if (m, c) != ("softcap", True))
    assert free(("softcap",), True) == 1


def test_max_by_arch_bounds_the_head_dims_an_architecture_takes(tmp_path):
    """head_dims.max_by_arch: an architecture whose SMs hold less shared memory takes fewer head dims; a key holds for
    the later minor versions of its major (as the overrides' arch keys), and selection names the bound."""
    spec = spec_of(tmp_path, "toy", head_dims={**RANGE, "max_by_arch": {"8.6": 128}})
    hd = spec.head_dims
    assert hd.max_on((8, 0)) is None and hd.max_on((9, 0)) is None and hd.max_on(None) is None
    assert hd.max_on((8, 6)) == hd.max_on((8, 9)) == 128
    assert hd.on_arch(128, (8, 9)) and not hd.on_arch(136, (8, 9)) and hd.on_arch(256, (8, 0))
    assert hd.describe().endswith("(compiled as 32, 64, 96, 128, 160, 192, 256); up to 128 on sm_86")
    base = dict(dtype="bfloat16", seqlen_q=512, heads=8)
    with pytest.raises(UnsupportedError, match=r"toy: head_dim=192 not supported on sm_89: up to 128 there"):
        select_kernel(Request(head_dim=192, cc=(8, 9), **base), {"toy": spec})
    assert select_kernel(Request(head_dim=192, cc=(8, 0), **base), {"toy": spec}).chosen is spec
    assert select_kernel(Request(head_dim=128, cc=(8, 9), **base), {"toy": spec}).chosen is spec
    assert {c.head_dim for c in spec_configs(spec, (8, 6))} == {32, 64, 96, 128}   # compiled classes
    assert max(c.head_dim for c in spec_configs(spec, (8, 0))) == 256


@pytest.mark.parametrize("limits", [{"8.6": 512}, {"8.6": 0}, {"8.6": "128"}, {"sm_86": 128}, [128]])
def test_bad_max_by_arch_is_refused(tmp_path, limits):
    path = write_cu(tmp_path, "bad.cu", manifest(head_dims={**RANGE, "max_by_arch": limits}))
    with pytest.raises(ManifestError, match="max_by_arch|compute capability"):
        parse_manifest(path)


def test_fa2_bwd_head_dims_by_architecture():
    """fa2_bwd: every multiple of 8 to 256 on every architecture; on sm_86 / sm_89's 99 KB hd128 runs 64-key blocks,
    hd192 32-key blocks, and hd256 32-key blocks with V's fragments held in registers, Q and dO single-buffered."""
    spec = discover_kernels().get("fa2_bwd")
    assert spec.head_dims.classes == (64, 128, 192, 256) and not spec.head_dims.max_by_arch
    assert all(spec.head_dims.on_arch(d, cc) for d in EVERY_HEAD_DIM for cc in ((8, 0), (8, 9), (9, 0), (12, 0)))
    assert "sm_86" in spec.declared_archs()   # the compile tier holds its 99 KB configurations to the limit
    config = lambda cc, hd: spec.launch_config(cc, hd)   # noqa: E731
    # sm_86 / sm_89 / sm_120's hd192: 32-key blocks, Q and dO single-buffered
    assert all((config(cc, 192)["block_n"], config(cc, 192)["q_stages"]) == (32, 1) for cc in ((8, 6), (12, 0)))
    assert all(config(cc, 256) == {"block_m": 64, "block_n": 32, "warps": 8, "q_stages": 1, "v_in_regs": 1}
               for cc in ((8, 6), (8, 9), (12, 0)))
    assert (config((9, 0), 256)["block_n"], config((9, 0), 256).get("q_stages", 2)) == (64, 2)
    # hd192: 64-key blocks, double-buffered on sm_80 too (its 163 KB hold them)
    assert [(config(cc, 192)["block_n"], config(cc, 192).get("q_stages", 2)) for cc in ((8, 0), (9, 0))] == [(64, 2)] * 2
    assert (config((8, 0), 256)["block_n"], config((8, 0), 256)["q_stages"]) == (64, 1)
    assert (config((8, 0), 128)["block_n"], config((8, 0), 128).get("q_stages", 2)) == (128, 2)
    assert (config((8, 9), 128)["block_n"], config((8, 9), 128)["q_stages"]) == (64, 1)
    assert (config((8, 6), 64)["block_n"], config((8, 6), 64).get("q_stages", 2)) == (128, 2)
