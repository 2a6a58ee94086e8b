"""runtime/build.py: defines, configs, cache keys over the headers, the on-disk cubin cache (no GPU)."""

from __future__ import annotations

import shutil

import pytest

import flashkit.runtime.build as build
from flashkit.registry import discover_kernels
from flashkit.runtime.build import BuildConfig, make_config
from ..synth import spec_of


@pytest.fixture
def include_copy(tmp_path, monkeypatch):
    """A private copy of the shared headers, installed as build.INCLUDE_DIR."""
    copy = tmp_path / "include"
    shutil.copytree(build.INCLUDE_DIR, copy)
    monkeypatch.setattr(build, "INCLUDE_DIR", copy)
    return copy


@pytest.fixture
def standard():
    return discover_kernels().get("standard")


def config(**kw) -> BuildConfig:
    base = dict(dtype="float16", head_dim=64, causal=False, launch=(("block_m", 64), ("block_n", 32), ("warps", 4)))
    base.update(kw)
    return BuildConfig(**base)


def test_defines():
    assert config().defines() == [
        "-DFLASHKIT_DTYPE=1", "-DFLASHKIT_OUT_DTYPE=1", "-DFLASHKIT_HEAD_DIM=64", "-DFLASHKIT_CAUSAL=0",
        "-DFLASHKIT_BLOCK_SPARSE=0", "-DFLASHKIT_BLOCK_M=64", "-DFLASHKIT_BLOCK_N=32", "-DFLASHKIT_WARPS=4"]
    flags = config(dtype="float8_e4m3", out_dtype="bfloat16", head_dim=128, causal=True, block_sparse=True).defines()
    assert flags[:5] == ["-DFLASHKIT_DTYPE=4", "-DFLASHKIT_OUT_DTYPE=2", "-DFLASHKIT_HEAD_DIM=128",
                         "-DFLASHKIT_CAUSAL=1", "-DFLASHKIT_BLOCK_SPARSE=1"]
    assert config(dtype="bfloat16").defines()[:2] == ["-DFLASHKIT_DTYPE=2", "-DFLASHKIT_OUT_DTYPE=2"]
    assert config(dtype="float32").defines()[:2] == ["-DFLASHKIT_DTYPE=3", "-DFLASHKIT_OUT_DTYPE=3"]


def test_dtype_codes_match_params_cuh():
    text = (build.INCLUDE_DIR / "flashkit" / "params.cuh").read_text()
    from flashkit.call.dtypes import BY_NAME
    for name, dt in BY_NAME.items():
        assert f"#define FLASHKIT_{name.upper()} {dt.code}" in text, name


def test_make_config_applies_overrides(tmp_path):
    spec = spec_of(tmp_path, "toy", overrides={"9.0": {"block_n": 128}, "hd256": {"block_m": 32}})
    cfg = make_config(spec, "bfloat16", 256, True, (9, 0))
    assert cfg == BuildConfig("bfloat16", 256, True, (("block_m", 32), ("block_n", 128), ("warps", 4)))
    assert cfg.launch_dict == {"block_m": 32, "block_n": 128, "warps": 4}
    assert make_config(spec, "float16", 64, False, (8, 0)).launch_dict == {"block_m": 64, "block_n": 64, "warps": 4}
    assert "-DFLASHKIT_BLOCK_N=128" in cfg.defines()


def test_describe():
    assert config(causal=True).describe() == "float16 hd64 causal block_m=64 block_n=32 warps=4"


def test_describe_tells_out_dtypes_apart():
    a = config(dtype="float8_e4m3", out_dtype="bfloat16").describe()
    b = config(dtype="float8_e4m3", out_dtype="float16").describe()
    assert a != b


def test_compile_options(standard):
    opts = build.compile_options(standard, config(), "sm_90a")
    assert opts[:3] == ["-arch=sm_90a", "-std=c++17", "--ptxas-options=-v"]
    assert f"-I{build.INCLUDE_DIR}" in opts and f"-I{standard.path.parent}" in opts
    assert opts[-len(config().defines()):] == config().defines()


def test_header_digest_changes_when_a_header_changes(include_copy, standard):
    before = build.header_digest()
    key_before = build.cache_key(standard, config(), "sm_80")
    assert build.header_digest() == before                                # deterministic
    header = include_copy / "flashkit" / "softmax.cuh"
    header.write_text(header.read_text() + "\n// an edit\n")
    after = build.header_digest()
    assert after != before
    assert f"// flashkit headers sha256 {after}" in build.kernel_source(standard)
    assert build.cache_key(standard, config(), "sm_80") != key_before


@pytest.mark.parametrize("variant, header", [("hopper", "hopper/wgmma.cuh"), ("fa2", "sm80/mma.cuh"),
                                             ("fa2", "sm80/fwd_mainloop.cuh")])
def test_cache_key_covers_headers_in_family_subfolders(include_copy, variant, header):
    """A header in a family folder (include/flashkit/sm80/, hopper/) is in the digest and the cache key."""
    spec = discover_kernels().get(variant)
    path = include_copy / "flashkit" / header
    assert path.parent != include_copy / "flashkit" and path.exists()
    digest, key = build.header_digest(), build.cache_key(spec, config(), "sm_90a")
    path.write_text(path.read_text() + "\n// an edit\n")
    assert build.header_digest() != digest
    assert build.cache_key(spec, config(), "sm_90a") != key


