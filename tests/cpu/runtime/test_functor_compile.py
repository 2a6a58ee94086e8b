"""Every shipped drop-in functor compiles into every fast kernel for its arch through NVRTC (no GPU): fa2 and
causal on sm_80 and sm_90, fa3 on sm_90a, and into fa3_bwd and fa2_bwd (hd 64 / 128 / 256: mask_mod ones over the
visit lists, the score_mod one with its derivative, alone and over a block mask's lists); the score_mod one into
block_sparse and block_sparse_hopper; no spill (but fa2_bwd's named
loop scalars), no stack frame, no serialized wgmma; the mask_mod builds carry the tile classifier's entries, the
backward's the list compactions too. A functor that does not compile is one CompileError naming its file and line."""

from __future__ import annotations

import pytest

from flashkit.errors import CompileError
from flashkit.features.functors import build_key, functor_compile_error
from flashkit.registry import discover_kernels
from flashkit.runtime.build import compile_variant, make_config
from flashkit.verify.compile_matrix import compile_matrix, functor_jobs

JOBS = 2
# fa2_bwd's functor builds at hd128 / hd256 spill the walk's loop scalars as its dense ones do (compile matrix's
# KNOWN_SPILLS): a score_mod's 16-60 B, a mask_mod's 12-92 B beside the visit lists and its word of keep bits (at most
# eight reloads a visit of 1,300-1,600 instructions, no store in the walk; on sm_90 fa3_bwd serves functor calls,
# fa2_bwd only when forced). hd64's up to 40 B: the relative-bias score_mod's sm_90 builds under NVRTC 13.5 on the
# 128-query blocks (two 64-query chunks a visit, dQ in two parts: sm80/bwd_traits.cuh's kQueryChunks, kDqParts).
FA2_BWD_FUNCTOR_SPILLS = {"hd64": 40, "hd128": 96, "hd256": 64}
# block_sparse_hopper's hd256 causal score_mod build: 24 B stored (44 B with the loads) under NVRTC 13.0 and 13.5. Each
# consumer holds O's 64 x 256 fp32 (128 registers) beside S and P at 240 registers; the causal diagonal's element mask
# beside the functor's clamped indices tips it over (fa3's own hd256 causal relative_bias build: 8 B). Free issue, the
# deferred P V wait and 128-key tiles do not relieve it (128-key tiles do not fit shared memory at hd256).
HOPPER_FWD_FUNCTOR_SPILLS = {("block_sparse_hopper", "hd256", "causal"): 48}


@pytest.fixture(scope="module")
def rows():
    # hd128 everywhere; hd64 and hd96 on fa3, whose functor builds there have tile tables of their own (short
    # causal calls persistent on two consumers).
    jobs = (functor_jobs(ccs=((8, 0), (9, 0)), head_dims=(128,), variants=["fa2", "causal", "fa3", "fa3_bwd"])
            + functor_jobs(variants=["fa3"], ccs=((9, 0),), head_dims=(64, 96))
            + functor_jobs(variants=["fa3_bwd"], ccs=((9, 0),), head_dims=(64, 256))
            + functor_jobs(variants=["fa2_bwd"], ccs=((8, 0), (9, 0)), head_dims=(64, 128, 256))
            + functor_jobs(variants=["block_sparse", "block_sparse_hopper"], ccs=((8, 0), (9, 0)),
                           head_dims=(64, 128, 256)))
    return compile_matrix(jobs, JOBS)


