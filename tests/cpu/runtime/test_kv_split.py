"""runtime/kv_split.py: the split count follows the SM count and the shape; the workspace and grids follow it."""

from __future__ import annotations

from flashkit.call.validate import Problem
from flashkit.registry import discover_kernels
from flashkit.runtime.kv_split import ctas_per_sm, fill_ctas, plan, smem_bytes, split_count
from flashkit.runtime.launch import grid_for, workspace_bytes

CFG = {"block_m": 16, "block_n": 16, "warps": 4, "stages": 3}


def test_smem_matches_the_traits_and_two_ctas_fit_an_h100_sm():
    assert smem_bytes(CFG, 128) == 16 * 256 + 4 * 3 * 2 * 16 * 256
    assert ctas_per_sm(CFG, 128) == 2


def test_a_full_grid_is_not_split():
    assert plan(64, 32, 4, 1, 8192, 128, CFG, sms=132).splits == 1
    assert plan(128, 32, 8, 1, 2048, 128, CFG, sms=132).splits == 1


def test_a_grid_on_half_the_sms_is_not_split():
    """64 CTAs, one an SM, read at the copy rate (8 x 32k keys, 32/8 heads: 103% of it on the H100)."""
    p = plan(8, 32, 8, 1, 32768, 128, CFG, sms=132)
    assert p.splits == 1 and p.ctas == 64


def test_a_small_grid_is_split_to_half_the_sms_in_one_wave():
    one = plan(1, 32, 8, 1, 131072, 128, CFG, sms=132)
    assert one.splits == 8 and one.ctas == 64   # 1 x 128k on the H100: 98% of the copy rate (32 splits: 91%)
    assert plan(1, 32, 8, 1, 131072, 128, CFG, sms=66).splits == 4   # fewer SMs, fewer splits
    mqa = plan(1, 8, 1, 1, 131072, 128, CFG, sms=132)
    assert mqa.splits == 60 and mqa.ctas <= 132   # never a second CTA on an SM
    assert split_count(3, 10 ** 6, 132, 4) == 20 and split_count(60, 10 ** 6, 132, 4) == 1


H100_BPS, H200_BPS = 3.35e12, 4.8e12   # peak HBM bandwidth, 132 SMs each


def test_the_fill_follows_the_bandwidth():
    """The H100's fill (60 CTAs) where the bandwidth is unknown or the H100's; the H200 draws its 4.8 TB/s with 86."""
    assert fill_ctas(132) == fill_ctas(132, H100_BPS) == 60
    assert fill_ctas(66) == 30 and fill_ctas(132, H200_BPS) == 86
    assert fill_ctas(16, H200_BPS) == 16   # never past one CTA an SM
    h200 = plan(8, 32, 8, 1, 32768, 128, CFG, sms=132, bandwidth=H200_BPS)
    assert h200.splits == 2 and h200.ctas == 128   # 0.92x -> 0.98x cuDNN on the H200
    assert plan(1, 32, 8, 1, 131072, 128, CFG, sms=132, bandwidth=H200_BPS).splits == 11
    assert plan(8, 32, 8, 1, 32768, 128, CFG, sms=132, bandwidth=H100_BPS).splits == 1


def test_peak_bandwidth_from_the_driver_attributes():
    from flashkit.runtime.device import peak_memory_bandwidth

    class Runtime:
        cudaDevAttrMemoryClockRate, cudaDevAttrGlobalMemoryBusWidth = 36, 37

        def deviceGetAttribute(self, attr, index):
            return {36: 2619000, 37: 5120}[attr]   # an H100 SXM: 2.619 GHz HBM3, 5120 bits

    assert abs(peak_memory_bandwidth(Runtime(), 0) - 3.352e12) < 1e9

    class Silent(Runtime):
        def deviceGetAttribute(self, attr, index):
            raise RuntimeError("not supported")

    assert peak_memory_bandwidth(Silent(), 0) == 0.0


def test_short_caches_are_not_split_below_the_minimum_chunk():
    assert plan(1, 32, 8, 1, 100, 128, CFG, sms=132).splits == 1
    assert split_count(4, 32, 132, 4) == 2   # 32 tiles: two chunks of 4 tiles a warp


def test_gqa_packing_counts_row_blocks():
    assert plan(2, 32, 4, 4, 1000, 128, CFG, sms=132).row_blocks == 2     # 4 rows x 8 heads = 32 packed rows
    assert plan(2, 8, 8, 1, 1000, 128, CFG, sms=132).row_blocks == 1


