"""registry/manifest.py: parsing a variant's YAML header, and rejecting every bad field by file and name."""

from __future__ import annotations

import pytest

from flashkit.errors import FlashkitError, ManifestError
from flashkit.registry import discover_kernels
from flashkit.registry.discover import BUILTIN_DIR
from flashkit.registry.manifest import FEATURES, REQUIRED, HeadDims, parse_manifest
from ..synth import manifest, spec_of, write_cu

BUILTIN_FILES = sorted(BUILTIN_DIR.glob("*.cu"))


def reject(tmp_path, data) -> str:
    """Parse a manifest expected to be refused; return the one-line message, which names the file."""
    path = write_cu(tmp_path, "bad.cu", data)
    with pytest.raises(ManifestError) as info:
        parse_manifest(path)
    msg = str(info.value)
    assert isinstance(info.value, FlashkitError)
    assert str(path) in msg, msg
    assert "\n" not in msg, msg
    return msg


def test_base_manifest_parses(tmp_path):
    spec = spec_of(tmp_path, "toy")
    assert spec.name == "toy"
    assert spec.summary == "a test variant"
    assert spec.path == tmp_path / "toy.cu"
    assert spec.entries == ("flashkit_toy_fwd",)
    assert spec.grids == ("q_blocks",)
    assert spec.arch_min == (8, 0)
    assert spec.targets == {}
    assert spec.dtypes == ("float16", "bfloat16")
    assert spec.head_dims == HeadDims(values=(64, 128, 256))
    declared = {"causal": True, "block_sparse": False, "fp8": False, "backward": False, "lse": True, "gqa": True}
    assert spec.features == {**dict.fromkeys(spec.features, False), **declared}   # later features default off
    assert spec.requires == {}
    assert spec.priority == 10
    assert spec.launch == {"block_m": 64, "block_n": 64, "warps": 4}
    assert spec.overrides == {}
    assert spec.workspace == "none"


def test_optional_fields_default(tmp_path):
    spec = spec_of(tmp_path, "toy", priority=None, features={"causal": True})
    assert spec.priority == 0
    assert spec.features == {f: f == "causal" for f in FEATURES}


def test_multi_entry_with_grid_list(tmp_path):
    spec = spec_of(tmp_path, "multi", entry=["flashkit_a", "flashkit_b"],
                   launch={"grid": ["score_tiles", "row_groups"], "block_m": 64, "block_n": 64, "warps": 4},
                   workspace="scores")
    assert spec.entries == ("flashkit_a", "flashkit_b")
    assert spec.grids == ("score_tiles", "row_groups")
    assert spec.workspace == "scores"


def test_single_grid_repeats_for_every_entry(tmp_path):
    spec = spec_of(tmp_path, "multi", entry=["flashkit_a", "flashkit_b", "flashkit_c"])
    assert spec.grids == ("q_blocks",) * 3


def test_head_dim_range(tmp_path):
    spec = spec_of(tmp_path, "toy", head_dims={"min": 8, "max": 256, "multiple_of": 8})
    hd = spec.head_dims
    assert 8 in hd and 96 in hd and 256 in hd
    assert 12 not in hd and 0 not in hd and 264 not in hd
    assert hd.describe() == "multiples of 8 from 8 to 256"
    assert hd.examples() == (8, 32, 64, 128, 256)
    assert HeadDims(values=(64, 128)).examples() == (64, 128)
    assert HeadDims(values=(64, 128)).describe() == "64, 128"


def test_yaml_float_compute_capability_is_accepted(tmp_path):
    # `min: 8.6` unquoted is a YAML float; it must mean 8.6, not fail.
    import yaml
    text = yaml.safe_dump(manifest(name="toy"), sort_keys=False)
    assert "min: '8.0'" in text, text
    path = write_cu(tmp_path, "toy.cu", text.replace("min: '8.0'", "min: 8.6"))
    assert parse_manifest(path).arch_min == (8, 6)