def test_every_shipped_functor_builds_into_every_fast_kernel(rows):
    built = {(r["variant"], r["target"], r["config"].split("functor=")[1].split()[0]) for r in rows}
    for mod in ("document", "prefix_lm", "relative_bias"):
        for variant, target in (("fa2", "sm_80"), ("fa2", "sm_90"), ("causal", "sm_80"), ("causal", "sm_90"),
                                ("fa3", "sm_90a")):
            assert (variant, target, mod) in built, (variant, target, mod)
    for mod in ("document", "prefix_lm", "relative_bias"):   # relative_bias's score_mod, a bias
        assert ("fa3_bwd", "sm_90a", mod) in built
    # fa2_bwd takes them all: score_mod ones with their derivative, mask_mod ones over its visit lists
    assert {m for v, _, m in built if v == "fa2_bwd"} == {"document", "prefix_lm", "relative_bias"}
    assert {t for v, t, _ in built if v == "fa2_bwd"} == {"sm_80", "sm_90"}
    # the block-sparse forwards take score_mods (under their block mask), not mask_mods; so do the backwards' block
    # mask builds
    assert {(v, t, m) for v, t, m in built if v.startswith("block_sparse")} == {
        ("block_sparse", "sm_80", "relative_bias"), ("block_sparse", "sm_90", "relative_bias"),
        ("block_sparse_hopper", "sm_90a", "relative_bias")}
    sparse = {(r["variant"], r["config"].split("functor=")[1].split()[0]) for r in rows
              if "block_sparse" in r["config"].split()}
    assert {("fa3_bwd", "relative_bias"), ("fa2_bwd", "relative_bias")} <= sparse


def test_no_compile_error_spill_or_serialized_wgmma(rows):
    def allowed(r):
        words = r["config"].split()
        if r["variant"] != "fa2_bwd":
            return max([b for (v, *named), b in HOPPER_FWD_FUNCTOR_SPILLS.items()
                        if v == r["variant"] and set(named) <= set(words)], default=0)
        return next(b for hd, b in FA2_BWD_FUNCTOR_SPILLS.items() if hd in words)
    bad = [(r["variant"], r["target"], r["config"], (r["error"] or "")[:400], r["spill_bytes"], r["stack_bytes"],
            r["serialized_wgmma"]) for r in rows
           if r["error"] or r["spill_bytes"] > allowed(r) or r["stack_bytes"] > allowed(r) or r["serialized_wgmma"]]
    assert not bad, bad


def test_mask_mod_builds_carry_the_classifier(rows):
    for r in rows:
        entries = {e["entry"] for e in r["entries"]}
        has_mask = "mask_mod" in r["config"].split()
        assert ({"flashkit_functor_classify", "flashkit_functor_compact"} <= entries) == has_mask, r["config"]
        lists = {"flashkit_bwd_list_columns", "flashkit_bwd_list_ranks"}
        listed = has_mask or "block_sparse" in r["config"].split()   # a score_mod alone: none
        assert (lists <= entries) == (r["variant"] in ("fa3_bwd", "fa2_bwd") and listed), r["config"]


def test_a_functor_that_does_not_compile_names_its_file_and_line(tmp_path, monkeypatch):
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "broken.cu").write_text(
        "/*---\nname: broken\nkind: modification\nsummary: s\nfunctions: [score_mod]\n---*/\n"
        "__device__ float score_mod(float s, int b, int h, int i, int j,\n"
        "                           const flashkit::ModArgs& a) {\n"
        "    return s + undefined_name;\n}\n")
    monkeypatch.setenv("FLASHKIT_KERNEL_PATH", str(tmp_path))
    try:
        cat = discover_kernels(refresh=True)
        mod, fa2 = cat.get_mod("broken"), cat.specs["fa2"]
        config = make_config(fa2, "float16", 64, False, (8, 0), mods=mod.functions, functor=build_key(mod))
        with pytest.raises(CompileError) as info:
            compile_variant(fa2, config, "sm_80")
        first = str(functor_compile_error(mod, str(info.value))).splitlines()[0]
        assert first == (f"mod 'broken' does not compile: {mod.path}:9: error: identifier \"undefined_name\" "
                         "is undefined"), first
    finally:
        monkeypatch.delenv("FLASHKIT_KERNEL_PATH")
        discover_kernels(refresh=True)