def test_grids_and_workspace_follow_the_plan():
    p = Problem(8, 1, 32768, 32, 8, 128, "bfloat16", 0.1)
    cfg = {**CFG, "splits": 4, "row_blocks": 1}
    assert grid_for("kv_splits", p, cfg) == (4, 8, 8)
    assert grid_for("split_combine", p, cfg) == (8 * 32 // 4, 1, 1)
    assert workspace_bytes("split_partials", p, cfg) == 4 * 8 * 32 * 129 * 4
    one = {**cfg, "splits": 1}
    assert grid_for("split_combine", p, one)[0] == 0 and workspace_bytes("split_partials", p, one) == 0


def test_the_decode_manifest_and_its_selection_bounds():
    from flashkit.registry import Request, select_kernel
    spec = discover_kernels(refresh=True).get("decode")
    assert spec.grids == ("kv_splits", "split_combine") and spec.workspace == "split_partials"
    assert spec.limits == {"seqlen_q": 16, "packed_rows": 64} and spec.supports("kv_cache")
    specs = discover_kernels().specs
    for cc in ((8, 0), (9, 0)):
        dec = Request(dtype="bfloat16", head_dim=128, seqlen_q=1, seqlen_k=8192, heads=32, kv_heads=4, batch=64, cc=cc)
        assert select_kernel(dec, specs).chosen.name == "decode"
        long_q = Request(dtype="bfloat16", head_dim=128, seqlen_q=17, seqlen_k=8192, heads=32, kv_heads=32, cc=cc)
        sel = select_kernel(long_q, specs)
        assert sel.chosen.name != "decode" and "seqlen_q=17 above 16" in sel.rejected["decode"][0]
        cache = Request(dtype="bfloat16", head_dim=128, seqlen_q=64, seqlen_k=8192, heads=32, kv_heads=4, kv_cache=True,
                        cc=cc)
        assert select_kernel(cache, specs).chosen.name == "decode"   # the only KV-cache kernel, at any seqlen_q


def test_explain_names_the_path_and_the_split_count():
    import flashkit
    sel = flashkit.explain(seqlen_q=1, seqlen_k=131072, heads=32, kv_heads=8, batch=1, cc=(9, 0))
    assert sel.chosen.name == "decode" and "split-KV decode" in sel.report() and "8 splits of the keys" in sel.report()
    sel = flashkit.explain(seqlen_q=1, seqlen_k=32768, heads=32, kv_heads=8, batch=8, cc=(9, 0))
    assert "1 split of the keys" in sel.report() and "no combine pass" in sel.report()


def test_tiles_grid_is_one_cta_a_tile_or_persistent():
    """`tiles`: q_blocks' tiles on x; with persistent: 1, at most one CTA an SM walks them."""
    p = Problem(batch=3, seqlen_q=300, seqlen_k=300, heads=4, kv_heads=2, head_dim=128, dtype="bfloat16",
                softmax_scale=0.1)
    tiles = 3 * 4 * 3   # ceil(300 / 128) query blocks, 4 heads, batch 3
    assert grid_for("tiles", p, {"block_m": 128, "persistent": 0}) == (tiles, 1, 1)
    assert grid_for("tiles", p, {"block_m": 128}) == (tiles, 1, 1)
    assert grid_for("tiles", p, {"block_m": 128, "persistent": 1, "sm_count": 132}) == (tiles, 1, 1)
    assert grid_for("tiles", p, {"block_m": 128, "persistent": 1, "sm_count": 8}) == (8, 1, 1)


def test_fa3_runs_persistent_where_its_loop_fits():
    """fa3's manifest: persistent at hd128/192 and on short causal calls at hd64/96; one tile a CTA on the
    three-consumer tiles of hd64 / hd96 and at hd256 (no registers to spare)."""
    fa3 = discover_kernels().get("fa3")
    assert fa3.grids == ("tiles",)
    hds = (64, 96, 128, 192, 256)
    assert [fa3.launch_config((9, 0), d).get("persistent") for d in hds] == [0, 0, 1, 1, 0]
    assert [fa3.launch_config((9, 0), d, causal=True).get("persistent") for d in hds] == [0, 0, 1, 1, 0]
    assert [fa3.launch_config((9, 0), d, causal=True, seqlen_q=2048).get("persistent") for d in hds] == [1, 1, 1, 1, 0]