def test_targets_and_declared_archs(tmp_path):
    spec = spec_of(tmp_path, "toy", arch={"min": "8.0", "targets": {"9.0": "sm_90a"}})
    assert spec.targets == {(9, 0): "sm_90a"}
    assert spec.target((9, 0)) == "sm_90a"
    assert spec.target((8, 6)) == "sm_86"
    assert spec.declared_archs() == ["sm_80", "sm_90a"] and spec.declared_ccs() == [(8, 0), (9, 0)]
    assert spec_of(tmp_path, "a", arch={"min": "7.5"}).declared_archs() == ["sm_75", "sm_80", "sm_90"]
    assert spec_of(tmp_path, "b", arch={"min": "9.0"}).declared_archs() == ["sm_90"]
    assert spec_of(tmp_path, "c", arch={"min": "8.9"}).declared_archs() == ["sm_89", "sm_90"]
    assert spec_of(tmp_path, "d", arch={"min": "8.0", "targets": {"10.0": "sm_100a"}}).declared_archs() == \
        ["sm_100a", "sm_80", "sm_90"]


def test_overrides_order(tmp_path):
    spec = spec_of(tmp_path, "toy", overrides={
        "8.0": {"block_n": 32}, "8.6": {"block_n": 48}, "9.0": {"block_n": 128},
        "hd256": {"block_m": 32, "block_n": 16}, "9.0/hd256": {"block_n": 96},
        "hd256/causal": {"block_n": 80, "warps": 8}, "hd256/softcap": {"warps": 12},
        "hd256/causal/softcap": {"block_m": 48},
        "hd128/seqlen_q<=1024": {"warps": 6}, "hd128/seqlen_q<=512": {"warps": 2},
        "hd128/causal/seqlen_q<=256": {"block_m": 16}})
    base = {"block_m": 64, "block_n": 64, "warps": 4}
    assert spec.launch_config(None, 128) == base
    assert spec.launch_config(None, 256) == {"block_m": 32, "block_n": 16, "warps": 4}
    assert spec.launch_config((8, 0), 128)["block_n"] == 32
    assert spec.launch_config((8, 9), 128)["block_n"] == 48       # highest key <= cc with the same major
    assert spec.launch_config((8, 6), 256) == {"block_m": 32, "block_n": 16, "warps": 4}   # hd beats arch
    assert spec.launch_config((9, 0), 128)["block_n"] == 128
    assert spec.launch_config((9, 0), 256) == {"block_m": 32, "block_n": 96, "warps": 4}   # combined last
    assert spec.launch_config((9, 0), 256, causal=True) == {"block_m": 32, "block_n": 80, "warps": 8}   # causal after
    assert spec.launch_config((9, 0), 256, ("softcap",), causal=True)["warps"] == 12   # a modification after causal
    assert spec.launch_config((9, 0), 256, ("softcap",), causal=True)["block_m"] == 48  # then causal with it, last
    assert spec.launch_config((9, 0), 256, ("softcap",))["block_m"] == 32               # for causal calls only
    assert spec.launch_config((9, 0), 128, causal=True)["block_n"] == 128              # no hd128/causal key
    assert spec.launch_config((9, 0), 128, seqlen_q=1025)["warps"] == 4                # length keys: up to L rows,
    assert spec.launch_config((9, 0), 128, seqlen_q=1024)["warps"] == 6                # the tightest bound last
    assert spec.launch_config((9, 0), 128, seqlen_q=100)["warps"] == 2
    assert spec.launch_config((9, 0), 128, seqlen_q=100, causal=True)["block_m"] == 16
    assert spec.launch_config((9, 0), 128, seqlen_q=100)["block_m"] == 64             # the causal one for causal only
    assert spec.length_bounds(128) == (256, 512, 1024) and spec.length_bounds(256) == ()
    assert spec.launch_config((10, 0), 128) == base                  # another major: no arch key applies
    assert spec.launch_config((7, 5), 128) == base
    assert spec.launch == base                                       # the manifest itself is untouched


@pytest.mark.parametrize("field", REQUIRED)
def test_missing_required_field(tmp_path, field):
    msg = reject(tmp_path, manifest(**{field: None}))
    assert f"field '{field}' is missing" in msg


