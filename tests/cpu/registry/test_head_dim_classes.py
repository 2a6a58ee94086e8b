"""Head-dim classes (manifest head_dims.classes): parsing, the class of a head dim, overrides keyed by class, the
compiled specialization, and selection of the sm80 flash kernels for every head dim with no fallback to `standard`."""

from __future__ import annotations

import pytest

from flashkit.errors import ManifestError
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


def test_fa3_hd96_tiles_follow_the_mask():
    """fa3 at hd96: 192 x 112 tiles on three consumers without causal (the wider tile measured 6% faster at 8k),
    128 x 128 on two (persistent) with causal, a window or a functor (three consumers spill there)."""
    fa3 = discover_kernels().get("fa3")
    shape = lambda mods=(), causal=False: tuple(fa3.launch_config((9, 0), 96, mods, causal)[k]   # noqa: E731
                                                for k in ("block_m", "block_n", "warps", "persistent"))
    assert shape() == shape(("softcap",)) == shape(("alibi", "varlen")) == (192, 112, 16, 0)
    assert shape(causal=True) == shape(("window",)) == shape(("softcap",), True) == (128, 128, 12, 1)
    assert shape(("score_mod",)) == shape(("mask_mod", "window")) == shape(("score_mod",), True) == (128, 128, 12, 0)


@pytest.mark.parametrize("name", SM80_FLASH)
def test_the_compile_matrix_holds_every_class_and_a_padded_member_of_each(name):
    spec = discover_kernels().get(name)
    configs = spec_configs(spec, (8, 0))
    exact = {(c.head_dim, c.dtype) for c in configs if not c.head_dim_padded}
    padded = {(c.head_dim, c.dtype) for c in configs if c.head_dim_padded}
    assert exact == {(c, t) for c in spec.head_dims.classes for t in spec.dtypes}
    assert padded == {(c, spec.dtypes[0]) for c in spec.head_dims.classes}
    named = spec_configs(spec, (8, 0), dtypes=["bfloat16"], head_dims=[80])   # asked for: compiled as asked
    assert {(c.head_dim, c.dtype, c.head_dim_padded) for c in named} == {(96, "bfloat16", True)}


@pytest.mark.parametrize("cc", [(8, 0), (8, 6), (9, 0)])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_no_head_dim_falls_back_to_standard(cc, dtype):
    specs = discover_kernels().specs
    for d in EVERY_HEAD_DIM:
        for causal in (False, True):
            for lse in (False, True):
                sel = select_kernel(Request(dtype=dtype, head_dim=d, causal=causal, lse=lse, cc=cc, seqlen_q=4096,
                                            seqlen_k=4096, heads=16, kv_heads=4), specs)
                assert sel.chosen.name != "standard" and sel.warning is None, sel.report()
        sparse = select_kernel(Request(dtype=dtype, head_dim=d, block_sparse=True, cc=cc), specs)
        assert sparse.chosen.name.startswith("block_sparse"), sparse.report()


def test_float32_and_forced_standard_run_without_a_warning():
    specs = discover_kernels().specs
    sel = select_kernel(Request(dtype="float32", head_dim=80, cc=(9, 0)), specs)
    assert sel.chosen.name == "standard" and sel.warning is None
    sel = select_kernel(Request(dtype="bfloat16", head_dim=80, cc=(9, 0)), specs, variant="standard")
    assert sel.chosen.name == "standard" and sel.warning is None


def test_a_fallback_warns_with_the_reasons_of_the_faster_kernels(tmp_path):
    fast = spec_of(tmp_path, "fast", priority=50)                       # head dims 64, 128, 256
    slow = spec_of(tmp_path, "slow", priority=0, arch={"min": "7.5"}, head_dims={"min": 8, "max": 256, "multiple_of": 8})
    bwd = spec_of(tmp_path, "bwd", priority=50, head_dims=RANGE, features={"backward": True},
                  requires={"backward": True})                           # another kind of call: not listed
    specs = {"fast": fast, "slow": slow, "bwd": bwd}
    sel = select_kernel(Request(dtype="float16", head_dim=80, cc=(8, 0)), specs)
    assert sel.chosen is slow
    assert sel.warning.startswith("dtype=float16 head_dim=80 ") and "baseline kernel 'slow'" in sel.warning
    assert "fast: head_dim=80 not supported: supported 64, 128, 256" in sel.warning
    assert "bwd" not in sel.warning
    assert sel.report().splitlines()[2] == f"  warning: {sel.warning}"
    assert select_kernel(Request(dtype="float16", head_dim=64, cc=(8, 0)), specs).warning is None
    old = select_kernel(Request(dtype="float16", head_dim=64, cc=(7, 5)), specs)
    assert old.chosen is slow and old.warning.endswith("the faster kernels need compute capability >= 8.0")