def test_header_digest_sees_a_same_size_same_mtime_edit(include_copy):
    """Content, not only the stamp, decides: one byte flipped with the mtime restored."""
    import os
    header = include_copy / "flashkit" / "params.cuh"
    before = build.header_digest()
    st = header.stat()
    data = bytearray(header.read_bytes())
    data[-2] = ord("#") if data[-2] != ord("#") else ord("/")
    header.write_bytes(bytes(data))
    os.utime(header, ns=(st.st_atime_ns, st.st_mtime_ns))
    build._header_digest.cache_clear()            # a cold process
    assert build.header_digest() != before


def test_header_digest_changes_when_a_header_is_added(include_copy):
    before = build.header_digest()
    (include_copy / "flashkit" / "new_thing.cuh").write_text("#pragma once\n")
    assert build.header_digest() != before


def test_header_digest_ignores_other_files(include_copy):
    before = build.header_digest()
    (include_copy / "flashkit" / "notes.txt").write_text("not a header")
    assert build.header_digest() == before


def test_cache_key_covers_config_target_and_source(tmp_path, standard):
    key = build.cache_key(standard, config(), "sm_80")
    assert key == build.cache_key(standard, config(), "sm_80")
    assert len(key) == 32
    others = {build.cache_key(standard, config(causal=True), "sm_80"),
              build.cache_key(standard, config(head_dim=128), "sm_80"),
              build.cache_key(standard, config(dtype="bfloat16"), "sm_80"),
              build.cache_key(standard, config(launch=(("block_m", 128), ("block_n", 32), ("warps", 4))), "sm_80"),
              build.cache_key(standard, config(), "sm_90"),
              build.cache_key(standard, config(), "sm_90a")}
    assert key not in others and len(others) == 6
    spec = spec_of(tmp_path, "toy")
    k1 = build.cache_key(spec, config(), "sm_80")
    spec.path.write_text(spec.path.read_text() + "\n// edited\n")
    assert build.cache_key(spec, config(), "sm_80") != k1


def test_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("FLASHKIT_CACHE_DIR", str(tmp_path / "fk"))
    assert build.cache_dir() == tmp_path / "fk"
    monkeypatch.delenv("FLASHKIT_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert build.cache_dir() == tmp_path / "xdg" / "flashkit"


def test_cubin_cache_on_disk(monkeypatch, tmp_path, include_copy, standard):
    """ensure_cubin compiles once, serves the file after, and misses again when a header changes."""
    monkeypatch.setenv("FLASHKIT_CACHE_DIR", str(tmp_path / "cache"))
    cfg = make_config(standard, "float16", 64, False, (8, 0))
    compiles = []
    real = build.compile_variant

    def counting(*args):
        compiles.append(args)
        return real(*args)
    monkeypatch.setattr(build, "compile_variant", counting)
    path = build.ensure_cubin(standard, cfg, "sm_80")
    assert path == build.cubin_path(standard, cfg, "sm_80")
    assert path.parent == tmp_path / "cache" and path.name.startswith("standard-") and path.suffix == ".cubin"
    assert path.read_bytes()[:4] == b"\x7fELF"
    assert [p.name for p in path.parent.iterdir()] == [path.name]          # no temporary file left
    assert len(compiles) == 1
    assert build.ensure_cubin(standard, cfg, "sm_80") == path
    assert len(compiles) == 1                                              # served from disk
    header = include_copy / "flashkit" / "mask.cuh"
    header.write_text(header.read_text() + "\n// an edit\n")
    new_path = build.ensure_cubin(standard, cfg, "sm_80")
    assert new_path != path and new_path.exists() and len(compiles) == 2


def test_an_entry_launches_with_its_own_shared_memory_where_it_exports_it():
    loaded = build.LoadedKernel(["prepass", "main"], 200 * 1024, entry_smem=(18 * 1024, 200 * 1024))
    assert [loaded.smem_of(i) for i in range(2)] == [18 * 1024, 200 * 1024]
    assert build.LoadedKernel(["main"], 4096).smem_of(0) == 4096   # none exported: the module's


def test_the_fp8_pre_pass_exports_its_shared_memory():
    """The V^T pre-pass beside a main kernel of up to 227 KB: its own symbol, found in the cubin's names (the
    runtime looks there before asking the driver, whose miss compute-sanitizer counts as an error)."""
    from flashkit.errors import DeviceError
    from flashkit.verify.compile_matrix import plan_compiles
    jobs, _ = plan_compiles(["fa3_fp8"], [(9, 0)])
    spec, config, target = jobs[0]
    try:
        cubin = build.compile_variant(spec, config, target).cubin
    except DeviceError as e:
        pytest.skip(str(e))
    pre, main = spec.entries
    assert f"{build.SMEM_SYMBOL}_{pre}".encode() + b"\0" in cubin
    assert f"{build.SMEM_SYMBOL}_{main}".encode() + b"\0" not in cubin