MALFORMED = [
    ("name", "Fa2"), ("name", "fa-2"), ("name", 123), ("name", ""),
    ("summary", 5), ("summary", ["a"]),
    ("entry", "1bad"), ("entry", "has space"), ("entry", []), ("entry", ["flashkit_ok", 3]), ("entry", 7),
    ("arch", "8.0"), ("arch", {}), ("arch", {"max": "9.0"}), ("arch", {"min": "eight"}), ("arch", {"min": 8}),
    ("arch", {"min": "8.0", "targets": {"nine": "sm_90a"}}),
    ("dtypes", []), ("dtypes", "float16"), ("dtypes", ["float64"]), ("dtypes", ["float16", "int8"]),
    ("head_dims", []), ("head_dims", [0]), ("head_dims", [-64]), ("head_dims", "64"), ("head_dims", [64.0]),
    ("head_dims", {"min": 8}), ("head_dims", {"max": 256}),
    ("features", ["causal"]), ("features", {"causal": "yes"}), ("features", {"warp_specialized": True}),
    ("features", {"causal": 1}),
    ("requires", {"causal": 1}), ("requires", {"nope": True}), ("requires", ["causal"]),
    ("launch", "q_blocks"), ("launch", {"block_m": 64, "warps": 4}), ("launch", {"grid": "tile_blocks", "warps": 4}),
    ("launch", {"grid": "q_blocks", "block_m": 64}), ("launch", {"grid": "q_blocks", "warps": 0}),
    ("launch", {"grid": "q_blocks", "warps": 4, "block_m": "64"}),
    ("launch", {"grid": ["q_blocks", "heads"], "warps": 4}),   # two grids for one entry
    ("launch", {"grid": "tiles", "warps": 4, "persistent": 2}),   # a switch: 0 or 1
    ("launch", {"grid": "tiles", "warps": 4, "persistent": True}), ("overrides", {"hd64": {"persistent": -1}}),
    ("launch", {"grid": "tiles", "warps": 4, "defer_pv_wait": 2}), ("overrides", {"hd128": {"defer_pv_wait": True}}),
    ("overrides", [1]), ("overrides", {"9.0": {"block_n": 0}}), ("overrides", {"9.0": 128}),
    ("overrides", {"hd256": {"block_m": "64"}}),
    ("workspace", "lots"), ("workspace", ["scores"]),
    ("head_dims", {"min": "x", "max": 256}), ("head_dims", {"min": 8, "max": 256, "multiple_of": 0}),
    ("head_dims", {"min": 256, "max": 8}), ("head_dims", {"min": 8, "max": 256, "step": 8}),
    ("arch", {"min": "8.0", "targets": ["sm_90a"]}), ("arch", {"min": "8.0", "targets": {"9.0": 90}}),
    ("dtypes", [{"a": 1}]),
    ("priority", "high"), ("priority", 1.5),
]


@pytest.mark.parametrize("field,value", MALFORMED, ids=[f"{f}={v!r}" for f, v in MALFORMED])
def test_malformed_field(tmp_path, field, value):
    msg = reject(tmp_path, manifest(**{field: value}))
    assert f"field '{field}" in msg, msg


def test_unknown_field_is_named(tmp_path):
    msg = reject(tmp_path, manifest(colour="red"))
    assert "unknown field(s) colour" in msg


def test_no_manifest(tmp_path):
    path = tmp_path / "plain.cu"
    path.write_text('extern "C" __global__ void f() {}\n')
    with pytest.raises(ManifestError, match="no manifest") as info:
        parse_manifest(path)
    assert str(path) in str(info.value)


def test_manifest_must_lead_the_file(tmp_path):
    path = tmp_path / "late.cu"
    path.write_text("// a comment first\n/*---\nname: late\n---*/\n")
    with pytest.raises(ManifestError, match="no manifest"):
        parse_manifest(path)


def test_invalid_yaml(tmp_path):
    msg = reject(tmp_path, "name: [unclosed\nsummary: x")
    assert "not valid YAML" in msg


def test_manifest_not_a_mapping(tmp_path):
    msg = reject(tmp_path, "- a\n- b")
    assert "must be a YAML mapping" in msg


def test_builtin_variants_exist():
    names = {p.stem for p in BUILTIN_FILES}
    assert "standard" in names, names


@pytest.mark.parametrize("path", BUILTIN_FILES, ids=[p.name for p in BUILTIN_FILES])
def test_builtin_manifest_parses(path):
    spec = parse_manifest(path)
    source = path.read_text()
    body = source[source.index("---*/"):]
    for entry in spec.entries:
        assert entry in body, f"{path.name}: entry {entry} is not defined in the source"
    assert body.count("FLASHKIT_EXPORT_SMEM_BYTES(") == 1, \
        f"{path.name}: must declare FLASHKIT_EXPORT_SMEM_BYTES exactly once (docs/kernel-contract.md)"
    assert "#include <" not in body, f"{path.name}: device code includes no toolkit header"
    assert spec.summary and "\n" not in spec.summary


def test_arch_max_bounds_the_range_and_reads_in_words(tmp_path):
    spec = spec_of(tmp_path, "hopper_only", arch={"min": "9.0", "max": "9.0", "targets": {"9.0": "sm_90a"}})
    assert spec.arch_max == (9, 0) and spec.runs_on((9, 0))
    assert not spec.runs_on((8, 9)) and not spec.runs_on((10, 0))
    assert spec.arch_requirement() == "9.0 exactly" and spec.declared_archs() == ["sm_90a"]
    ranged = spec_of(tmp_path, "ranged", arch={"min": "8.0", "max": "9.0"})
    assert ranged.arch_requirement() == "from 8.0 to 9.0" and not ranged.runs_on((12, 0))
    open_ended = spec_of(tmp_path, "open", arch={"min": "8.0"})
    assert open_ended.arch_max is None and open_ended.runs_on((12, 0)) and open_ended.arch_requirement() == ">= 8.0"


@pytest.mark.parametrize("arch,needle", [({"min": "9.0", "max": "8.0"}, "max >= min"),
                                          ({"min": "8.0", "maximum": "9.0"}, "keys among min, max, targets")])
def test_bad_arch_ranges_are_rejected(tmp_path, arch, needle):
    assert needle in reject(tmp_path, manifest(arch=arch))


def test_launch_switches_take_zero(tmp_path):
    spec = spec_of(tmp_path, launch={"grid": "tiles", "warps": 12, "persistent": 0, "defer_pv_wait": 0},
                   overrides={"hd128": {"defer_pv_wait": 1}}, head_dims=[64, 128])
    assert spec.launch_config((9, 0), 64)["defer_pv_wait"] == 0
    assert spec.launch_config((9, 0), 128)["defer_pv_wait"] == 1


@pytest.mark.parametrize("variant,head_dim,mods,causal,deferred", [
    ("fa3", 96, (), True, 0), ("fa3", 128, (), False, 1), ("fa3", 192, (), False, 1),
    ("fa3", 128, ("softcap", "alibi"), False, 1), ("fa3", 96, (), False, 0), ("fa3", 96, ("window",), False, 1),
    ("fa3", 64, (), False, 0), ("fa3", 64, ("softcap",), True, 1), ("fa3", 64, ("softcap",), False, 0), ("fa3", 256, (), False, 0),
    ("fa3", 128, ("varlen",), False, 0), ("fa3", 128, ("score_mod",), False, 1), ("fa3", 96, ("mask_mod",), False, 1),
    ("fa3", 64, ("score_mod",), False, 1), ("fa3", 64, ("alibi",), True, 1), ("fa3", 64, ("window",), False, 0),
    ("fa3_fp8", 64, (), False, 1), ("fa3_fp8", 256, (), False, 0), ("fa3_fp8", 256, (), True, 0),
    ("block_sparse_hopper", 128, (), False, 1), ("block_sparse_hopper", 64, (), False, 1),
    ("block_sparse_hopper", 64, ("softcap",), True, 1), ("block_sparse_hopper", 256, (), False, 0)])
def test_hopper_manifests_defer_the_pv_wait_where_measured(variant, head_dim, mods, causal, deferred):
    """The P V wait moves past the loop edge where it measured faster and ptxas does not spill (BENCHMARKS.md);
    not on fa3's three-consumer tiles (hd64, hd96 without causal), but on hd64's two-consumer modified tables."""
    spec = discover_kernels().get(variant)
    assert spec.launch_config((9, 0), head_dim, mods, causal).get("defer_pv_wait", 0) == deferred


@pytest.mark.parametrize("head_dim,causal,seqlen_q,tile,serial", [
    (256, False, 1024, (128, 128), 1), (256, False, 8192, (128, 128), 1), (256, True, 2048, (128, 64), 0),
    (256, True, 2049, (128, 128), 1), (128, False, 1024, (192, 128), 1), (128, True, 2048, (128, 128), 0),
    (128, True, 8192, (192, 128), 1), (64, False, 8192, (192, 128), 0), (64, True, 1024, (128, 128), 0),
    (64, True, 1025, (192, 128), 0)])
def test_fa3_fp8_waits_for_each_pv_on_its_wide_tables(head_dim, causal, seqlen_q, tile, serial):
    """fa3_fp8 runs hd128 on three consumers and hd256 on 128-key tiles with serial_pv (S and P never live together:
    with the overlap both spilled), persistent; causal calls of up to 2048 rows keep the two-consumer / 64-key tables,
    deferring the P V wait, as hd64's three consumers do but for causal calls of up to 1024 rows (BENCHMARKS.md)."""
    cfg = discover_kernels().get("fa3_fp8").launch_config((9, 0), head_dim, (), causal, seqlen_q)
    assert (cfg["block_m"], cfg["block_n"], cfg.get("serial_pv", 0), cfg["persistent"]) == (*tile, serial, 1)
    assert cfg["warps"] == 4 * (1 + tile[0] // 64) and cfg["defer_pv_wait"] == 1 - serial


def test_no_hopper_table_both_serializes_and_defers_the_pv_wait():
    """serial_pv waits for each P V in its own visit, so defer_pv_wait has nothing to move beside it (the kernel's
    static_assert): no table of a shipped variant asks for both, at any head dim, length key or modification."""
    clash, checked = [], 0
    for spec in discover_kernels().specs.values():
        for hd in spec.head_dims.classes or spec.head_dims.values:
            for causal in (False, True):
                for seqlen in (None,) + spec.length_bounds(hd) + tuple(b + 1 for b in spec.length_bounds(hd)):
                    for mods in ((),) + tuple((m,) for m in ("softcap", "alibi", "window", "score_mod", "mask_mod")):
                        cfg = spec.launch_config((9, 0), hd, mods, causal, seqlen)
                        checked += cfg.get("serial_pv", 0)
                        if cfg.get("serial_pv") and cfg.get("defer_pv_wait"):
                            clash.append((spec.name, hd, causal, seqlen, mods))
    assert checked and not clash


def test_serial_pv_beside_the_ping_pong_turns_is_refused_at_compile_time():
    """A serial visit issues in two turns and a passed-by one in one, so serial_pv beside the turns would take the
    consumers' barriers out of step: the kernel refuses the build (ws_mainloop.cuh's static_assert), and the
    refusal reaches the caller as one CompileError naming it. Compiled with NVRTC, no GPU."""
    import dataclasses
    from flashkit.errors import CompileError
    from flashkit.runtime.build import compile_variant, make_config
    fa3 = discover_kernels().get("fa3")
    bad = dataclasses.replace(fa3, overrides={**fa3.overrides, "hd128": {"free_issue": 0, "serial_pv": 1,
                                                                         "defer_pv_wait": 0}})
    config = make_config(bad, "bfloat16", 128, False, (9, 0))
    with pytest.raises(CompileError, match="serial_pv runs without ping-pong turns"):
        compile_variant(bad, config, "sm_90a")


@pytest.mark.parametrize("head_dim,mods", [(128, ()), (128, ("mask_mod",)), (128, ("window",)), (64, ()),
                                           (64, ("block_sparse",)), (256, ())])
def test_fa3_bwd_orders_causal_key_blocks_by_the_hosts_group_size(head_dim, mods):
    """Every fa3_bwd build reorders causal key blocks heaviest first in groups the host sizes per call
    (Params.bwd.order_pairs, runtime/bwd_order.py; 1 keeps the launch order)."""
    spec = discover_kernels().get("fa3_bwd")
    assert spec.launch_config((9, 0), head_dim, mods, True)["heaviest_first"] == 1
